"""What every task reader shares (bertkit.tasks.base): bad bytes named by file, line and offset."""

from __future__ import annotations

import json

import pytest

from bertkit.tasks import DataError, get_task


def test_input_file_edges_are_named_by_file_and_line(tmp_path):
    # non-UTF-8 bytes: file, line and byte offset, for every reader
    rte = tmp_path / "RTE"
    rte.mkdir()
    (rte / "train.tsv").write_bytes(
        b"index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\t\xff\tb\tentailment\n"
    )
    with pytest.raises(DataError, match=r"train.tsv:3: not UTF-8 \(byte offset"):
        get_task("rte").read(rte, "train")
    conll = tmp_path / "conll"
    conll.mkdir()
    (conll / "train.txt").write_bytes(b"EU NNP I-NP I-ORG\n\xfe x O O\n")
    with pytest.raises(DataError, match=r"train.txt:2: not UTF-8"):
        get_task("conll2003").read(conll, "train")
    # a byte-order mark before -DOCSTART- is not a sentence
    (conll / "train.txt").write_text(
        "\ufeff-DOCSTART- -X- -X- O\n\nEU NNP I-NP I-ORG\n", encoding="utf-8"
    )
    sentences = get_task("conll2003").read(conll, "train")
    assert [s.words for s in sentences] == [("EU",)]
    # SQuAD: articles and paragraphs that are not objects, a negative answer_start
    squad = tmp_path / "squad"
    squad.mkdir()
    for data, says in (
        ({"data": ["text"]}, r"data\[0\]: not an article object"),
        ({"data": [{"paragraphs": ["text"]}]}, r"paragraphs\[0\]: not an object"),
        (
            {"data": [{"paragraphs": [{"context": "Ann did it.", "qas": [
                {"id": "q", "question": "Who?", "answers": [{"text": "it.", "answer_start": -3}]}
            ]}]}]},
            "is not at character -3",
        ),
    ):  # fmt: skip
        (squad / "train-v1.1.json").write_text(json.dumps(data))
        with pytest.raises(DataError, match=says):
            get_task("squad1").read(squad, "train")


def test_finetune_batches_bucketed_or_random_cover_every_example_once_an_epoch():
    import numpy as np

    from bertkit.tasks.base import FinetuneData

    rng = np.random.default_rng(0)
    lengths = [int(n) for n in rng.integers(4, 128, size=800)]
    features = [{"input_ids": [1] * n} for n in lengths]

    def spread(bucket_batches: int) -> float:
        data = FinetuneData(features, 16, lambda rows: rows, seed=3, bucket_batches=bucket_batches)
        plan = data.plan(0)
        assert sorted(np.concatenate(plan).tolist()) == list(range(800))  # each once
        assert [len(b) for b in plan] == [16] * 50
        assert not np.array_equal(np.concatenate(plan), np.concatenate(data.plan(1)))
        return float(np.mean([np.ptp([lengths[i] for i in b]) for b in plan]))

    # sorted together, a batch's lengths lie close (little padding); random: the whole range
    assert spread(50) < 5 < 80 < spread(1)


def test_what_finetune_asks_of_a_task_is_the_tasks_to_answer():
    """The task seam: heads, the model's config, where data comes from, what results.json says
    was read: methods of Task, so finetune.py holds no check of a task's kind."""
    from bertkit.core.config import BertConfig
    from bertkit.core.heads import MODEL_CLASSES
    from bertkit.tasks.own import DataConfig

    for name in ("conll2003", "squad1", "token-classification", "question-answering"):
        task = get_task(name)
        assert task.head_class(bilstm=True) in MODEL_CLASSES
        assert task.head_class(bilstm=True) != task.head_class()
    for name in ("mrpc", "swag", "text-classification"):
        assert get_task(name).head_class() in MODEL_CLASSES
        with pytest.raises(ValueError, match="--bilstm is for span and tagging tasks"):
            get_task(name).head_class(bilstm=True)
    config = BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2)
    stsb = get_task("stsb").model_config(config)
    assert stsb.num_labels == 1 and stsb.problem_type == get_task("stsb").problem_type
    assert get_task("mnli").model_config(config).num_labels == 3
    # the paper's tasks read a folder; your own data reads its DataConfig's files
    assert get_task("mrpc").source("glue/MRPC") == "glue/MRPC"
    with pytest.raises(ValueError, match="--data DIR"):
        get_task("mrpc").source(DataConfig(train="a.csv"))
    own = get_task("text-classification", DataConfig(train="a.csv", validation="b.csv"))
    assert own.source(None) is None
    with pytest.raises(
        ValueError, match="reads your files: --train FILE --validation FILE.*not --data DIR"
    ):
        own.source("glue/MRPC")
    assert own.data_description(None) == {"train": "a.csv", "validation": "b.csv"}
    assert get_task("mrpc").data_description("glue/MRPC") == "glue/MRPC"
