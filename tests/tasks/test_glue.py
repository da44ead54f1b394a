"""GLUE readers (bertkit.tasks.glue): shared files, fixtures, errors by file and line."""

from __future__ import annotations

import pytest

from bertkit.tasks import DataError, get_task
from bertkit.tasks.glue import GLUE

from helpers import FIXTURES, data_path


# --------------------------------------------------------------------------- readers
@pytest.mark.parametrize(
    "task, folder, rows, first",
    [
        (
            "cola",
            "CoLA",
            8551,
            ("Our friends won't buy this analysis, let alone the next one we propose.", None, "1"),
        ),
        ("sst2", "SST-2", 67349, None),
        ("mrpc", "MRPC", 3668, None),
        ("stsb", "STS-B", 5749, None),
        ("rte", "RTE", 2490, None),
        ("wnli", "WNLI", 635, None),
    ],
)
def test_glue_readers_on_the_shared_files(task, folder, rows, first):
    directory = data_path("glue", folder)
    examples = get_task(task).read(directory, "train")
    assert len(examples) == rows  # the counts SOURCES.md gives
    if first:
        assert (examples[0].text_a, examples[0].text_b, examples[0].label) == first
    dev = get_task(task).read(directory, "dev")
    assert all(e.label is not None for e in dev)
    if (directory / "test.tsv").exists():
        test = get_task(task).read(directory, "test")
        assert all(e.label is None and e.index is not None for e in test)


def test_mrpc_header_with_bom_and_quotes_kept():
    examples = get_task("mrpc").read(data_path("glue", "MRPC"), "dev")
    assert len(examples) == 408
    assert sum(e.label == "1" for e in examples) == 279
    # the second sentence of the first row starts with a bare quote: no CSV unquoting
    assert examples[0].text_b.startswith('"The foodservice pie business')


@pytest.mark.parametrize("task", ["mnli", "qqp", "qnli"])
def test_glue_readers_on_fixtures(task):
    task_obj = get_task(task)
    directory = FIXTURES / "glue" / GLUE[task].folder
    train = task_obj.read(directory, "train")
    assert len(train) == 6 and all(e.text_b for e in train)
    assert {e.label for e in train} <= set(task_obj.labels())
    for split in task_obj.dev_splits():
        assert len(task_obj.read(directory, split)) == 6
    tests = ["test", "test_mismatched"] if task == "mnli" else ["test"]
    for split in tests:
        rows = task_obj.read(directory, split)
        assert [e.index for e in rows] == [str(i) for i in range(6)]
        assert rows[0].label is None


def test_glue_errors_name_file_and_line(tmp_path):
    rte = tmp_path / "RTE"
    rte.mkdir()
    (rte / "train.tsv").write_text(
        "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\ta\tb\tmaybe\n"
    )
    with pytest.raises(DataError, match=r"train.tsv:3: label 'maybe' is not one of"):
        get_task("rte").read(rte, "train")
    kept = get_task("rte").read(rte, "train", on_error="skip")  # the bad row left out, logged
    assert [e.label for e in kept] == ["entailment"]
    with pytest.raises(ValueError, match="on_error must be 'fail' or 'skip'"):
        get_task("rte").read(rte, "train", on_error="raise")
    (rte / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\tonly two\n")
    with pytest.raises(DataError, match=r"train.tsv:2: 2 tab-separated columns, expected 4"):
        get_task("rte").read(rte, "train")
    (rte / "train.tsv").write_text("sentence\tlabel\nfine\t1\n")  # an SST-2 file in RTE's place
    with pytest.raises(DataError, match=r"train.tsv:1: header starts"):
        get_task("rte").read(rte, "train")
    (rte / "dev.tsv").write_text("index\tsentence1\tsentence2\tlabel\n")
    with pytest.raises(DataError, match="no examples"):
        get_task("rte").read(rte, "dev")
    with pytest.raises(FileNotFoundError, match="test.tsv"):
        get_task("rte").read(rte, "test")
    sts = tmp_path / "STS"
    sts.mkdir()
    head = (
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    )
    (sts / "train.tsv").write_text(head + "0\tg\tf\ty\t0\tn\tn\ta\tb\t7.5\n")
    with pytest.raises(DataError, match=r"train.tsv:2: score 7.5 is outside 0-5"):
        get_task("stsb").read(sts, "train")


def test_a_tab_inside_a_sentence_is_named_not_cut(tmp_path):
    mrpc = tmp_path / "MRPC"
    mrpc.mkdir()
    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    (mrpc / "train.tsv").write_text(header + "1\t1\t2\tA cat.\tA cat\tsat.\n")
    with pytest.raises(
        DataError, match=r"train.tsv:2: 6 tab-separated columns, the file's rows have 5"
    ):
        get_task("mrpc").read(mrpc, "train")
