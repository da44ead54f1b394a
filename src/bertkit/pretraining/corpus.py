"""Stream documents (lists of sentences) from a text corpus, never holding it all in memory.

Formats (`format=`; "auto" picks by extension and first line):

- "google": Google's `create_pretraining_data.py` input: one sentence per line, a blank line
  between documents; lines are taken as sentences as they are.
- "wiki": WikiExtractor output, `<doc id=.. url=.. title=..>` ... `</doc>`, one paragraph per line
  (the first line repeats the title and is dropped).
- "text": plain text, a blank line between documents, each line a paragraph split into sentences.
- "text-file": plain text, one document per file, each line a paragraph.
- "jsonl": one JSON object per line with a "text" field (a document; its lines are paragraphs).
- "parquet": a Parquet file (FineWeb, Wikipedia's Hub copy), a row a document, its text column
  (`text_column`, else "text", else its only string column) read as a JSON line's "text".
- "arrow": a `datasets` folder (`save_to_disk`, or a cached split: `--dataset NAME[:CONFIG]`),
  read as Parquet is.
- "csv", "tsv": a table with a header line, a row a document, its text column (`text_column`,
  else "text").

The tables (JSON Lines, CSV, TSV, Parquet, datasets folders) are read by `bertkit.rows`, the
reader of every command's rows.

JSON Lines, CSV, TSV and text compressed with gzip, zstd (the `zstandard` package), bz2 or xz are
read as they stream (C4 and Dolma's `.json.gz`, the Pile's `.jsonl.zst`), known by their first
bytes; a file is a JSON Lines one by its name without the compression's suffix. The same documents
make the same shards, byte for byte, whichever of these formats holds them. A file that is not what
its name or `--format` says is refused with what it is and the flag to pass.

Paragraphs are split into sentences with `sentencex` (measured against pysbd, syntok and blingfire
on Wikipedia: 47 MB/s against 0.14, 0.7 and 8.7 MB/s, and right on abbreviations such as
"Mr. J. R. R. Tolkien" that blingfire splits).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertkit.errors import DataError
from bertkit.rows import (
    FileConfig,
    arrow_tables,
    compression_of,
    file_format,
    open_binary,
    read_rows,
)

logger = logging.getLogger("bertkit")

# formats read as tables, a row a document (`bertkit.rows`, the one reader of rows)
TABLES = ("jsonl", "csv", "tsv", "parquet", "arrow")
FORMATS = ("auto", "google", "wiki", "text", "text-file", *TABLES)
_DOC_OPEN = re.compile(r'^<doc\b[^>]*\btitle="([^"]*)"[^>]*>\s*$')


@dataclass
class CorpusStats:
    """What reading skipped, so a user can see it (and `on_error="fail"` can refuse it)."""

    files: int = 0
    documents: int = 0
    empty_documents: int = 0
    bad_lines: int = 0
    problems: list[str] = field(default_factory=list)

    def note(self, message: str) -> None:
        self.bad_lines += 1
        if len(self.problems) < 20:
            self.problems.append(message)
        logger.warning("%s (skipped)", message)


def split_sentences(paragraph: str, language: str = "en") -> list[str]:
    """Sentences of a paragraph, whitespace-trimmed, empty ones dropped.

    >>> split_sentences("Dr. Smith arrived at 3 p.m. on Monday. He left.")
    ['Dr. Smith arrived at 3 p.m. on Monday.', 'He left.']
    """
    from sentencex import segment

    return [s.strip() for s in segment(language, paragraph) if s.strip()]


def detect_corpus_format(path: Path) -> str:
    """The corpus format of a file: what `bertkit.rows.file_format` finds (a table by its first
    bytes or its name under a compression's suffix; a corpus's .json is JSON Lines, as C4's
    .json.gz is), else WikiExtractor output or plain text by its first line."""
    kind = file_format(path, default="")
    if kind == "json":
        return "jsonl"
    if kind in TABLES:
        return kind
    with open_binary(path) as handle:
        head = handle.read(4096)
    _check_text(path, head)
    first = next((line for line in head.splitlines() if line.strip()), b"")
    return "wiki" if first.lstrip().startswith(b"<doc ") else "text"


def _check_text(path: Path, head: bytes) -> None:
    """Refuse a file whose first 4 KB are not text: a compression or a columnar format bertkit
    does not know, named as such instead of 'not UTF-8 at byte offset 1'."""
    if not _looks_like_text(head):
        raise ValueError(
            f"{path}: not text (its first bytes are {head[:8]!r}): bertkit reads plain text, "
            "WikiExtractor output, JSON Lines (plain, or compressed with gzip, zstd, bz2 or "
            "xz), Parquet and datasets folders: pass --format, or give the file in one of those"
        )


def _looks_like_text(head: bytes) -> bool:
    """All but a twentieth of it UTF-8 and no control characters (NUL among them), or too short
    to tell: a text with a stray bad byte or control character still passes (the line reader
    then names its line, the tokenizer drops the characters).

    >>> _looks_like_text("plain text, ünïcode".encode()), _looks_like_text(bytes(range(256)))
    (True, False)
    """
    decoded = head.decode("utf-8", "replace")
    bad = decoded.count("\ufffd") + sum(c < " " and c not in "\t\n\r\f\v" for c in decoded)
    return len(decoded) < 64 or bad * 20 <= len(decoded)  # (a few bytes say too little)


def _lines(path: Path, stats: CorpusStats, on_error: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of a file (decompressed as it is read), undecodable lines reported
    with their byte offset (in the decompressed text, for a compressed file)."""
    offset = 0
    compressed = compression_of(path) is not None
    with open_binary(path) as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                yield number, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as err:
                where = "decompressed byte offset" if compressed else "byte offset"
                message = f"{path}:{number}: not UTF-8 at {where} {offset + err.start}"
                if on_error == "fail":
                    raise ValueError(
                        message + " (use --on-error skip to skip such lines)"
                    ) from None
                stats.note(message)
            offset += len(raw)


def read_documents(paths: Iterable[str | os.PathLike], **reading: Any) -> Iterator[list[str]]:
    """Yield each document as its list of sentences (empty documents are skipped and counted).
    `reading`: how `raw_documents` reads them (`format`, `on_error`, `stats`, `text_column`).

    `on_error="fail"` raises ValueError naming file, line and byte offset of the first undecodable
    or malformed line; "skip" skips such lines with a warning and counts them in `stats`.
    """
    for units, needs_split in raw_documents(paths, **reading):
        yield sentences_of(units, needs_split)


def sentences_of(units: list[str], needs_split: bool) -> list[str]:
    """Sentences of a raw document: its paragraphs split, or its lines as they are."""
    return [s for u in units for s in split_sentences(u)] if needs_split else units


def raw_documents(
    paths: Iterable[str | os.PathLike],
    *,
    format: str = "auto",
    on_error: str = "fail",
    stats: CorpusStats | None = None,
    text_column: str | None = None,
) -> Iterator[tuple[list[str], bool]]:
    """Documents as (paragraphs, whether they still need sentence splitting): the cheap reading
    part, so that splitting can run in worker processes (`bertkit.pretraining.shards`)."""
    if format not in FORMATS:
        raise ValueError(f"unknown corpus format {format!r}; expected one of {FORMATS}")
    if on_error not in ("fail", "skip"):
        raise ValueError(f"on_error must be 'fail' or 'skip', got {on_error!r}")
    stats = stats if stats is not None else CorpusStats()
    for path in expand_paths(paths):
        stats.files += 1
        kind = detect_corpus_format(path) if format == "auto" else format
        readers: dict[str, Callable[..., Iterator[list[str]]]] = {
            "google": _text,  # the same layout; its lines are not split into sentences
            "wiki": _wiki,
            "text": _text,
            "text-file": functools.partial(_text, one_document=True),
        }
        reader = readers.get(kind) or functools.partial(_table, kind=kind, text_column=text_column)
        for units in reader(path, stats, on_error):
            if units:
                stats.documents += 1
                yield units, kind != "google"
            else:
                stats.empty_documents += 1


def expand_paths(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """A corpus's files (`bertkit.rows.expand_paths`: paths, globs, folders' files, datasets
    folders), in order; none at all is an error."""
    from bertkit.rows import expand_paths as expand

    files = expand(paths, "corpus file")
    if not files:
        raise ValueError(f"no corpus files in {[str(p) for p in paths]}")
    return files


def _text(
    path: Path, stats: CorpusStats, on_error: str, one_document: bool = False
) -> Iterator[list[str]]:
    """Paragraph per line; a blank line ends a document (or, with `one_document`, nothing does)."""
    document: list[str] = []
    for _, line in _lines(path, stats, on_error):
        if line.strip():
            document.append(line.strip())
        elif document and not one_document:
            yield document
            document = []
    yield document


def _wiki(path: Path, stats: CorpusStats, on_error: str) -> Iterator[list[str]]:
    document: list[str] | None = None
    title = None
    for number, line in _lines(path, stats, on_error):
        stripped = line.strip()
        if document is None:
            opened = _DOC_OPEN.match(stripped)
            if opened:
                document, title = [], opened.group(1)
            elif stripped:
                message = f"{path}:{number}: text outside <doc ...> ... </doc>"
                if on_error == "fail":
                    raise ValueError(message)
                stats.note(message)
            continue
        if stripped == "</doc>":
            yield document
            document = None
        elif stripped and not (not document and stripped == title):  # drop the title line
            document.append(stripped)
    if document is not None:
        message = f"{path}: document {title!r} has no closing </doc>"
        if on_error == "fail":
            raise ValueError(message)
        stats.note(message)
        yield document


def _paragraphs(text: str) -> list[str]:
    """A document's text as its paragraphs: its non-blank lines."""
    return [paragraph.strip() for paragraph in text.splitlines() if paragraph.strip()]


def _table(path: Path, stats: CorpusStats, on_error: str, kind: str,
           text_column: str | None = None) -> Iterator[list[str]]:  # fmt: skip
    """A table's rows (JSON Lines, CSV, TSV, Parquet, a datasets folder), a row a document:
    its text column's paragraphs (its lines). A row whose text is missing (null) is an empty
    document (skipped and counted); a record without the column, or whose text is not a
    string, is an error (`on_error="skip"`: noted and skipped)."""
    if kind in ("parquet", "arrow"):
        schema = next(iter(arrow_tables(path, kind)))[0]
        column = _text_column(path, schema, text_column)
    else:
        column = text_column or "text"
    skip = None if on_error == "fail" else (lambda err: stats.note(str(err)))
    # a document may be a whole book: no cell limit (CSV's guard against an unclosed quote)
    whole = FileConfig(max_cell_chars=sys.maxsize // 4)
    for row in read_rows(path, (column,), whole, format=kind, skip=skip):
        text = row.values[column]
        if text is not None and not isinstance(text, str):
            error = DataError(path, row.line, f"column {column!r} is "
                              f"{type(text).__name__}, not a text")  # fmt: skip
            if skip is None:
                raise error
            skip(error)
            continue
        yield _paragraphs(text) if text else []


def _text_column(path: Path, schema: Any, given: str | None) -> str:
    """The column holding the documents' text: the one named, else "text", else the only
    string column."""
    import pyarrow as pa

    names = list(schema.names)
    if given is not None:
        if given not in names:
            raise ValueError(f"{path}: no column {given!r} (its columns: {', '.join(names)})")
        return given
    if "text" in names:
        return "text"
    texts = [
        f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
    ]
    if len(texts) == 1:
        return texts[0]
    raise ValueError(f"{path}: which column holds the text? No 'text' column, and "
                     f"{len(texts)} string columns ({', '.join(texts) or 'none'}): pass "
                     "--text-column")  # fmt: skip


# --------------------------------------------------------------------------- parts
def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def part_files(files: Sequence[Path], index: int, count: int) -> list[Path]:
    """The files of part `index` of `count`: file k goes to the part its first byte falls in
    when the corpus's bytes are cut into `count` equal runs (contiguous, in order)."""
    sizes = [_size(f) for f in files]
    total = max(sum(sizes), 1)
    chosen, before = [], 0
    for file, size in zip(files, sizes, strict=True):
        if min(count - 1, before * count // total) == index:
            chosen.append(file)
        before += size
    if not chosen:
        raise ValueError(f"part {index}/{count} has no files: the corpus has {len(files)} "
                         "(give at most as many parts as files)")  # fmt: skip
    return chosen


def corpus_record(files: Sequence[Path]) -> dict[str, Any]:
    """What every part records of the whole corpus: its files and a digest of their names and
    sizes (the merge refuses parts of different corpora)."""
    listing = [[str(f), _size(f)] for f in files]
    digest = hashlib.sha256(json.dumps(listing).encode()).hexdigest()
    return {"files": [str(f) for f in files], "digest": digest}
