"""`Task.file_rows`: a file in a paper task's own layout (GLUE's TSV, SQuAD's JSON, SWAG's CSV)
read as the rows `predict --input` answers, with the file's gold answers beside them; any other
file is not the task's (None: read as a table of columns)."""

from __future__ import annotations

import json

from bertkit.rows import FileConfig
from bertkit.tasks import get_task
from bertkit.tasks.swag import read_swag

from helpers import FIXTURES


def _rows(task, path, kind):
    rows = task.file_rows(path, kind, FileConfig())
    return None if rows is None else list(rows)


def test_glue_files_in_their_layout():
    qnli = get_task("qnli")
    folder = FIXTURES / "glue" / "QNLI"
    for split, name in (("train", "train.tsv"), ("dev", "dev.tsv"), ("test", "test.tsv")):
        examples = qnli.read(folder, split)
        rows = _rows(qnli, folder / name, "tsv")
        assert [v["text"] for _, v in rows] == [e.text_a for e in examples]
        assert [v["text_pair"] for _, v in rows] == [e.text_b for e in examples]
        assert [v.get("label") for _, v in rows] == [e.label for e in examples]
        assert [v.get("index") for _, v in rows] == [e.index for e in examples]
        assert [str(line) for line, _ in rows] == [e.guid.split(":")[1] for e in examples]
    mnli = get_task("mnli")  # dev_matched: 16 columns, the gold label last
    rows = _rows(mnli, FIXTURES / "glue" / "MNLI" / "dev_matched.tsv", "tsv")
    assert [v["label"] for _, v in rows] == [
        e.label for e in mnli.read(FIXTURES / "glue" / "MNLI", "dev")
    ]
    # another task's file, or not a TSV: not this task's layout
    assert _rows(qnli, FIXTURES / "glue" / "QQP" / "dev.tsv", "tsv") is None
    assert _rows(qnli, folder / "dev.tsv", "csv") is None


def test_cola_rows_have_no_header(tmp_path):
    cola = get_task("cola")
    path = tmp_path / "in_domain_dev.tsv"
    path.write_text("gj04\t1\t\tThe sailors rode the breeze.\ngj04\t0\t*\tThe sailors rode.\n")
    rows = _rows(cola, path, "tsv")
    assert rows == [(1, {"text": "The sailors rode the breeze.", "label": "1"}),
                    (2, {"text": "The sailors rode.", "label": "0"})]  # fmt: skip
    path.write_text("a\tb\tc\td\n")  # four columns, but no label where CoLA has it
    assert _rows(cola, path, "tsv") is None


def test_squad_json(tmp_path):
    squad = get_task("squad2")
    context = "Ann lives in Rome."
    data = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": [
        {"id": "a", "question": "Where does Ann live?",
         "answers": [{"text": "Rome", "answer_start": 13}]},
        {"id": "b", "question": "Where does Bob live?", "answers": [], "is_impossible": True},
        {"id": "c", "question": "Who lives in Rome?", "answers": []},
    ]}]}]}  # fmt: skip
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(data))
    rows = _rows(squad, path, "json")
    assert [line for line, _ in rows] == [1, 2, 3]
    assert [v["id"] for _, v in rows] == ["a", "b", "c"]
    assert [v.get("answers") for _, v in rows] == [["Rome"], [], None]  # c: no gold given
    assert all(v["context"] == context for _, v in rows)
    path.write_text(json.dumps([{"question": "q", "context": context}]))
    assert _rows(squad, path, "json") is None


def test_swag_csv(tmp_path):
    swag = get_task("swag")
    path = FIXTURES / "swag" / "val.csv"
    rows = _rows(swag, path, "csv")
    examples = read_swag(path)
    assert [v["context"] for _, v in rows] == [e.context for e in examples]
    assert [v["endings"] for _, v in rows] == [list(e.endings) for e in examples]
    assert [v["label"] for _, v in rows] == [e.label for e in examples]
    other = tmp_path / "other.csv"
    other.write_text("context,choices\nx,y\n")
    assert _rows(swag, other, "csv") is None
