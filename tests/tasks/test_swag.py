"""SWAG reader (bertkit.tasks.swag)."""

from __future__ import annotations

import pytest

from bertkit.tasks import DataError, get_task

from helpers import FIXTURES


def test_swag_reader_and_errors(tmp_path):
    task = get_task("swag")
    train = task.read(FIXTURES / "swag", "train")
    assert [e.label for e in train] == [0, 1, 2, 3] and len(train[0].endings) == 4
    assert task.read(FIXTURES / "swag", "test")[0].label is None
    text = (FIXTURES / "swag" / "train.csv").read_text().replace(",3\n", ",7\n")
    (tmp_path / "train.csv").write_text(text)
    with pytest.raises(DataError, match=r"train.csv:5: label 7 is not 0-3"):
        task.read(tmp_path, "train")
