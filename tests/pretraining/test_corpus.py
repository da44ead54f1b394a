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
    (tmp_path / "x.jsonl").write_text('{"text": "ok."}\n{"title": "no text"}\n')
    with pytest.raises(ValueError, match=r'x.jsonl:2: not a JSON object with a "text" string'):
        list(read_documents([tmp_path / "x.jsonl"]))
    (tmp_path / "w").write_text('<doc id="1" url="u" title="T">\nT\ntext.\n')
    with pytest.raises(ValueError, match="has no closing </doc>"):
        list(read_documents([tmp_path / "w"]))
    with pytest.raises(FileNotFoundError, match="corpus file not found"):
        list(read_documents([tmp_path / "missing.txt"]))
