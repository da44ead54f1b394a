"""Reading users' files (bertkit.rows): every format, CSV as people write it, and each
bad input as an error naming the file, the line and the column."""

from __future__ import annotations

import csv
import gzip
import json

import pytest

from bertkit.rows import FileConfig, file_format, read_conll_columns, read_rows
from bertkit.tasks.base import DataError

RECORDS = [
    {"text": 'He said "hi", then left.\nNew line here.', "label": "greeting", "n": 1},
    {"text": "C:\\Users\\ann\\ and a trailing backslash \\", "label": "path", "n": 2},
    {"text": "plain, with a comma", "label": "plain", "n": 3},
    {"text": "naïve café — ünïcödé ✓", "label": "unicode", "n": 4},
]


def rows(path, needed=("text", "label"), **options):
    fmt = options.pop("format", None)
    return list(read_rows(path, needed, FileConfig(**options), format=fmt))


def write_csv(path, records, *, delimiter=",", bom=False, crlf=False, header=True):
    with open(path, "w", encoding="utf-8-sig" if bom else "utf-8", newline="") as handle:
        writer = csv.writer(handle, delimiter=delimiter, lineterminator="\r\n" if crlf else "\n")
        if header:
            writer.writerow(["text", "label", "n"])
        for r in records:
            writer.writerow([r["text"], r["label"], r["n"]])
    return path


@pytest.mark.parametrize("bom", [False, True])
@pytest.mark.parametrize("crlf", [False, True])
def test_csv_as_users_write_it(tmp_path, bom, crlf):
    """Quoted commas, doubled quotes, newlines inside quotes, backslashes, a BOM, CRLF."""
    path = write_csv(tmp_path / "data.csv", RECORDS, bom=bom, crlf=crlf)
    found = rows(path)
    assert [r.values["text"] for r in found] == [r["text"] for r in RECORDS]
    assert [r.values["label"] for r in found] == [r["label"] for r in RECORDS]
    assert [r.line for r in found] == [2, 4, 5, 6]  # the first record spans lines 2-3


def test_tsv_and_header_less_files(tmp_path):
    path = write_csv(tmp_path / "data.tsv", RECORDS, delimiter="\t", header=False)
    found = rows(path, columns=("text", "label", "n"))
    assert [r.values["label"] for r in found] == [r["label"] for r in RECORDS]
    assert found[0].line == 1
    # the same file read as if it had a header: the first row's cells are not columns
    with pytest.raises(DataError, match=r"data.tsv:1: no column 'text'.*--columns a,b,c"):
        rows(path)


def test_json_lines_json_list_and_data_object(tmp_path):
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in RECORDS) + "\n\n")
    listed = tmp_path / "data.json"
    listed.write_text(json.dumps(RECORDS, indent=2))
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"version": 1, "data": RECORDS}))
    as_lines = tmp_path / "lines.json"  # what datasets' to_json writes under a .json name
    as_lines.write_text("\n".join(json.dumps(r) for r in RECORDS))
    for path in (jsonl, listed, wrapped, as_lines):
        found = rows(path, needed=("text", "label", "n"))
        assert [r.values for r in found] == RECORDS, path
    assert [r.line for r in rows(jsonl)] == [1, 2, 3, 4]
    assert [r.line for r in rows(listed)] == [2, 7, 12, 17]  # where each record starts


def test_parquet_and_datasets_folders_with_class_labels(tmp_path):
    datasets = pytest.importorskip("datasets")
    features = datasets.Features(
        {
            "text": datasets.Value("string"),
            "label": datasets.ClassLabel(names=["neg", "pos"]),
            "tags": datasets.Sequence(datasets.ClassLabel(names=["O", "B-X", "I-X"])),
        }
    )
    data = {"text": ["bad", "good"], "label": [0, 1], "tags": [[0], [1, 2]]}
    ds = datasets.Dataset.from_dict(data, features=features)
    ds.to_parquet(str(tmp_path / "data.parquet"))
    ds.save_to_disk(str(tmp_path / "folder"))
    datasets.DatasetDict(train=ds).save_to_disk(str(tmp_path / "dict"))
    for path in (tmp_path / "data.parquet", tmp_path / "folder"):
        found = rows(path, needed=("text", "label", "tags"))
        assert [r.values for r in found] == [
            {"text": "bad", "label": "neg", "tags": ["O"]},
            {"text": "good", "label": "pos", "tags": ["B-X", "I-X"]},
        ]
        assert [r.line for r in found] == [1, 2]
    assert file_format(tmp_path / "folder") == "arrow"
    with pytest.raises(
        DataError, match=r"a DatasetDict folder; pass one of its splits: .*dict/train"
    ):
        rows(tmp_path / "dict")
    with pytest.raises(DataError, match=r"data.parquet: no column 'txt' \(did you mean 'text'\?\)"):
        rows(tmp_path / "data.parquet", needed=("txt",))


def test_missing_column_lists_what_is_there(tmp_path):
    path = write_csv(tmp_path / "data.csv", RECORDS)
    with pytest.raises(DataError) as err:
        rows(path, needed=("headline", "label"))
    assert f"{path}:1: no column 'headline'" in str(err.value)
    assert "'text', 'label', 'n'" in str(err.value)
    semicolons = tmp_path / "semi.csv"
    semicolons.write_text("text;label\nhello;greeting\n")
    with pytest.raises(DataError, match=r"';'-separated\? pass --delimiter ';'"):
        rows(semicolons)
    assert rows(semicolons, delimiter=";")[0].values == {"text": "hello", "label": "greeting"}
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text('{"text": "a", "label": "x"}\n{"txt": "b", "label": "y"}\n')
    with pytest.raises(
        DataError, match=r"data.jsonl:2: no column 'text'.*keys are: 'txt', 'label'"
    ):
        rows(jsonl)


# Malformed files, each named with the line at fault and what to do about it.
BAD_FILES = [
    ("ragged.csv", "text,label\nfine,a\nnot, quoted,b\n",
     r"ragged.csv:3: 3 fields, the header has 2.*quote that"),
    ("unclosed.csv", 'text,label\n"never closed,a\nnext,b\nlast,c\n',
     r"unclosed.csv:2: 1 field, .*unclosed quote"),
    ("bad.jsonl", '{"text": "a", "label": "x"}\n{"text": "b", "label": \n',
     r"bad.jsonl:2: not JSON"),
    ("scalar.jsonl", '"just a string"\n', r"scalar.jsonl:1: a JSON str, expected an object"),
    ("list.json", '[\n  {"text": "a", "label": "x"},\n  {"text": "b" "label": "y"}\n]',
     r"list.json:3: not JSON"),
]  # fmt: skip


@pytest.mark.parametrize("name, text, error", BAD_FILES, ids=[name for name, *_ in BAD_FILES])
def test_a_malformed_file_is_named_with_its_line(tmp_path, name, text, error):
    (tmp_path / name).write_text(text)
    with pytest.raises(DataError, match=error):
        rows(tmp_path / name)


def test_escaped_quotes_need_the_escape_char(tmp_path):
    escaped = tmp_path / "escaped.csv"
    escaped.write_text('text,label\n"He said \\"hi, there\\"",a\n')
    with pytest.raises(DataError, match=r"escaped.csv:2: .*--escape-char"):
        rows(escaped)
    assert rows(escaped, escape_char="\\")[0].values["text"] == 'He said "hi, there"'


def test_a_quote_left_open_to_the_end_of_the_file_is_named_not_read_as_one_cell(tmp_path):
    """A quote opened in the last column and never closed: csv's lenient reading takes every
    line after it, to the end, as that one cell, and the row still has its fields. Refused by
    the row's line (or handed to `skip`); a last row whose quoted text rightly runs over lines,
    and quotes read as text, still read."""
    lines = 'text,label\nfine,a\nthen,"open\nmore,b\nend,c\n'
    for name, text in (("open.csv", lines), ("open.tsv", lines.replace(",", "\t"))):
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(DataError, match=rf"{name}:3: a quote opened in this row is never "
                                            r"closed: the 2 lines after it.*--quoting none"):  # fmt: skip
            rows(path)
        errors = []
        kept = list(read_rows(path, ("text", "label"), skip=errors.append))
        assert [r.values["text"] for r in kept] == ["fine"] and len(errors) == 1
        kept = rows(path, quoting="none")
        assert [r.values["label"] for r in kept] == ["a", '"open', "b", "c"]
    gzipped = tmp_path / "open.csv.gz"
    gzipped.write_bytes(gzip.compress(lines.encode()))
    with pytest.raises(DataError, match=r"open.csv.gz:3: a quote opened"):
        rows(gzipped)
    closed = tmp_path / "closed.csv"
    closed.write_text('text,label\nfine,a\n"two\nlines, and ""quoted""",b\n\n')
    assert [r.values["text"] for r in rows(closed)] == ["fine", 'two\nlines, and "quoted"']


def test_tsv_rows_joined_by_a_stray_quote_are_named(tmp_path):
    """A TSV sentence opens a quote that a later line's quote closes: the lines between become
    one row that still has the header's fields. Refused by line and column (or handed to
    `skip`), where a quoted cell running over lines without tabs, and any CSV's, still read."""
    path = tmp_path / "joined.tsv"
    path.write_text('id\ttext\tlabel\n1\t"opens\ta\n2\tcloses" here\tb\n3\tfine\tc\n')
    with pytest.raises(DataError, match=r"joined.tsv:2: column 'text': a quoted cell holding "
                                        r"line breaks and tabs joins lines 2-3"):  # fmt: skip
        rows(path)
    errors = []
    assert [r.values["text"] for r in read_rows(path, ("text",), skip=errors.append)] == ["fine"]
    assert len(errors) == 1
    assert len(rows(path, quoting="none")) == 3
    lines = tmp_path / "lines.tsv"
    lines.write_text('text\tlabel\n"two\nlines"\ta\nfine\tb\n')
    assert [r.values["text"] for r in rows(lines)] == ["two\nlines", "fine"]
    csv_file = tmp_path / "lines.csv"
    csv_file.write_text('text,label\n"two\tcolumns\nof text",a\nfine,b\n')
    assert [r.values["label"] for r in rows(csv_file)] == ["a", "b"]


def test_a_huge_cell_is_refused_by_line_and_column(tmp_path):
    path = tmp_path / "big.csv"
    with open(path, "w") as handle:
        handle.write("text,label\nshort,a\n")
        handle.write('"' + "x" * 10_000_000 + '",b\n')
    with pytest.raises(
        DataError, match=r"big.csv:3: column 'text': a cell of 10,000,000 characters"
    ):
        rows(path)
    # an unclosed quote that swallows the rest of a file: csv's own limit, still by line
    with open(path, "w") as handle:
        handle.write('text,label\nshort,a\n"' + ("y" * 100 + "\n") * 50_000)
    with pytest.raises(DataError, match=r"big.csv:3: .*unclosed quote"):
        rows(path, max_cell_chars=100_000)
    # no quote can swallow lines in JSON Lines or Parquet: a long text there is a long text
    import pyarrow as pa
    import pyarrow.parquet as pq

    long = {"text": "z" * 2_000_000, "label": "a"}
    (tmp_path / "long.jsonl").write_text(json.dumps(long) + "\n")
    pq.write_table(pa.Table.from_pylist([long]), tmp_path / "long.parquet")
    for name in ("long.jsonl", "long.parquet"):
        assert rows(tmp_path / name)[0].values == long, name


def test_bytes_that_are_not_utf8_name_the_line_and_the_encoding_to_pass(tmp_path):
    path = tmp_path / "latin.csv"
    path.write_bytes("text,label\nok,a\ncafé au lait,b\n".encode("cp1252"))
    with pytest.raises(DataError) as err:
        rows(path)
    message = str(err.value)
    assert f"{path}:3: not utf-8 (byte 0xE9 at column 4" in message
    assert "--encoding cp1252" in message
    assert rows(path, encoding="cp1252")[1].values["text"] == "café au lait"
    utf16 = tmp_path / "wide.csv"
    utf16.write_bytes("text,label\nhello,a\n".encode("utf-16"))
    with pytest.raises(DataError, match="--encoding utf-16"):
        rows(utf16)
    assert rows(utf16, encoding="utf-16")[0].values == {"text": "hello", "label": "a"}


def test_conll_columns(tmp_path):
    path = tmp_path / "tweets.conll"
    path.write_text(
        "-DOCSTART- O\n\n@ann\tB-user\nloves\tO\n#pizza\tB-food\n\nNew\tB-city\nYork\tI-city\n\n\n",
        encoding="utf-8",
    )
    sentences, width = read_conll_columns(path)
    assert width == 2
    assert [[r[0] for r in s.rows] for s in sentences] == [
        ["@ann", "loves", "#pizza"],
        ["New", "York"],
    ]
    assert [s.lines for s in sentences] == [[3, 4, 5], [7, 8]]
    ragged = tmp_path / "ragged.txt"
    ragged.write_text("a B-X\nb I-X\nc\n")
    with pytest.raises(DataError, match=r"ragged.txt:3: 1 field, the file's lines have 2"):
        read_conll_columns(ragged)


def test_quotes_as_text_read_glue_s_tsv_whole():
    """MRPC's dev.tsv: the second sentence of line 2 opens a quote that a quote on line 3
    closes, which joins the two lines into one row of five fields (read without a word before:
    the error came at line 365, whose first sentence opens a quote its second closes). Read
    with quotes (the default) the error names line 2, the column and `--quoting none`; with
    `quoting="none"` every one of the 408 rows reads, the quotes kept as text. The flag
    reaches finetune and predict."""
    from bertkit.cli import build_parser

    from helpers import data_path

    path = data_path("glue", "MRPC", "dev.tsv")
    needed = ["Quality", "#1 String", "#2 String"]
    with pytest.raises(DataError, match=r"dev.tsv:2: column '#2 String': a quoted cell holding "
                                        r"line breaks and tabs joins lines 2-3 .*--quoting none"):  # fmt: skip
        list(read_rows(path, needed, FileConfig()))
    rows = list(read_rows(path, needed, FileConfig(quoting="none")))
    assert len(rows) == 408 and rows[363].line == 365
    assert rows[363].values["#1 String"].startswith('"The government elements')
    assert rows[363].values["#2 String"].endswith('they are attacking us."')
    parser = build_parser()
    for command in ("finetune", "predict", "embed"):
        for action in parser._subparsers._group_actions[0].choices[command]._actions:
            if "--quoting" in action.option_strings:
                assert action.choices == ("minimal", "none"), command
                break
        else:
            raise AssertionError(f"{command} has no --quoting")
    with pytest.raises(ValueError, match="quoting"):
        FileConfig(quoting="all")


def test_one_expander_of_inputs(tmp_path):
    """`expand_paths`, what every command's inputs go through (corpus jobs, prepare,
    pre-training): paths as given, globs sorted, a folder's files sorted and recursively (dot
    files left out), a datasets folder (its state.json) as one source, each file once; a
    pattern that names nothing is named."""
    from bertkit.jobs.inputs import expand
    from bertkit.rows import expand_paths

    (tmp_path / "docs" / "sub").mkdir(parents=True)
    for name in ("docs/b.jsonl", "docs/a.jsonl", "docs/sub/c.jsonl", "docs/.hidden", "x.csv"):
        (tmp_path / name).write_text('{"text": "t"}\n')
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "state.json").write_text("{}")
    found = expand_paths([tmp_path / "x.csv", tmp_path / "docs", str(tmp_path / "docs/*.jsonl"),
                          tmp_path / "ds"])  # fmt: skip
    assert [p.relative_to(tmp_path).as_posix() for p in found] == [
        "x.csv", "docs/a.jsonl", "docs/b.jsonl", "docs/sub/c.jsonl", "ds"]  # fmt: skip
    assert [s.format for s in expand([tmp_path / "docs", tmp_path / "ds"])] == [
        "jsonl", "jsonl", "jsonl", "arrow"]  # fmt: skip
    with pytest.raises(FileNotFoundError, match=r"nope/\*.jsonl: no such file \(the glob"):
        expand_paths([str(tmp_path / "nope/*.jsonl")])


# --------------------------------------------------------------------------- one reader
TABLE = [{"text": f"row {i}" + (",\n with a comma" if i == 3 else ""), "label": f"l{i % 3}"}
         for i in range(9)]  # fmt: skip


def every_format(tmp_path):
    """The same nine rows as CSV, TSV, JSON Lines, JSON, Parquet (row groups of 2), a datasets
    folder, and compressed CSV, TSV and JSON Lines."""
    import bz2
    import gzip
    import lzma

    import pyarrow as pa
    import pyarrow.parquet as pq

    write = {"csv": ",", "tsv": "\t"}
    files = {}
    for kind, delimiter in write.items():
        path = tmp_path / f"t.{kind}"
        with open(path, "w", newline="") as handle:
            writer = csv.writer(handle, delimiter=delimiter, lineterminator="\n")
            writer.writerow(["text", "label"])
            writer.writerows([r["text"], r["label"]] for r in TABLE)
        files[kind] = path
    lines = "".join(json.dumps(r) + "\n" + ("\n" if i == 4 else "") for i, r in enumerate(TABLE))
    files["jsonl"] = tmp_path / "t.jsonl"
    files["jsonl"].write_text(lines)
    files["json"] = tmp_path / "t.json"
    files["json"].write_text(json.dumps(TABLE, indent=1))
    files["parquet"] = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist(TABLE), files["parquet"], row_group_size=2)
    for name, compress, source in (("csv.gz", gzip.compress, "csv"), ("tsv.bz2", bz2.compress,
                                   "tsv"), ("jsonl.xz", lzma.compress, "jsonl")):  # fmt: skip
        files[name] = tmp_path / f"t.{name}"
        files[name].write_bytes(compress(files[source].read_bytes()))
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(TABLE).save_to_disk(str(tmp_path / "folder"))
    files["arrow"] = tmp_path / "folder"
    return files


def test_every_format_reads_the_same_rows_and_starts_again_at_any_of_them(tmp_path):
    """One reader: each format (compressed ones too) gives the same rows, each knows where it
    starts, and reading from any row gives exactly the rows a whole read gives from there;
    `row_starts` says the same starts without reading the rows' cells."""
    from bertkit.rows import Start, row_starts

    for name, path in every_format(tmp_path).items():
        whole = list(read_rows(path, ("text",), optional=("label",)))
        assert [r.values for r in whole] == TABLE, name
        assert [r.row_index for r in whole] == list(range(len(TABLE))), name
        if name.startswith(("csv", "tsv")):
            assert [r.line for r in whole][2:6] == [4, 5, 7, 8], name  # row 3 spans two lines
        if name.startswith("jsonl"):
            assert [r.line for r in whole][4:6] == [5, 7], name  # a blank line is no row
            assert all(r.offset is not None for r in whole), name
        starts = list(row_starts(path, ("text",)))
        assert starts == [Start(r.line, r.row_index, r.offset) for r in whole], name
        for start in starts:
            tail = list(read_rows(path, ("text",), optional=("label",), start=start))
            assert tail == whole[start.row_index :], (name, start)


def test_json_lines_start_at_their_offset_and_parquet_past_its_row_groups(tmp_path, monkeypatch):
    """Starting at a row does not read what comes before it: a JSON Lines file seeks to the
    row's byte offset (lines before it broken on purpose are never parsed), a Parquet file
    leaves out its row groups wholly before the row."""
    import pyarrow.parquet as pq

    files = every_format(tmp_path)
    path = files["jsonl"]
    start = list(read_rows(path, ("text",)))[6]
    raw = path.read_bytes()
    path.write_bytes(b"x" * (start.offset - 1) + raw[start.offset - 1 :])  # not JSON any more
    with pytest.raises(DataError, match=r"t.jsonl:1: not JSON"):
        list(read_rows(path, ("text",)))
    assert [r.values["text"] for r in read_rows(path, ("text",), start=start)] == [
        r["text"] for r in TABLE[6:]]  # fmt: skip
    asked = []
    real = pq.ParquetFile.iter_batches

    def spy(self, *args, **kwargs):
        asked.append(kwargs.get("row_groups"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    from bertkit.rows import Start

    tail = list(read_rows(files["parquet"], ("text",), start=Start(row_index=5)))
    assert [r.values["text"] for r in tail] == [r["text"] for r in TABLE[5:]]
    assert [r.line for r in tail] == [6, 7, 8, 9]
    assert asked == [[2, 3, 4]]  # groups 0 and 1 (rows 0-3) never read


def test_rows_that_cannot_be_read_are_skipped_where_asked(tmp_path):
    """With `skip`, a line that is not JSON, a record without a needed column and a ragged CSV
    row are each handed over (naming the file and line) and left out; without it, the first
    one is raised."""
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "a"}\n{"text": \n{"other": 1}\n{"text": "d"}\n"bare"\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: not JSON"):
        list(read_rows(path, ("text",)))
    errors = []
    kept = list(read_rows(path, ("text",), skip=errors.append))
    assert [(r.line, r.values["text"]) for r in kept] == [(1, "a"), (4, "d")]
    assert [str(e).split(": ", 1)[0][-11:] for e in errors] == [
        "bad.jsonl:2", "bad.jsonl:3", "bad.jsonl:5"]  # fmt: skip
    assert [r.values for r in read_rows(path, (), optional=("text",), bare="text",
                                         skip=errors.append)][-1] == {"text": "bare"}  # fmt: skip
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("text,label\na,1\nb,2,3\nc,3\n")
    errors.clear()
    assert [r.values["text"] for r in read_rows(ragged, ("text",), skip=errors.append)] == [
        "a", "c"]  # fmt: skip
    assert "ragged.csv:3: 3 fields, the header has 2" in str(errors[0])


def test_one_format_detector(tmp_path):
    """The flag; else a Parquet or arrow file by its first bytes whatever its name; else the
    name under a compression's suffix; a .parquet that is not one is refused naming --format."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a"]}), tmp_path / "export.dat")
    assert file_format(tmp_path / "export.dat") == "parquet"
    assert [r.values for r in read_rows(tmp_path / "export.dat", ("text",))] == [{"text": "a"}]
    assert file_format(tmp_path / "news.TSV.gz") == "tsv"
    assert file_format(tmp_path / "c4.json.zst") == "json"
    assert file_format(tmp_path / "export.dat", "csv") == "csv"
    (tmp_path / "fake.parquet").write_bytes(gzip.compress(b'{"text": "a"}\n'))
    with pytest.raises(DataError, match=r"fake.parquet: named .parquet but not parquet .*--format"):
        file_format(tmp_path / "fake.parquet")
