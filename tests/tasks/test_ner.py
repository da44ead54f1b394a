"""CoNLL-2003 readers and tag schemes (bertkit.tasks.ner)."""

from __future__ import annotations

import pytest

from bertkit.rows import FileConfig
from bertkit.tasks import DataError, get_task

from helpers import FIXTURES, data_path


def test_conll_reads_iob2_shared_and_iob1_fixture():
    task = get_task("conll2003")
    train = task.read(data_path("conll2003"), "train")
    assert len(train) == 14041 and sum(len(s.words) for s in train) == 203621
    iob1 = task.read(FIXTURES / "conll2003_iob1", "train")
    from bertkit.tasks.ner import to_iob2

    assert to_iob2(iob1[0].tags) == ["B-ORG", "O", "B-MISC", "O", "O", "O", "B-MISC", "O", "O"]
    assert to_iob2(iob1[2].tags)[1:3] == ["B-LOC", "B-LOC"]  # "Brussels Paris": two entities


def test_conll_errors(tmp_path):
    (tmp_path / "train.txt").write_text("EU NNP I-NP B-ORG\nrejects VBZ I-VP B-FOO\n")
    with pytest.raises(DataError, match=r"train.txt:2: tag 'B-FOO'"):
        get_task("conll2003").read(tmp_path, "train")
    (tmp_path / "train.txt").write_text("EU NNP I-NP B-ORG\nrejects O\n")
    with pytest.raises(DataError, match=r"train.txt:2: 2 columns, the file's lines have 4"):
        get_task("conll2003").read(tmp_path, "train")


def test_conll_pos_and_chunk_columns_and_their_metrics_against_seqeval():
    from seqeval.metrics import accuracy_score, f1_score

    pos, chunk = get_task("conll2003-pos"), get_task("conll2003-chunk")
    sentences = pos.read(FIXTURES / "conll2003_iob1", "dev")
    assert sentences[0].words[:3] == ("EU", "rejects", "German")
    assert sentences[0].tags[:3] == ("NNP", "VBZ", "JJ")
    assert sentences[0].columns[0] == ("I-NP", "I-ORG")  # the other columns, for writing back
    chunks = chunk.read(FIXTURES / "conll2003_iob1", "dev")
    assert chunks[0].tags[:3] == ("I-NP", "I-VP", "I-NP")  # IOB1 as in the file
    assert {"B-NP", "I-VP", "O"} <= set(chunk.labels()) and "NN|SYM" in pos.labels()
    import numpy as np

    rng = np.random.default_rng(0)

    def noisy(tags, labels):  # a prediction: each tag kept with probability 0.7
        return [t if rng.random() < 0.7 else labels[rng.integers(len(labels))] for t in tags]

    guessed = [noisy(s.tags, pos.labels()) for s in sentences]
    gold = [list(s.tags) for s in sentences]
    assert pos.score(sentences, guessed)["accuracy"] == pytest.approx(accuracy_score(gold, guessed))
    from bertkit.tasks.ner import to_iob2

    guessed = [to_iob2(noisy(s.tags, chunk.labels())) for s in chunks]
    gold = [to_iob2(s.tags) for s in chunks]
    assert chunk.score(chunks, guessed)["f1"] == pytest.approx(f1_score(gold, guessed), abs=1e-9)
    from bertkit.tasks.ner import ConllTask

    with pytest.raises(ValueError, match="columns are ner, pos and chunk"):
        ConllTask("lemma")


def test_a_conll_file_to_predict_gives_each_task_its_column():
    """`predict --input` on CoNLL-2003's layout: the words and the task's own gold column
    (NER last, POS second, chunks third), as the task's `read` takes them."""
    path = FIXTURES / "conll2003_iob1" / "valid.txt"
    for name in ("conll2003", "conll2003-pos", "conll2003-chunk"):
        task = get_task(name)
        rows = list(task.conll_rows(path, FileConfig()))
        read = task.read(FIXTURES / "conll2003_iob1", "dev")
        assert [v["words"] for _, v in rows] == [list(s.words) for s in read]
        assert [v["tags"] for _, v in rows] == [list(s.tags) for s in read]
    # a word and one tag a line: NER's; the other columns are not in such a file
    assert get_task("conll2003").conll_columns(path, [], 2, FileConfig()) == (0, 1)
    assert get_task("conll2003-pos").conll_columns(path, [], 2, FileConfig()) == (0, None)
