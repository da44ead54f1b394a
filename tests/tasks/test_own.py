"""Your own data from the command line (`bertkit finetune text-classification ...`): the flags,
the summary printed, and each bad input as one clear line naming file, line and column, with
nothing written."""

from __future__ import annotations

import csv
import json

import pytest

from bertkit.cli import main
from bertkit.tasks.own import DataConfig

from helpers import topic_rows

QUICK_FLAGS = ["--epochs", "1", "--batch-size", "8", "--max-seq-length", "64"]


def write(path, rows, columns=("id", "headline", "topic")):
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        writer.writerows([[r.get(c, "") for c in columns] for r in rows])
    return path


def command(model, train, dev, out, *extra):
    return ["finetune", "text-classification", "--model", str(model), "--train", str(train),
            "--validation", str(dev), "--text-column", "headline", "--label-column", "topic",
            "--out", str(out), *QUICK_FLAGS, *extra]  # fmt: skip


def test_the_command_prints_what_it_read(words_model, tmp_path, capsys):
    rows = topic_rows(40)
    rows[0]["headline"] = " ".join(["goal"] * 100)  # over 64 pieces: cut, and said so
    train, dev = write(tmp_path / "train.csv", rows), write(tmp_path / "dev.csv", topic_rows(16, 1))
    assert main(command(words_model, train, dev, tmp_path / "run")) == 0
    captured = capsys.readouterr()
    assert "text-classification: train " in captured.err
    assert "single-label (the labels are words)" in captured.err
    assert "3 labels: business " in captured.err
    assert "1 of 40 examples longer than 64 pieces were cut by 38 pieces" in captured.err
    assert '"accuracy"' in captured.out
    table = captured.out.split("validation:\n", 1)[1].splitlines()
    assert table[0].split() == ["label", "precision", "recall", "f1", "support"]
    assert sorted(line.split()[0] for line in table[1:4]) == ["business", "sports", "tech"]
    # the paper's tasks keep --data; the generic ones refuse it, and the other way round
    assert main(["finetune", "mrpc", "--model", str(words_model), "--train", str(train),
                 "--data", str(tmp_path), "--out", str(tmp_path / "x")]) == 2  # fmt: skip
    assert "--train: for your own data" in capsys.readouterr().err
    assert main(command(words_model, train, dev, tmp_path / "y", "--data", str(tmp_path))) == 2
    assert "not --data DIR" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing column", r"dev.csv:1: no column 'topic'.*'id', 'headline', 'label'"),
        (
            "unseen label",
            r"dev.csv:5: column 'topic': label 'weather' never occurs in the training",
        ),
        ("empty text", r"train.csv:4: column 'headline': an empty text"),
        ("ragged row", r"train.csv:6: 4 fields, the header has 3"),
        ("not utf-8", r"train.csv:3: not utf-8 .*--encoding cp1252"),
        (
            "mixed kinds",
            r"train.csv: column 'topic': the label column mixes words and numbers "
            r"\(int on line 7, text on line 2\)",
        ),
        ("huge cell", r"train.csv:5: column 'headline': a cell of 10,485,760 characters"),
    ],
)
def test_bad_input_is_one_clear_line_and_writes_nothing(
    case, expected, words_model, tmp_path, capsys
):
    train_rows, dev_rows = topic_rows(24), topic_rows(8, 1)
    columns = ("id", "headline", "topic")
    dev_columns = columns
    if case == "missing column":
        dev_columns = ("id", "headline", "label")
        for r in dev_rows:
            r["label"] = r["topic"]
    elif case == "unseen label":
        dev_rows[3]["topic"] = "weather"
    elif case == "empty text":
        train_rows[2]["headline"] = "  "
    elif case == "mixed kinds":
        train_rows[5]["topic"] = "3"
    train = write(tmp_path / "train.csv", train_rows, columns)
    dev = write(tmp_path / "dev.csv", dev_rows, dev_columns)
    if case == "ragged row":
        lines = train.read_text().splitlines()
        lines[5] += ",extra"
        train.write_text("\n".join(lines) + "\n")
    elif case == "not utf-8":
        lines = train.read_bytes().split(b"\n")
        lines[2] = lines[2].replace(b",", b" caf\xe9,", 1)
        train.write_bytes(b"\n".join(lines))
    elif case == "huge cell":
        lines = train.read_text().splitlines()
        lines[4] = '4,"' + "x" * (10 * 2**20) + '",sports'
        train.write_text("\n".join(lines) + "\n")
    out = tmp_path / "run"
    assert main(command(words_model, train, dev, out)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    assert __import__("re").search(expected, err[0]), err[0]
    assert not out.exists()


def test_one_example_in_a_class_is_a_warning(words_model, tmp_path, caplog):
    rows = topic_rows(24)
    rows[6]["topic"] = "weather"
    train, dev = write(tmp_path / "train.csv", rows), write(tmp_path / "dev.csv", topic_rows(8, 1))
    assert main(command(words_model, train, dev, tmp_path / "run")) == 0
    assert "train.csv:8: label 'weather' has a single training example" in caplog.text


def test_data_config_checks_its_fields():
    with pytest.raises(ValueError, match="format 'xlsx' is not one of"):
        DataConfig(format="xlsx")
    with pytest.raises(ValueError, match="unknown encoding 'klingon'"):
        DataConfig(encoding="klingon")
    with pytest.raises(ValueError, match="delimiter must be one character"):
        DataConfig(delimiter=";;")
    assert DataConfig(train="a.csv", text_column="t").given() == {
        "train": "a.csv",
        "text_column": "t",
    }


def test_resume_and_a_finished_run(words_model, tmp_path):
    """A killed run of your own data resumes; a finished one is not trained again."""
    train, dev = (
        write(tmp_path / "train.csv", topic_rows(24)),
        write(tmp_path / "dev.csv", topic_rows(8, 1)),
    )
    out = tmp_path / "run"
    assert main(command(words_model, train, dev, out)) == 0
    first = json.loads((out / "results.json").read_text())
    assert main(command(words_model, train, dev, out, "--resume")) == 0
    assert json.loads((out / "results.json").read_text()) == first
    assert main(command(words_model, train, dev, out)) == 2  # not empty, no --resume/--overwrite
