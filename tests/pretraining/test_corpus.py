"""Corpus readers (bertkit.pretraining.corpus): formats and errors."""

import json

import pytest

from bertkit.pretraining.corpus import CorpusStats, read_documents


# ----------------------------------------------------------------------------- corpus & shards
def test_corpus_formats(tmp_path):
    (tmp_path / "google.txt").write_text("First sentence.\nSecond one.\n\nOther doc.\n")
    docs = list(read_documents([tmp_path / "google.txt"], format="google"))
    assert docs == [["First sentence.", "Second one."], ["Other doc."]]
    (tmp_path / "wiki").write_text(
        '<doc id="1" url="u" title="Alpha">\nAlpha\n\nAlpha is a letter. It comes first.\n</doc>\n'
        '<doc id="2" url="u" title="Empty">\nEmpty\n</doc>\n'
    )
    stats = CorpusStats()
    assert list(read_documents([tmp_path / "wiki"], stats=stats)) == [
        ["Alpha is a letter.", "It comes first."]
    ]
    assert stats.empty_documents == 1
    (tmp_path / "plain.txt").write_text("One para. Two sentences.\n\nNext document here.\n")
    assert list(read_documents([tmp_path / "plain.txt"])) == [
        ["One para.", "Two sentences."],
        ["Next document here."],
    ]
    assert list(read_documents([tmp_path / "plain.txt"], format="text-file")) == [
        ["One para.", "Two sentences.", "Next document here."]
    ]
    (tmp_path / "d.jsonl").write_text(
        json.dumps({"text": "The sky is blue. Grass is green.\nWater is wet."}) + "\n"
    )
    assert list(read_documents([tmp_path / "d.jsonl"])) == [
        ["The sky is blue.", "Grass is green.", "Water is wet."]
    ]


def test_bad_corpus_input_is_reported_with_file_line_and_offset(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"good line.\nbad \xff byte.\nfine.\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: not UTF-8 at byte offset 15"):
        list(read_documents([bad]))
    stats = CorpusStats()
    assert list(read_documents([bad], on_error="skip", stats=stats)) == [["good line.", "fine."]]
    assert stats.bad_lines == 1 and "byte offset 15" in stats.problems[0]
    (tmp_path / "x.jsonl").write_text('{"text": "ok."}\n{"title": "no text"}\n{"text": 3}\n'
                                      '{"text": "fine."}\n')  # fmt: skip
    with pytest.raises(ValueError, match=r"x.jsonl:2: no column 'text'"):
        list(read_documents([tmp_path / "x.jsonl"]))
    stats = CorpusStats()
    assert list(read_documents([tmp_path / "x.jsonl"], on_error="skip", stats=stats)) == [
        ["ok."], ["fine."]]  # fmt: skip
    assert (
        stats.bad_lines == 2 and "x.jsonl:3: column 'text' is int, not a text" in stats.problems[1]
    )
    (tmp_path / "w").write_text('<doc id="1" url="u" title="T">\nT\ntext.\n')
    with pytest.raises(ValueError, match="has no closing </doc>"):
        list(read_documents([tmp_path / "w"]))
    with pytest.raises(FileNotFoundError, match="missing.txt: no such corpus file"):
        list(read_documents([tmp_path / "missing.txt"]))


def test_corpora_as_published_make_the_shards_plain_json_lines_make(tmp_path):
    """The same documents as JSON Lines compressed with gzip, zstd, bz2 and xz (C4, Dolma, the
    Pile), as Parquet with its text in a column named otherwise (found: the only string
    column), as a datasets folder, and as CSV and gzipped TSV (the one reader of rows):
    `prepare` makes the very shard bytes plain JSON Lines make, and `vocab` reads them too."""
    import bz2
    import gzip
    import lzma
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    from bertkit import cli
    from bertkit.pretraining.shards import prepare_shards

    from helpers import synthetic_tokenizer

    rng = random.Random(0)
    texts = []
    for _ in range(60):
        paragraphs = [" ".join(f"w{rng.randrange(400)}" for _ in range(rng.randint(3, 12))) + "."
                      for _ in range(rng.randint(1, 4))]  # fmt: skip
        texts.append("\n\n".join(paragraphs) if rng.random() < 0.5 else "\n".join(paragraphs))
    texts[5] = ""  # an empty document: skipped and counted alike
    plain = "".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(texts)).encode()
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "c.jsonl").write_bytes(plain)
    (corpus / "c.json.gz").write_bytes(gzip.compress(plain))
    (corpus / "c.jsonl.bz2").write_bytes(bz2.compress(plain))
    (corpus / "c.jsonl.xz").write_bytes(lzma.compress(plain))
    zstandard = pytest.importorskip("zstandard")
    (corpus / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(plain))
    pq.write_table(pa.table({"content": texts, "n": list(range(len(texts)))}),
                   corpus / "c.parquet", row_group_size=16)  # fmt: skip
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(corpus / "folder"))
    import csv
    import io

    for name, delimiter in (("c.csv", ","), ("c.tsv", "\t")):
        table = io.StringIO()
        writer = csv.writer(table, delimiter=delimiter, lineterminator="\n")
        writer.writerows([["id", "text"]] + [[i, t] for i, t in enumerate(texts)])
        data = table.getvalue().encode()
        if name == "c.tsv":
            name, data = "c.tsv.gz", gzip.compress(data)
        (corpus / name).write_bytes(data)
    tokenizer = synthetic_tokenizer()

    def shard_bytes(source):
        out = tmp_path / f"shards-{source.name}"
        meta = prepare_shards([source], tokenizer, out, workers=1, progress=False)
        assert meta["skipped"]["empty_documents"] == 1, source
        return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != "meta.json"}

    expected = shard_bytes(corpus / "c.jsonl")
    assert len(expected) >= 3
    for name in ("c.json.gz", "c.jsonl.bz2", "c.jsonl.xz", "c.jsonl.zst", "c.parquet", "folder",
                 "c.csv", "c.tsv.gz"):  # fmt: skip
        assert shard_bytes(corpus / name) == expected, name
    assert cli.main(["vocab", str(corpus / "c.parquet"), "--size", "120", "--out",
                     str(tmp_path / "vocab")]) == 0  # fmt: skip


def test_a_file_that_is_not_what_it_claims_is_named_with_the_flag(tmp_path):
    """A binary file read as text, a .parquet that is not Parquet, a table without a text
    column: each said with what it is and what to pass (it was "not UTF-8 at byte offset 1")."""
    import gzip

    from bertkit.pretraining.corpus import raw_documents

    (tmp_path / "corpus.bin").write_bytes(bytes(range(256)) * 4)
    with pytest.raises(
        ValueError, match=r"corpus.bin: not text .*JSON Lines .*gzip, zstd.*--format"
    ):
        list(raw_documents([tmp_path / "corpus.bin"]))
    (tmp_path / "corpus.parquet").write_bytes(gzip.compress(b'{"text": "a"}\n'))
    with pytest.raises(ValueError, match=r"corpus.parquet: named .parquet but not parquet"):
        list(raw_documents([tmp_path / "corpus.parquet"]))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"a": ["x"], "b": ["y"]}), tmp_path / "two.parquet")
    with pytest.raises(ValueError, match=r"which column holds the text\? .*--text-column"):
        list(raw_documents([tmp_path / "two.parquet"]))
    assert list(raw_documents([tmp_path / "two.parquet"], text_column="b")) == [(["y"], True)]
    book = "A line of a long book.\n" * 60_000  # 1.4M characters: a document, not a bad cell
    (tmp_path / "books.jsonl").write_text(json.dumps({"text": book}) + "\n")
    (tmp_path / "books.csv").write_text('text\n"' + book + '"\n')
    for name in ("books.jsonl", "books.csv"):
        assert [len(u) for u, _ in raw_documents([tmp_path / name])] == [60_000], name
