"""Tokenise a corpus in parallel into memory-mapped shards.

A shards directory holds `meta.json` and, per shard, three flat binary arrays:

- `shard-NNNNN.tokens`: every sentence's WordPiece ids back to back (`uint16` when the vocabulary
  fits, else `int32`);
- `shard-NNNNN.sentences`: `int64` start offset of each sentence in the tokens, plus the end;
- `shard-NNNNN.documents`: `int64` index of each document's first sentence, plus the end.

`meta.json` records the vocabulary hash (training refuses shards made with another vocabulary),
counts, sources and each file's SHA-256, which a pre-training run checks when it first opens
the shards (`Shards.verify`: a token id garbled inside the vocabulary's range would otherwise
train silently); a shard's name is a file name in its folder, never a path out of it. The main process only reads lines; worker processes split sentences and
tokenise, a bounded number of chunks in flight, so memory stays flat however large the corpus;
results are written in submission order, so the shards do not depend on the number of workers.
The directory is built under a temporary name and renamed into place when complete.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import multiprocessing
import os
import shutil
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertkit._device import usable_cpus
from bertkit._io import atomic_write_text, read_json, sha256_of
from bertkit.core.tokenizer import BertTokenizer, JsonTokenizer
from bertkit.pretraining.corpus import (
    CorpusStats,
    corpus_record,
    expand_paths,
    part_files,
    raw_documents,
    sentences_of,
)

FORMAT_VERSION = 1
META = "meta.json"
DEFAULT_SHARD_TOKENS = 1 << 27  # 128M tokens, 256 MB of uint16 per shard
KINDS = ("tokens", "sentences", "documents")  # a shard's files, NAME.KIND
CHUNK_CHARS = 1 << 20  # text per task sent to a worker

_WORKER_TOKENIZER: BertTokenizer | None = None


@dataclass
class EncodedChunk:
    tokens: np.ndarray  # (T,) ids of every kept sentence
    sentence_lengths: np.ndarray  # (N,) int64
    document_sentences: np.ndarray  # (D,) int64 sentences per kept document
    dropped_documents: int  # documents left with no token


def _init_worker(tokenizer: BertTokenizer) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the processes are the parallelism
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = tokenizer


def encode_documents(
    documents: list[tuple[list[str], bool]], tokenizer: BertTokenizer, dtype: np.dtype
) -> EncodedChunk:
    """Split and tokenise raw documents (no special tokens, no truncation); drop sentences that
    tokenise to nothing and documents left empty."""
    sentences: list[str] = []
    per_document: list[int] = []
    for units, needs_split in documents:
        found = sentences_of(units, needs_split)
        sentences.extend(found)
        per_document.append(len(found))
    ids = tokenizer.encode_words(sentences)  # as they read inside the document
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    tokens = np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype, count=int(lengths.sum()))
    # sentences and documents that tokenise to nothing (e.g. only control characters) go
    kept_sentences = lengths > 0
    owner = np.repeat(np.arange(len(per_document)), per_document)  # document of each sentence
    kept_per_document = np.bincount(owner[kept_sentences], minlength=len(per_document))
    return EncodedChunk(
        tokens,
        lengths[kept_sentences],
        kept_per_document[kept_per_document > 0],
        int((kept_per_document == 0).sum()),
    )


def _encode_in_worker(documents: list[tuple[list[str], bool]], dtype: str) -> EncodedChunk:
    assert _WORKER_TOKENIZER is not None
    return encode_documents(documents, _WORKER_TOKENIZER, np.dtype(dtype))


def _chunks(documents: Iterable[tuple[list[str], bool]]) -> Iterator[list[tuple[list[str], bool]]]:
    chunk: list[tuple[list[str], bool]] = []
    size = 0
    for document in documents:
        chunk.append(document)
        size += sum(len(u) for u in document[0])
        if size >= CHUNK_CHARS:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


class _ShardWriter:
    def __init__(self, directory: Path, dtype: np.dtype, shard_tokens: int) -> None:
        self.directory, self.dtype, self.shard_tokens = directory, dtype, shard_tokens
        self.shards: list[dict[str, Any]] = []
        self._open_next()

    def _open_next(self) -> None:
        name = f"shard-{len(self.shards):05d}"
        self.name = name
        self.files = {kind: open(self.directory / f"{name}.{kind}", "wb") for kind in KINDS}
        self.digests = {kind: hashlib.sha256() for kind in KINDS}  # of what is written
        self.num_tokens = self.num_sentences = self.num_documents = 0
        self._put("sentences", np.zeros(1, np.int64).tobytes())
        self._put("documents", np.zeros(1, np.int64).tobytes())

    def _put(self, kind: str, data: bytes) -> None:
        self.files[kind].write(data)
        self.digests[kind].update(data)

    def write(self, chunk: EncodedChunk) -> None:
        sentence_start = 0
        token_start = 0
        for count in chunk.document_sentences.tolist():
            lengths = chunk.sentence_lengths[sentence_start : sentence_start + count]
            size = int(lengths.sum())
            if self.num_tokens and self.num_tokens + size > self.shard_tokens:
                self._close()
                self._open_next()
            self._put("tokens", chunk.tokens[token_start : token_start + size].tobytes())
            ends = self.num_tokens + np.cumsum(lengths)
            self._put("sentences", ends.astype(np.int64).tobytes())
            self.num_tokens += size
            self.num_sentences += count
            self.num_documents += 1
            self._put("documents", np.int64(self.num_sentences).tobytes())
            sentence_start += count
            token_start += size

    def _close(self) -> None:
        for handle in self.files.values():
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
        self.shards.append(
            {
                "name": self.name,
                "tokens": self.num_tokens,
                "sentences": self.num_sentences,
                "documents": self.num_documents,
                "sha256": {kind: digest.hexdigest() for kind, digest in self.digests.items()},
            }
        )

    def finish(self) -> list[dict[str, Any]]:
        self._close()
        if len(self.shards) > 1 and self.shards[-1]["documents"] == 0:
            last = self.shards.pop()
            for kind in KINDS:
                (self.directory / f"{last['name']}.{kind}").unlink()
        return self.shards


def prepare_shards(
    corpus: Iterable[str | os.PathLike],
    tokenizer: BertTokenizer,
    out_dir: str | os.PathLike,
    *,
    workers: int | None = None,
    format: str = "auto",
    on_error: str = "fail",
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    overwrite: bool = False,
    progress: bool = True,
    text_column: str | None = None,
    part: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """Tokenise `corpus` (files or directories) into shards in `out_dir`; returns the metadata.
    `text_column`: the column (Parquet, datasets folders) or JSON key holding the text;
    `part` (I, N): only part I of N of the corpus's files, for `parts.merge_parts`."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir}: already exists (pass overwrite=True / --overwrite)")
    files = expand_paths(corpus)
    recorded: dict[str, Any] = {}
    if part is not None:
        recorded = {"part": {"index": part[0], "of": part[1], "corpus": corpus_record(files)}}
        files = part_files(files, *part)
    total_bytes = sum(f.stat().st_size for f in files)
    workers = max(1, workers if workers is not None else usable_cpus().count)
    dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.int32)
    stats = CorpusStats()
    chunks = _chunks(raw_documents(files, format=format, on_error=on_error, stats=stats,
                                   text_column=text_column))  # fmt: skip
    bar = _progress(total_bytes, progress)

    def encoded() -> Iterator[EncodedChunk]:
        for chunk in _encoded(chunks, tokenizer, dtype, workers):
            if bar is not None:  # progress by text consumed, ~4.5 bytes a token: cheap, close
                bar.update(min(int(len(chunk.tokens) * 4.5), max(0, total_bytes - bar.n)))
            yield chunk
        if bar is not None:
            bar.update(total_bytes - bar.n)
            bar.close()

    extra = {
        "sources": [str(f) for f in files],
        "source_bytes": total_bytes,
        "workers": workers,
        **recorded,
    }
    return write_shards(
        encoded(),
        tokenizer,
        out_dir,
        shard_tokens=shard_tokens,
        overwrite=True,
        stats=stats,
        extra=extra,
    )


def write_shards(
    chunks: Iterable[EncodedChunk],
    tokenizer: BertTokenizer,
    out_dir: str | os.PathLike,
    *,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    overwrite: bool = False,
    stats: CorpusStats | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write tokenised documents as a shards directory (built under a temporary name, renamed
    into place when complete); returns the metadata written to meta.json."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir}: already exists (pass overwrite=True / --overwrite)")
    stats = stats if stats is not None else CorpusStats()
    dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.int32)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    started = time.perf_counter()
    dropped = 0
    try:
        writer = _ShardWriter(tmp, dtype, shard_tokens)
        for chunk in chunks:
            writer.write(chunk)
            dropped += chunk.dropped_documents
        shards = writer.finish()
        num_documents = sum(s["documents"] for s in shards)
        if num_documents == 0:
            sources = (extra or {}).get("sources", [])
            raise ValueError(f"no documents with text in {sources}: the corpus is empty")
        meta = {
            "format": "bertkit-shards",
            "version": FORMAT_VERSION,
            "vocab_hash": tokenizer.vocab_hash,
            "vocab_size": tokenizer.vocab_size,
            "lowercase": tokenizer.lowercase,
            **_tokenizer_record(tokenizer),
            "dtype": dtype.name,
            "num_tokens": sum(s["tokens"] for s in shards),
            "num_sentences": sum(s["sentences"] for s in shards),
            "num_documents": num_documents,
            "shards": shards,
            "skipped": {
                "empty_documents": stats.empty_documents + dropped,
                "bad_lines": stats.bad_lines,
                "problems": stats.problems,
            },
            "seconds": round(time.perf_counter() - started, 3),
            **(extra or {}),
        }
        tokenizer.save_pretrained(tmp)  # the vocabulary travels with its ids
        atomic_write_text(tmp / META, json.dumps(meta, indent=2) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


def _tokenizer_record(tokenizer: BertTokenizer) -> dict[str, Any]:
    """How `Shards.tokenizer` opens the tokenizer saved beside the shards: a tokenizer.json
    (the BERT family's) with its settings; a vocab.txt needs nothing more."""
    if not isinstance(tokenizer, JsonTokenizer):
        return {}
    return {"tokenizer": {"class": "JsonTokenizer", "token_types": tokenizer.token_types,
                          "model_max_length": tokenizer.model_max_length}}  # fmt: skip


def chunk_from_token_documents(
    documents: Iterable[list[np.ndarray]], dtype=np.uint16
) -> EncodedChunk:
    """An `EncodedChunk` of documents given as lists of sentence token-id arrays."""
    sentences = [np.asarray(s) for doc in documents for s in doc if len(s)]
    per_document = [sum(1 for s in doc if len(s)) for doc in documents]
    return EncodedChunk(
        np.concatenate(sentences).astype(dtype) if sentences else np.zeros(0, dtype),
        np.asarray([len(s) for s in sentences], np.int64),
        np.asarray([n for n in per_document if n], np.int64),
        sum(1 for n in per_document if not n),
    )


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc="prepare", smoothing=0.1)


def _encoded(
    chunks, tokenizer: BertTokenizer, dtype: np.dtype, workers: int
) -> Iterator[EncodedChunk]:
    if workers == 1:
        for chunk in chunks:
            yield encode_documents(chunk, tokenizer, dtype)
        return
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        workers,
        mp_context=context,
        initializer=_init_worker,
        initargs=(tokenizer,),  # (pickled whole: its casing and accents as they are)
    ) as pool:
        pending: deque[Future] = deque()
        for chunk in chunks:
            pending.append(pool.submit(_encode_in_worker, chunk, dtype.name))
            if len(pending) >= 2 * workers:  # bounded: memory stays flat
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


# ------------------------------------------------------------------------------------ reading
def _field(where, mapping: dict, key: str, kind: type):
    if key not in mapping:
        raise ValueError(f"{where}: field {key!r} is missing")
    value = mapping[key]
    negative = isinstance(value, int) and value < 0
    if not isinstance(value, kind) or isinstance(value, bool) or (kind is int and negative):
        raise ValueError(f"{where}: field {key!r} is {value!r}, not a {kind.__name__}")
    return value


def _check_offsets(path: str, offsets: np.ndarray, end: int) -> None:
    """Offsets must start at 0, never go down and end at the count of what they index: garbled
    ones would cut sentences out of the wrong place (or ask for gigabytes) much later."""
    if len(offsets) == 0:
        return
    first, last = int(offsets[0]), int(offsets[-1])
    if first != 0 or last != end:
        raise ValueError(
            f"{path}: offsets run {first}..{last}, expected 0..{end}: the file is garbled"
        )
    steps = np.diff(offsets)
    if len(steps) and int(steps.min()) < 0:
        at = int(np.argmax(steps < 0))
        raise ValueError(f"{path}: offset {at + 1} goes back ({int(offsets[at])} -> "
                         f"{int(offsets[at + 1])}): the file is garbled")  # fmt: skip


class Shards:
    """Read-only, memory-mapped view of a shards directory.

    `tokens[s]`, `sentences[s]`, `documents[s]` are the arrays of shard `s`; documents are
    numbered globally in shard order by `document_span`.
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        meta_path = self.directory / META
        if not meta_path.exists():
            raise FileNotFoundError(
                f"{self.directory}: not a shards directory (no {META}; run bertkit prepare)"
            )
        self.meta = read_json(meta_path)
        if (
            not isinstance(self.meta, dict)
            or self.meta.get("format") != "bertkit-shards"
            or self.meta.get("version") != FORMAT_VERSION
        ):
            raise ValueError(f"{meta_path}: not bertkit shards of version {FORMAT_VERSION}")
        dtype = _field(meta_path, self.meta, "dtype", str)
        if dtype not in ("uint16", "uint32", "int32", "int64"):
            raise ValueError(f"{meta_path}: dtype {dtype!r} is not an integer type of token ids")
        dtype = np.dtype(dtype)
        self.tokens, self.sentences, self.documents = [], [], []
        for number, shard in enumerate(_field(meta_path, self.meta, "shards", list)):
            where = f"{meta_path} (shard {number})"
            if not isinstance(shard, dict):
                raise ValueError(f"{where}: not an object")
            name = _field(where, shard, "name", str)
            if name in ("", ".", "..") or Path(name).name != name or "\\" in name:
                raise ValueError(
                    f"{where}: shard name {name!r} is not a file name in {self.directory}"
                )
            sizes = {k: _field(where, shard, k, int) for k in ("tokens", "sentences", "documents")}
            base = self.directory / name
            tokens = self._map(f"{base}.tokens", dtype, sizes["tokens"])
            sentences = self._map(f"{base}.sentences", np.int64, sizes["sentences"] + 1)
            documents = self._map(f"{base}.documents", np.int64, sizes["documents"] + 1)
            _check_offsets(f"{base}.sentences", sentences, sizes["tokens"])
            _check_offsets(f"{base}.documents", documents, sizes["sentences"])
            self.tokens.append(tokens)
            self.sentences.append(sentences)
            self.documents.append(documents)
        counts = [s["documents"] for s in self.meta["shards"]]
        self.document_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def verify(self) -> int:
        """Check every shard file against the SHA-256 `prepare` recorded, naming the first that
        changed (ValueError); the files checked (0: shards prepared before digests, which
        cannot be checked)."""
        checked = 0
        for shard in self.meta["shards"]:
            digests = shard.get("sha256")
            if not isinstance(digests, dict):
                continue
            for kind in KINDS:
                path = self.directory / f"{shard['name']}.{kind}"
                if sha256_of(path) != digests.get(kind):
                    raise ValueError(
                        f"{path}: its content is not what bertkit prepare wrote (SHA-256 "
                        f"{str(digests.get(kind))[:12]}... in {self.directory / META}): the file "
                        "changed or was damaged; prepare the shards again"
                    )
                checked += 1
        return checked

    def __reduce__(self):  # pickled as its folder (a spawned data worker maps it again)
        return (Shards, (self.directory,))

    @staticmethod
    def _map(path: str, dtype, count: int) -> np.ndarray:
        expected = count * np.dtype(dtype).itemsize
        size = os.path.getsize(path) if os.path.exists(path) else -1
        if size != expected:
            raise ValueError(
                f"{path}: {size} bytes, expected {expected}: the shard is truncated or was not finished"
            )
        if count == 0:
            return np.zeros(0, dtype=dtype)
        return np.memmap(path, dtype=dtype, mode="r", shape=(count,))

    @property
    def num_documents(self) -> int:
        return int(self.document_offsets[-1])

    def token_counts(self, vocab_size: int) -> np.ndarray:
        """How often each id occurs in the shards: (vocab_size,) int64."""
        counts = np.zeros(vocab_size, np.int64)
        for tokens in self.tokens:
            for start in range(0, len(tokens), 1 << 24):  # a bounded slice in memory at a time
                chunk = np.asarray(tokens[start : start + (1 << 24)])
                counts += np.bincount(chunk, minlength=vocab_size)[:vocab_size]
        return counts

    def tokenizer(self) -> BertTokenizer:
        """The tokenizer whose ids the shards hold, saved beside them: a WordPiece vocab.txt
        or a family's tokenizer.json (with the settings meta.json records)."""
        record = self.meta.get("tokenizer")
        if isinstance(record, dict) and record.get("class") == "JsonTokenizer":
            return JsonTokenizer(
                self.directory,
                token_types=bool(record.get("token_types")),
                model_max_length=int(record.get("model_max_length", 512)),
            )
        return BertTokenizer.from_pretrained(self.directory)

    def check_vocab(self, tokenizer: BertTokenizer) -> None:
        """Refuse shards tokenised with another vocabulary (their ids would mean other words)."""
        if self.meta["vocab_hash"] != tokenizer.vocab_hash:
            raise ValueError(
                f"{self.directory} was prepared with another vocabulary (hash "
                f"{self.meta['vocab_hash'][:12]}, {self.meta['vocab_size']} tokens, lowercase="
                f"{self.meta['lowercase']}) than the tokenizer given (hash {tokenizer.vocab_hash[:12]}, "
                f"{tokenizer.vocab_size} tokens, lowercase={tokenizer.lowercase}); re-run "
                "bertkit prepare with this vocabulary"
            )

    def locate(self, document: int) -> tuple[int, int]:
        """(shard, document index within it) of a global document number."""
        shard = int(np.searchsorted(self.document_offsets, document, side="right") - 1)
        return shard, document - int(self.document_offsets[shard])

    def sentence_bounds(self, document: int) -> tuple[int, np.ndarray]:
        """(shard, token offsets of the document's sentences: start of each, then the end)."""
        shard, local = self.locate(document)
        first, last = self.documents[shard][local], self.documents[shard][local + 1]
        return shard, np.asarray(self.sentences[shard][first : last + 1])
