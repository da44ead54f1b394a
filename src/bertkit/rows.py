"""The one reader of rows: the user's own files, the corpus jobs' inputs and `prepare`'s
tables are all read here, as rows of named cells: CSV, TSV, JSON Lines, JSON (a list of
records, or `{"data": [...]}`), Parquet, a folder written by `datasets.Dataset.save_to_disk`,
and CoNLL-style column files for tagging; CSV, TSV and JSON Lines also compressed with gzip,
zstd, bz2 or xz (known by their first bytes). Rows stream (a 1M-row CSV never sits in memory
whole) and each carries the line it starts on, so every error names the file, the line and the
column: a missing column (with the columns found), a ragged row, bytes that are not in the
file's encoding (with the `--encoding` to pass), a CSV cell too large to be text (an unclosed
quote).

    for row in read_rows("train.csv", ("text", "label")):
        row.line, row.values["text"]

A row also carries where it starts (`row.row_index`, and in JSON Lines the byte offset of its
line), and `read_rows(..., start=row)` reads from there: JSON Lines by seeking to the offset,
Parquet by skipping the row groups before it, the other formats by reading up to it. One
format detector (`file_format`: the flag, else the first bytes, else the name under a
compression's suffix) and one glob expander (`expand_paths`) serve every command.

CSV is read as users write it: quoted fields holding commas, quotes (`""`) and newlines, a
byte-order mark, CRLF line ends, backslashes kept as they are (`escape_char="\\\\"` for files
that escape quotes with them). Parquet and `datasets` folders need pyarrow (the `parquet`
extra); their integer ClassLabel columns come back as the label names the dataset declares.
For them a row's "line" is its row number (1-based).
"""

from __future__ import annotations

import codecs
import csv
import dataclasses
import difflib
import io
import itertools
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from bertkit.errors import DataError
from bertkit.settings import Settings, setting

FORMATS = ("auto", "csv", "tsv", "jsonl", "json", "parquet", "arrow", "conll")
MAX_CELL_CHARS = 1_000_000  # a text cell larger than this is an unclosed quote, not a text
_CSV_CAP = 32 * 2**20
_EXTENSIONS = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".arrow": "arrow",
    ".conll": "conll",
    ".conllu": "conll",
    ".iob": "conll",
    ".iob2": "conll",
    ".bio": "conll",
}


QUOTINGS = ("minimal", "none")
# the first bytes of each compression bertkit reads, and its file suffix
COMPRESSIONS = {b"\x1f\x8b": ("gzip", ".gz"), b"\x28\xb5\x2f\xfd": ("zstd", ".zst"),
                b"BZh": ("bz2", ".bz2"), b"\xfd7zXZ\x00": ("xz", ".xz")}  # fmt: skip
_COMPRESSED_SUFFIXES = {".gz", ".gzip", ".zst", ".zstd", ".bz2", ".xz"}


@dataclass
class FileConfig(Settings):
    """How to read a file: the flags of the same names of `bertkit finetune` (a field of
    `DataConfig`) and of `bertkit predict` (where each one not given is as the model's training
    files were read: `over`)."""

    format: str = setting("auto", "file format (auto: by extension)", choices=FORMATS)
    columns: str | None = setting(None, "names of a header-less file's columns: a,b,c")
    encoding: str = setting("utf-8", "text encoding of the files (cp1252, latin-1, utf-16, ...)")
    delimiter: str | None = setting(None, "CSV field separator (default ',', TSV: tab)")
    escape_char: str | None = setting(None, "CSV: a character escaping quotes, e.g. '\\'")
    quoting: str | None = setting(
        None,
        "CSV/TSV quotes: minimal (a quoted field may hold separators and line breaks; the "
        "default) or none (a quote is text, as in GLUE's TSV files, whose sentences may open "
        "a quote they never close)",
        choices=QUOTINGS,
    )
    max_cell_chars: int = setting(
        MAX_CELL_CHARS,
        "CSV, TSV, CoNLL: longest cell read (longer: an unclosed quote)",
        check="positive",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.columns is not None and not isinstance(self.columns, str):  # names from Python
            self.columns = ",".join(self.columns)
        if self.columns and not all(self.column_names or ()):
            raise ValueError(f"--columns {self.columns!r} names an empty column")
        for name in ("delimiter", "escape_char"):
            value = getattr(self, name)
            if value is not None and len(value) != 1:
                raise ValueError(f"--{name.replace('_', '-')} must be one character, got {value!r}")
        if self.encoding is not None:
            try:
                codecs.lookup(self.encoding)
            except LookupError:
                raise ValueError(f"unknown encoding {self.encoding!r}") from None

    @property
    def column_names(self) -> tuple[str, ...] | None:
        """The columns of a header-less file; None: its first line names them."""
        return tuple(c.strip() for c in self.columns.split(",")) if self.columns else None

    def over(self, saved: FileConfig) -> FileConfig:
        """`saved` with each setting given here (not None) in its place."""
        given = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return dataclasses.replace(saved, **{k: v for k, v in given.items() if v is not None})


class _Every(tuple):
    """`optional` meaning every column the file has."""


_EVERY = _Every()


class Row(NamedTuple):
    line: int  # where the row starts (Parquet, arrow: the row number), 1-based
    values: dict[str, Any]
    row_index: int = 0  # among the file's rows, 0-based
    offset: int | None = None  # JSON Lines: the byte offset of its line (where to seek)


class Start(NamedTuple):
    """Where reading starts: a row's index, its line and (JSON Lines) its byte offset; a `Row`
    serves as one."""

    line: int = 1
    row_index: int = 0
    offset: int | None = None


def compression_of(path: str | os.PathLike) -> str | None:
    """gzip, zstd, bz2 or xz by the file's first bytes; None: not compressed (as bertkit knows)."""
    path = Path(path)
    if path.is_dir():
        return None
    with open(path, "rb") as handle:
        head = handle.read(6)
    return next((name for magic, (name, _) in COMPRESSIONS.items() if head.startswith(magic)),
                None)  # fmt: skip


def open_binary(path: str | os.PathLike) -> Any:
    """The file's bytes, decompressed as they are read where it is compressed."""
    path = Path(path)
    kind = compression_of(path)
    if kind == "gzip":
        import gzip

        return gzip.open(path, "rb")
    if kind == "bz2":
        import bz2

        return bz2.open(path, "rb")
    if kind == "xz":
        import lzma

        return lzma.open(path, "rb")
    if kind == "zstd":
        try:
            import zstandard
        except ImportError:
            raise ImportError(f"{path}: zstd-compressed; reading it needs the zstandard "
                              "package: pip install 'bertkit[corpora]'") from None  # fmt: skip
        raw = open(path, "rb")
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True))
    return open(path, "rb")


def plain_suffix(path: str | os.PathLike) -> str:
    """The suffix under a compression's: plain_suffix("corpus.json.gz") -> ".json" """
    path = Path(path)
    if path.suffix.lower() in _COMPRESSED_SUFFIXES:
        return Path(path.stem).suffix.lower()
    return path.suffix.lower()


def file_format(path: str | os.PathLike, format: str = "auto", default: str = "csv") -> str:
    """The format of `path`, the one detector of every command: the one given; else a folder
    is a `datasets` folder, a file starting as Parquet or arrow is one; else by the name under a
    compression's suffix (news.tsv.gz: tsv); else `default`. A file named .parquet or .arrow
    that is not one is refused, naming --format.

    >>> file_format("news.tsv.gz"), file_format("notes.txt", default="jsonl")
    ('tsv', 'jsonl')
    """
    if format != "auto":
        return format
    path = Path(path)
    if path.is_dir():
        return "arrow"
    by_name = _EXTENSIONS.get(plain_suffix(path))
    if path.is_file():
        with open(path, "rb") as handle:
            head = handle.read(8)
        if head.startswith(b"PAR1"):
            return "parquet"
        if head.startswith(b"ARROW1") or head.startswith(b"\xff\xff\xff\xff"):
            return "arrow"
        if by_name in ("parquet", "arrow"):
            raise DataError(path, None, f"named {path.suffix} but not {by_name} (its first bytes "
                            f"are {head[:4]!r}): pass --format for what it is")  # fmt: skip
    return by_name or default


def expand_paths(patterns: Iterable[str | os.PathLike], what: str = "file") -> list[Path]:
    """The files `patterns` name, in order, once each — the one expander of every command's
    inputs (corpus jobs, `prepare`, pre-training): a path; a glob's matches, sorted (`**`
    reaches into folders); a folder's files, sorted and recursively (dot files left out), or a
    `datasets` folder (its state.json) as one source. A pattern naming nothing is a
    FileNotFoundError naming it (`what` it should have named).

    >>> expand_paths(["no/such/*.jsonl"])   # doctest: +ELLIPSIS
    Traceback (most recent call last):
    FileNotFoundError: no/such/*.jsonl: no such file (the glob matched nothing)
    """
    import glob

    found: list[Path] = []
    for pattern in patterns:
        text = str(pattern)
        magic = glob.has_magic(text)
        matches = [Path(m) for m in sorted(glob.glob(text, recursive=True))] if magic else [
            Path(text)]  # fmt: skip
        if not matches or not matches[0].exists():
            raise FileNotFoundError(f"{text}: no such {what}"
                                    + (" (the glob matched nothing)" if magic else ""))  # fmt: skip
        for path in matches:
            if path.is_dir() and not (path / "state.json").exists():
                inside = sorted(p for p in path.rglob("*")
                                if p.is_file() and not p.name.startswith("."))  # fmt: skip
            else:
                inside = [path]
            found += [p for p in inside if p not in found]
    return found


def read_rows(
    path: str | os.PathLike,
    needed: Sequence[str],
    options: FileConfig | None = None,
    *,
    optional: Sequence[str] = (),
    format: str | None = None,
    every_column: bool = False,
    start: Row | Start | None = None,
    skip: Callable[[DataError], None] | None = None,
    bare: str | None = None,
) -> Iterator[Row]:
    """The rows of a table-like file with the `needed` columns (a missing one is a DataError
    listing the columns found) and the `optional` ones where the file has them; with
    `every_column`, all the file's columns. From `start` (a row read before, or a `Start`)
    where given. With `skip`, a row that cannot be read (a line that is not JSON, a record
    without a needed column, a ragged row) is handed to it and left out instead of raised. With
    `bare`, a JSON line holding a value that is not an object is the row {bare: value}."""
    path = Path(path)
    options = options or FileConfig()
    kind = format or file_format(path, options.format)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    if every_column:
        optional = _EVERY
    at = Start(start.line, start.row_index, start.offset) if start is not None else Start()
    reading = _Reading(path, tuple(needed), optional, options, skip, bare)
    if kind in ("csv", "tsv"):
        rows = _delimited_rows(reading, kind)
    elif kind == "jsonl":
        rows = _jsonl_rows(reading, at)
    elif kind == "json":
        rows = _json_rows(reading)
    elif kind in ("parquet", "arrow"):
        rows = _arrow_rows(reading, kind, at.row_index)
    else:
        raise ValueError(f"{path}: a {kind} file holds no table of rows")
    yield from (row for row in rows if row.row_index >= at.row_index)


def row_starts(path: str | os.PathLike, needed: Sequence[str], options: FileConfig | None = None,
               format: str | None = None) -> Iterator[Start]:  # fmt: skip
    """Where each row of the file starts, as `read_rows(start=...)` takes it: a JSON Lines
    file's non-blank lines, not parsed; the other formats' rows as `read_rows` reads them with
    the `needed` columns."""
    options = options or FileConfig()
    kind = format or file_format(path, options.format)
    if kind == "jsonl" and _line_encoding(options.encoding):
        for index, (number, offset, _) in enumerate(_binary_lines(Path(path))):
            yield Start(number, index, offset)
        return
    yield from (Start(row.line, row.row_index, row.offset)
                for row in read_rows(path, needed, options, format=kind))  # fmt: skip


@dataclass(frozen=True)
class _Reading:
    """What one `read_rows` call asks of a file."""

    path: Path
    needed: tuple[str, ...]
    optional: Sequence[str]
    options: FileConfig
    skip: Callable[[DataError], None] | None
    bare: str | None

    def failed(self, error: DataError) -> None:
        """Raise `error`, or hand it to `skip` (the row is then left out)."""
        if self.skip is None:
            raise error
        self.skip(error)


# --------------------------------------------------------------------------- checks
def missing_column(name: str, found: Sequence[str], what: str = "columns are") -> str:
    """missing_column("txt", ["text", "label"]) -> "no column 'txt' (did you mean 'text'?);
    the columns are: 'text', 'label'" """
    close = difflib.get_close_matches(name, list(found), n=1, cutoff=0.6)
    stripped = [f for f in found if f.strip().lower() == name.strip().lower()]
    hint = f" (did you mean {(stripped or close)[0]!r}?)" if stripped or close else ""
    listed = ", ".join(repr(f) for f in found[:20]) + (", ..." if len(found) > 20 else "")
    return f"no column {name!r}{hint}; the {what}: {listed or 'none'}"


def _missing(path: Path, line: int | None, name: str, found: Sequence[str], what: str) -> DataError:
    return DataError(path, line, missing_column(name, found, what))


def _check_cell(path: Path, line: int, name: str, value: Any, limit: int) -> None:
    if isinstance(value, str) and len(value) > limit:
        raise DataError(
            path,
            line,
            f"column {name!r}: a cell of {len(value):,} characters, over the {limit:,} limit "
            "(an unclosed quote swallowing the lines after it? else raise --max-cell-chars)",
        )


# --------------------------------------------------------------------------- CSV and TSV
def open_text(path: Path, encoding: str) -> io.TextIOWrapper:
    """A text handle for reading (decompressed as it is read); UTF-8 drops a byte-order mark,
    newlines are kept for csv."""
    name = "utf-8-sig" if codecs.lookup(encoding).name == "utf-8" else encoding
    return io.TextIOWrapper(open_binary(path), encoding=name, newline="")


def decode_error(path: Path, encoding: str) -> DataError:
    """Where `path` stops being `encoding`, and which `--encoding` would read it."""
    decoder = codecs.getincrementaldecoder(encoding)()
    offset, bad = 0, None
    with open_binary(path) as handle:
        while chunk := handle.read(1 << 20):
            pending = len(decoder.getstate()[0])
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as err:
                bad = offset - pending + err.start
                break
            offset += len(chunk)
    if bad is None:  # (the error came from the csv layer after all)
        return DataError(path, None, f"cannot be read as {encoding}")
    with open_binary(path) as handle:
        head = handle.read(bad + 1)
        rest = handle.read(200)
    wide = (head + rest)[:2] in (b"\xff\xfe", b"\xfe\xff")  # UTF-16's byte-order marks
    line = head.count(b"\n") + 1
    line_start = head.rfind(b"\n") + 1
    rest = head[line_start:] + rest
    text = rest.split(b"\n", 1)[0]
    return _not_encoded(path, line, text, bad - line_start, encoding, wide)


def _not_encoded(
    path: Path, line: int, text: bytes, at: int, encoding: str, wide: bool = False
) -> DataError:
    """The line's byte `at` is not `encoding`: which `--encoding` would read it."""
    if wide:
        advice = "--encoding utf-16"
    else:
        try:
            text.decode("cp1252")
            advice = "--encoding cp1252 (Excel and older Windows tools), or latin-1"
        except UnicodeDecodeError:
            advice = "--encoding latin-1 (or the encoding the file was saved in)"
    return DataError(
        path,
        line,
        f"not {encoding} (byte 0x{text[at]:02X} at column {at + 1} of {text[:80]!r}); "
        f"pass {advice}",
    )


def _delimited_rows(reading: _Reading, kind: str) -> Iterator[Row]:
    path, needed, optional, options = (
        reading.path,
        reading.needed,
        reading.optional,
        reading.options,
    )
    delimiter = options.delimiter or ("\t" if kind == "tsv" else ",")
    # csv's own cap (process-wide) only guards memory against a quote never closed in a huge
    # file; the check below, well under it, names the column
    cap = min(sys.maxsize, max(_CSV_CAP, 4 * options.max_cell_chars))
    csv.field_size_limit(max(csv.field_size_limit(), cap))
    with open_text(path, options.encoding) as handle:
        reader = csv.reader(
            handle,
            delimiter=delimiter,
            quotechar='"',
            doublequote=True,
            escapechar=options.escape_char,
            quoting=csv.QUOTE_NONE if options.quoting == "none" else csv.QUOTE_MINIMAL,
            strict=False,
        )
        start, index = 1, 0
        try:
            if options.column_names is not None:
                header = list(options.column_names)
            else:
                first = next(reader, None)
                if first is None:
                    raise DataError(path, None, "empty file (no header line)")
                header = first
                start = reader.line_num + 1
            _check_header(path, header, needed, options, delimiter)
            wanted = [(name, header.index(name)) for name in needed]
            extra = header if isinstance(optional, _Every) else optional
            wanted += [(name, header.index(name)) for name in extra if name in header and name
                       not in needed]  # fmt: skip
            # each row is given once the next is read: the last one, where a quote it opens
            # would have run to the end of the file, is checked first (`_quote_runs_out`)
            held, ends = None, 0
            # a TSV row whose quoted cell runs over lines holding tabs: rows joined by a quote
            joined = delimiter == "\t" and options.quoting != "none"
            for fields in reader:
                line, start = start, reader.line_num + 1
                if not fields or not any(f.strip() for f in fields):
                    continue  # a blank line
                try:
                    if len(fields) != len(header):
                        raise _ragged(path, line, fields, header, delimiter,
                                      reader.line_num > line, options.quoting != "none")  # fmt: skip
                    if joined and reader.line_num > line:
                        _check_joined(path, line, reader.line_num, header, fields, reader.dialect,
                                      options)  # fmt: skip
                    values = {}
                    for name, position in wanted:
                        _check_cell(path, line, name, fields[position], options.max_cell_chars)
                        values[name] = fields[position]
                except DataError as err:
                    reading.failed(err)
                    continue
                if held is not None:
                    yield held
                held, ends = Row(line, values, index), reader.line_num
                index += 1
            if held is not None:
                if ends > held.line and _quote_runs_out(path, held.line, reader.dialect, options):
                    reading.failed(_never_closed(path, held.line, ends))
                else:
                    yield held
        except UnicodeDecodeError:
            raise decode_error(path, options.encoding) from None
        except csv.Error as err:
            if "field larger than field limit" in str(err):
                raise DataError(
                    path,
                    start,
                    f"a cell of more than {csv.field_size_limit():,} characters starts in "
                    "the row here: an unclosed quote?",
                ) from None
            raise DataError(path, reader.line_num, f"malformed {kind.upper()}: {err}") from None


def _check_joined(path: Path, line: int, last: int, header: list[str], fields: list[str],
                  dialect: Any, options: FileConfig) -> None:  # fmt: skip
    """A TSV row running over lines whose cell holds both line breaks and tabs: a quote opened
    in the text and closed lines later (by another stray quote) joined those rows into one
    that still has the header's fields, so csv reads it without a word. A tab in a quoted
    text that also runs over lines is almost never meant; the rows are refused by line."""
    for name, value in zip(header, fields, strict=True):
        if "\n" in value and "\t" in value:
            if _quote_runs_out(path, line, dialect, options):  # (the file's last row)
                raise _never_closed(path, line, last)
            raise DataError(
                path,
                line,
                f"column {name!r}: a quoted cell holding line breaks and tabs joins lines "
                f"{line}-{last} into one row (a quote the text opens, closed by a later one). "
                "If quotes in this file are text (GLUE's TSV files), pass --quoting none",
            )


def _never_closed(path: Path, line: int, last: int) -> DataError:
    return DataError(
        path,
        line,
        f"a quote opened in this row is never closed: the {last - line:,} lines after it would "
        "be read as part of one cell. If quotes in this file are text (GLUE's TSV files), pass "
        "--quoting none; else close it",
    )


def _quote_runs_out(path: Path, line: int, dialect: Any, options: FileConfig) -> bool:
    """Whether the record that starts at `line` (the file's last, running over lines) is a
    quoted field still open at the end of the file. csv's lenient reading takes such a field
    to the end as text, silently: the rows after the quote become one cell of one row. Read
    again from there in csv's strict mode, which names the open field."""
    if dialect.quoting == csv.QUOTE_NONE:
        return False
    with open_text(path, options.encoding) as handle:
        for _ in itertools.islice(handle, line - 1):
            pass
        try:
            for _ in csv.reader(handle, dialect, strict=True):
                pass
        except csv.Error as err:
            return "unexpected end of data" in str(err)
    return False


def _check_header(path, header: list[str], needed, options: FileConfig, delimiter: str) -> None:
    duplicates = sorted({h for h in header if header.count(h) > 1 and h})
    if duplicates:
        raise DataError(path, 1, f"the header names {duplicates} twice")
    for name in needed:
        if name in header:
            continue
        message = missing_column(name, header, "header's columns are")
        hints = []
        if options.column_names is None and _looks_like_data(header):
            hints.append("a file without a header line? name its columns with --columns a,b,c")
        others = [d for d in ",;\t|" if d != delimiter and len(header) == 1 and d in header[0]]
        if others:
            hints.append(f"{others[0]!r}-separated? pass --delimiter {others[0]!r}")
        raise DataError(path, 1, message + (f" ({'; '.join(hints)})" if hints else ""))


def _looks_like_data(header: list[str]) -> bool:
    """A header line of numbers, sentences or blanks is a first row of data."""
    from bertkit.tasks.labels import kind_of

    return any(kind_of(h) in ("int", "float", "empty") or len(h.split()) > 3 for h in header)


def _ragged(path, line, fields, header, delimiter, spans_lines: bool, quoted: bool) -> DataError:
    message = f"{_fields(len(fields))}, the header has {len(header)} ({', '.join(header)})"
    if len(fields) > len(header):
        message += f": a {delimiter!r} inside an unquoted text? quote that field"
        if any('\\"' in f or f.endswith("\\") for f in fields):
            message += ", or pass --escape-char '\\' if quotes are escaped with backslashes"
    elif spans_lines or (quoted and any('"' in f or delimiter in f for f in fields)):
        # (a quote the text opens and a later one closes swallows the separators between)
        message += (": an unclosed quote (joining fields, or running over lines)? If quotes in "
                    "this file are text (GLUE's TSV files), pass --quoting none")  # fmt: skip
    return DataError(path, line, message)


def _fields(count: int) -> str:
    return f"{count} field{'' if count == 1 else 's'}"


# --------------------------------------------------------------------------- JSON
def _record(reading: _Reading, line: int, item: Any, index: int) -> Row:
    path, needed, optional = reading.path, reading.needed, reading.optional
    if not isinstance(item, dict):
        if reading.bare is None:
            raise DataError(path, line, f"a JSON {type(item).__name__}, expected an object (a "
                            "record of columns)")  # fmt: skip
        item = {reading.bare: item}
    values = {}
    for name in needed:
        if name not in item:
            raise _missing(path, line, name, list(item), "record's keys are")
        values[name] = item[name]
    if isinstance(optional, _Every):
        return Row(line, {**item, **values}, index)
    for name in optional:
        if name in item:
            values[name] = item[name]
    return Row(line, values, index)


def _line_encoding(encoding: str) -> bool:
    """Whether a file in `encoding` can be split into lines as bytes (UTF-8, latin-1, cp1252,
    ...; not UTF-16 or UTF-32)."""
    return "\n".encode(encoding) == b"\n"


def _binary_lines(path: Path, at: Start | None = None) -> Iterator[tuple[int, int, bytes]]:
    """(line number, byte offset, bytes) of each non-blank line of a (possibly compressed)
    file from `at`: an offset is sought to where the file is not compressed, else read up to."""
    with open_binary(path) as handle:
        offset, number = 0, 1
        if at is not None and at.offset is not None and at.offset > 0:
            if compression_of(path) is None:
                handle.seek(at.offset)
            else:
                remaining = at.offset
                while remaining:
                    remaining -= len(handle.read(min(remaining, 1 << 20)))
            offset, number = at.offset, at.line
        for raw in handle:
            if offset == 0 and raw.startswith(b"\xef\xbb\xbf"):
                raw, offset = raw[3:], 3
            if raw.strip():
                yield number, offset, raw
            offset += len(raw)
            number += 1


def _json_texts(path: Path, encoding: str, at: Start | None = None
                ) -> Iterator[tuple[int, int | None, str | DataError]]:  # fmt: skip
    """The one line reader of JSON Lines: (line number, byte offset, text) of each non-blank
    line from `at`, or in the text's place why the line cannot be decoded (so a reader that
    skips bad rows goes on). Split as bytes, so each line has its offset; a file in UTF-16 or
    UTF-32 is decoded as a whole instead (no offsets, an undecodable byte ends the read)."""
    if not _line_encoding(encoding):
        with open_text(path, encoding) as handle:
            try:
                for number, text in enumerate(handle, start=1):
                    if text.strip():
                        yield number, None, text
            except UnicodeDecodeError:
                raise decode_error(path, encoding) from None
        return
    for number, offset, raw in _binary_lines(path, at):
        try:
            yield number, offset, raw.decode(encoding)
        except UnicodeDecodeError as err:
            yield number, offset, _not_encoded(path, number, raw.rstrip(b"\r\n"), err.start,
                                               encoding)  # fmt: skip


def _jsonl_rows(reading: _Reading, at: Start) -> Iterator[Row]:
    seek = at.offset is not None and _line_encoding(reading.options.encoding)
    index = at.row_index if seek else 0
    for number, offset, text in _json_texts(reading.path, reading.options.encoding,
                                            at if seek else None):  # fmt: skip
        try:
            if isinstance(text, DataError):
                raise text
            row = _record(reading, number, json_line(reading.path, number, text), index)
        except DataError as err:
            reading.failed(err)
        else:
            yield row._replace(offset=offset)
        index += 1


def json_line(path: str | os.PathLike, number: int, text: str) -> Any:
    """One line of a JSON-lines file, or DataError naming the file and line."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(path, number, f"not JSON ({err.msg} at column {err.colno})") from None


def read_jsonl(path: str | os.PathLike) -> list:
    """The inputs of a JSON-lines file as `predict --input` and `fill-mask --input` take them:
    `{"text": a, "text_pair": b}` becomes the pair `(a, b)`, `{"text": a}` the string `a`,
    anything else is kept as read."""
    items: list = []
    for number, _, text in _json_texts(Path(path), "utf-8"):
        if isinstance(text, DataError):
            raise text
        item = json_line(path, number, text)
        if isinstance(item, dict) and "text" in item:
            item = (item["text"], item["text_pair"]) if "text_pair" in item else item["text"]
        items.append(item)
    return items


def json_records(path: Path, encoding: str = "utf-8") -> Iterator[tuple[int, Any]]:
    """(line, record) of a JSON file: a list of records, an object with a `data` list, or
    (what `datasets`' to_json writes under a .json name) JSON Lines."""
    with open_text(path, encoding) as handle:
        try:
            text = handle.read()
        except UnicodeDecodeError:
            raise decode_error(path, encoding) from None
    decoder = json.JSONDecoder()
    lines = _LineCounter(text)
    at = _skip_space(text, 0)
    if at == len(text):
        raise DataError(path, None, "empty file")
    if text[at] == "[":
        at = _skip_space(text, at + 1)
        if text[at : at + 1] == "]":
            return
        while True:
            try:
                item, end = decoder.raw_decode(text, at)
            except json.JSONDecodeError as err:
                raise DataError(
                    path, err.lineno, f"not JSON ({err.msg}, column {err.colno})"
                ) from None
            yield lines.line(at), item
            at = _skip_space(text, end)
            if text[at : at + 1] == ",":
                at = _skip_space(text, at + 1)
                continue
            if text[at : at + 1] == "]":
                return
            raise DataError(path, lines.line(at), "expected ',' or ']' between records")
    try:
        whole = json.loads(text)
    except json.JSONDecodeError as err:
        if err.msg != "Extra data":
            raise DataError(path, err.lineno, f"not JSON ({err.msg}, column {err.colno})") from None
        for number, line in enumerate(text.splitlines(), start=1):  # JSON Lines
            if line.strip():
                yield number, json_line(path, number, line)
        return
    if isinstance(whole, dict) and isinstance(whole.get("data"), list):
        for item in whole["data"]:  # positions are lost inside one object; name the index
            yield None, item  # type: ignore[misc]
        return
    raise DataError(path, 1, 'expected a list of records (or an object with a "data" list)')


def _json_rows(reading: _Reading) -> Iterator[Row]:
    for index, (line, item) in enumerate(json_records(reading.path, reading.options.encoding)):
        try:
            yield _record(reading, line if line is not None else index + 1, item, index)
        except DataError as err:
            reading.failed(err)


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at


class _LineCounter:
    """Line numbers of increasing positions in a text, counting each newline once."""

    def __init__(self, text: str) -> None:
        self.text, self.at, self.count = text, 0, 1

    def line(self, position: int) -> int:
        self.count += self.text.count("\n", self.at, position)
        self.at = position
        return self.count


# --------------------------------------------------------------------------- Parquet, arrow
def _pyarrow(kind: str):
    try:
        import pyarrow
    except ImportError:
        raise ImportError(
            f"reading {kind} files needs pyarrow: pip install 'bertkit[parquet]'"
        ) from None
    return pyarrow


def _arrow_files(path: Path) -> list[Path]:
    """The arrow files of a `save_to_disk` folder, in order."""
    if (path / "dataset_dict.json").exists():
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
        raise DataError(
            path, None, "a DatasetDict folder; pass one of its splits: "
            + ", ".join(str(path / s) for s in splits)
        )  # fmt: skip
    state = path / "state.json"
    if path.is_dir():
        if not state.exists():
            raise DataError(path, None, "a folder without state.json: not a datasets folder")
        files = [path / f["filename"] for f in json.loads(state.read_text())["_data_files"]]
        return files
    return [path]


def arrow_tables(path: Path, kind: str):
    """(schema, batches) of each table of a Parquet file or datasets folder, where
    `batches(columns, skip)` is (rows left out, the record batches of `columns` after them):
    a Parquet file leaves out its row groups wholly within the first `skip` rows."""
    pa = _pyarrow(kind)
    if kind == "parquet":
        import pyarrow.parquet as pq

        try:
            source = pq.ParquetFile(path)
        except pa.ArrowInvalid as err:
            raise DataError(path, None, f"not a Parquet file ({err})") from None

        def groups(columns, skip: int = 0):
            first, chosen = 0, list[int]()
            for group in range(source.metadata.num_row_groups):
                rows = source.metadata.row_group(group).num_rows
                if first + rows > skip or chosen:
                    chosen.append(group)
                else:
                    first += rows
            return first, source.iter_batches(65536, row_groups=chosen, columns=columns)

        yield source.schema_arrow, groups
        return
    for file in _arrow_files(path):
        try:
            reader = pa.ipc.open_stream(pa.memory_map(str(file)))
        except pa.ArrowInvalid:
            try:
                reader = pa.ipc.open_file(pa.memory_map(str(file)))
            except pa.ArrowInvalid as err:
                raise DataError(file, None, f"not an arrow file ({err})") from None
        table = reader.read_all()
        yield (
            table.schema,
            lambda columns, skip=0, t=table: (0, t.select(columns).to_batches(65536)),
        )


def _class_labels(schema) -> dict[str, list[str]]:
    """Names of `datasets` ClassLabel columns (ints on disk), from the schema's metadata."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if not raw:
        return {}
    features = json.loads(raw).get("info", {}).get("features", {})
    names = {}
    for column, feature in features.items():
        inner = feature.get("feature", feature) if isinstance(feature, dict) else {}
        if isinstance(inner, dict) and inner.get("_type") == "ClassLabel" and "names" in inner:
            names[column] = list(inner["names"])
    return names


def _arrow_rows(reading: _Reading, kind: str, first: int = 0) -> Iterator[Row]:
    """A Parquet file's or datasets folder's rows; a Parquet file's row groups wholly before
    row `first` are not read."""
    path, needed, optional = reading.path, reading.needed, reading.optional
    number = 0
    for schema, batches in arrow_tables(path, kind):
        found = list(schema.names)
        for name in needed:
            if name not in found:
                raise _missing(path, None, name, found, "columns are")
        extra = found if isinstance(optional, _Every) else optional
        columns = list(needed) + [n for n in extra if n in found and n not in needed]
        labels = _class_labels(schema)
        skipped, stream = batches(columns, first - number)
        number += skipped
        for batch in stream:
            for item in batch.to_pylist():
                number += 1
                for name, names in labels.items():
                    if name in item:
                        item[name] = _named(item[name], names)
                yield Row(number, item, number - 1)


def _named(value: Any, names: list[str]) -> Any:
    if isinstance(value, list):
        return [_named(v, names) for v in value]
    if isinstance(value, int) and 0 <= value < len(names):
        return names[value]
    return value  # -1 (no label) and None stay as they are


# --------------------------------------------------------------------------- CoNLL columns
class ColumnSentence(NamedTuple):
    line: int  # of its first token
    rows: list[list[str]]  # one list of fields per token
    lines: list[int]  # each token's line


def read_conll_columns(
    path: str | os.PathLike, options: FileConfig | None = None, min_fields: int = 2
) -> tuple[list[ColumnSentence], int]:
    """(sentences, fields per line) of a CoNLL-style file: one token a line with its fields
    separated by tabs (if the line has any) or spaces, a blank line between sentences,
    `-DOCSTART-` lines and `#` comment lines (CoNLL-U) skipped. Every token line has as many
    fields as the first, and at least `min_fields` (a token and its tag)."""
    path = Path(path)
    options = options or FileConfig()
    sentences: list[ColumnSentence] = []
    rows: list[list[str]] = []
    lines: list[int] = []
    width = None

    def close() -> None:
        if rows:
            sentences.append(ColumnSentence(lines[0], list(rows), list(lines)))
            rows.clear()
            lines.clear()

    with open_text(path, options.encoding) as handle:
        try:
            for number, text in enumerate(handle, start=1):
                text = text.rstrip("\r\n")
                fields = text.split("\t") if "\t" in text else text.split()
                fields = [f.strip() for f in fields]
                if not any(fields):
                    close()
                    continue
                if fields[0] == "-DOCSTART-" or (fields[0].startswith("#") and not rows
                                                  and len(fields) == 1):  # fmt: skip
                    close()
                    continue
                if width is None:
                    width = len(fields)
                    if width < min_fields:
                        raise DataError(
                            path,
                            number,
                            f"1 field ({text[:60]!r}); expected a token and its tag per line "
                            "(tab- or space-separated)",
                        )
                elif len(fields) != width:
                    raise DataError(
                        path, number, f"{_fields(len(fields))}, the file's lines have {width}"
                    )
                _check_cell(path, number, "token", fields[0], options.max_cell_chars)
                rows.append(fields)
                lines.append(number)
        except UnicodeDecodeError:
            raise decode_error(path, options.encoding) from None
    close()
    if not sentences:
        raise DataError(path, None, "no sentences (token lines)")
    return sentences, width or 0
