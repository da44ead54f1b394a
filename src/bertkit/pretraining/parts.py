"""Preparing a corpus on several machines: in parts, merged into the shards one machine makes.

    bertkit prepare corpus/ --vocab vocab/ --part 0/4 --out parts/0     # on each of 4 machines
    bertkit prepare --merge parts/0 parts/1 parts/2 parts/3 --out shards/
    bertkit prepare corpus/ --vocab vocab/ --out shards/ --ray HEAD:6379  # the same, on Ray

Part i of N tokenises the i-th of N contiguous runs of the corpus's files (balanced by bytes;
the files in the order `prepare` reads them) into a shards folder of its own, whose meta.json
names the part, the whole corpus's file list and the vocabulary. The merge checks every part's
shard digests, that the parts are 0..N-1 of one corpus and one vocabulary, and streams their
documents in order into new shards: the documents are packed into shards one by one, by their
token counts alone, so the merged shards are those one process makes, byte for byte (and so are
their digests and counts; meta.json's time and workers differ).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertkit.pretraining.corpus import CorpusStats
from bertkit.pretraining.shards import (
    DEFAULT_SHARD_TOKENS,
    EncodedChunk,
    Shards,
    write_shards,
)


def parse_part(text: str) -> tuple[int, int]:
    """'2/4' -> (2, 4): part 2 of 4, counted from 0.

    >>> parse_part("0/3")
    (0, 3)
    """
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--part {text!r}: give it as I/N (0 <= I < N), e.g. 0/4") from None
    if not 0 <= index < count:
        raise ValueError(f"--part {text!r}: I must be 0 .. N-1")
    return index, count


def merge_parts(
    parts: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    overwrite: bool = False,
) -> dict[str, Any]:
    """The shards of `parts` (folders `prepare --part` wrote), checked and merged into
    `out_dir`; its metadata."""

    opened = [Shards(p) for p in parts]
    records = []
    for shards in opened:
        part = shards.meta.get("part")
        if not isinstance(part, dict):
            raise ValueError(f"{shards.directory}: not a part (prepared without --part)")
        shards.verify()  # every shard file against its SHA-256
        records.append(part)
    count = records[0]["of"]
    if any(r["of"] != count for r in records):
        raise ValueError(f"parts of {sorted({r['of'] for r in records})} parts: one run's only")
    found = sorted(r["index"] for r in records)
    if found != list(range(count)):
        missing = sorted(set(range(count)) - set(found))
        raise ValueError(f"parts {found} of {count}: " + (
            f"part {missing[0]} is missing" if missing else "a part is given twice"))  # fmt: skip
    if len({r["corpus"]["digest"] for r in records}) > 1:
        raise ValueError("the parts were prepared from different corpora (their file lists differ)")
    if len({s.meta["vocab_hash"] for s in opened}) > 1:
        raise ValueError("the parts were prepared with different vocabularies")
    ordered = sorted(zip(records, opened, strict=True), key=lambda pair: pair[0]["index"])
    stats = CorpusStats()
    for _, shards in ordered:
        skipped = shards.meta["skipped"]
        stats.empty_documents += skipped["empty_documents"]
        stats.bad_lines += skipped["bad_lines"]
        stats.problems += skipped["problems"][: 20 - len(stats.problems)]
    tokenizer = opened[0].tokenizer()
    extra = {
        "sources": [s for _, shards in ordered for s in shards.meta.get("sources", [])],
        "source_bytes": sum(shards.meta.get("source_bytes", 0) for _, shards in ordered),
        "workers": sum(shards.meta.get("workers", 1) for _, shards in ordered),
        "merged_from": [str(shards.directory) for _, shards in ordered],
    }
    return write_shards(_chunks(s for _, s in ordered), tokenizer, out_dir,
                        shard_tokens=shard_tokens, overwrite=overwrite, stats=stats,
                        extra=extra)  # fmt: skip


def _chunks(parts) -> Iterator[EncodedChunk]:
    """Each part's shards as encoded chunks, in order: their documents as they were written."""
    for shards in parts:
        for tokens, sentences, documents in zip(shards.tokens, shards.sentences,
                                                shards.documents, strict=True):  # fmt: skip
            yield EncodedChunk(np.asarray(tokens), np.diff(sentences), np.diff(documents), 0)


def prepare_on_ray(
    corpus: Sequence[str | os.PathLike],
    vocab: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    address: str = "auto",
    parts: int | None = None,
    overwrite: bool = False,
    **settings: Any,
) -> dict[str, Any]:
    """`prepare` on a Ray cluster: `parts` tasks (default: the cluster's CPUs, at most the
    corpus's files), each tokenising its part into OUT.parts/I with one CPU, then the merge
    here. Paths must be on a file system every node sees."""
    from bertkit.jobs.ray import connected
    from bertkit.pretraining.corpus import expand_paths

    out = Path(out_dir).resolve()
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out}: already exists (pass overwrite=True / --overwrite)")
    files = expand_paths(corpus)
    staging = out.with_name(out.name + ".parts")
    with connected(address) as ray:
        count = min(parts or int(ray.cluster_resources().get("CPU", 1)), len(files))
        task = ray.remote(num_cpus=1, max_retries=3)(_prepare_part)
        absolute = [str(Path(f).resolve()) for f in corpus]
        pending = [task.remote(absolute, str(Path(vocab).resolve()), str(staging / str(i)), i,
                               count, settings) for i in range(count)]  # fmt: skip
        folders = ray.get(pending)
    meta = merge_parts(folders, out, overwrite=overwrite,
                       shard_tokens=settings.get("shard_tokens", DEFAULT_SHARD_TOKENS))  # fmt: skip
    shutil.rmtree(staging, ignore_errors=True)
    return meta


def _prepare_part(corpus: list[str], vocab: str, out: str, index: int, count: int,
                  settings: dict[str, Any]) -> str:  # fmt: skip
    """One part, in a Ray task (a retried task writes its part again: `overwrite`)."""
    from bertkit.core.tokenizer import BertTokenizer
    from bertkit.pretraining.shards import prepare_shards

    tokenizer = BertTokenizer.from_pretrained(vocab)
    prepare_shards(corpus, tokenizer, out, workers=1, progress=False, overwrite=True,
                   part=(index, count), **settings)  # fmt: skip
    return out
