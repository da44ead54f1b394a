"""SQuAD readers and windows (bertkit.tasks.squad)."""

from __future__ import annotations

import json

import pytest

from bertkit.core.tokenizer import train_vocab
from bertkit.tasks import DataError
from bertkit.tasks.squad import read_squad, split_by_article

from helpers import data_path


def test_squad_reader_and_errors(tmp_path):
    examples = read_squad(data_path("squad", "dev-v1.1.json"))
    assert len(examples) == 10570
    train, dev = split_by_article(data_path("squad", "dev-v1.1.json"), tmp_path / "split")
    a, b = read_squad(train), read_squad(dev)
    assert len(a) + len(b) == 10570 and not {e.title for e in a} & {e.title for e in b}
    bad = tmp_path / "bad.json"
    bad.write_text('{"data": [')
    with pytest.raises(DataError, match=r"bad.json:1: not valid JSON"):
        read_squad(bad)
    bad.write_text(
        json.dumps(
            {
                "data": [
                    {
                        "paragraphs": [
                            {
                                "context": "Paris is big.",
                                "qas": [
                                    {
                                        "id": "q",
                                        "question": "?",
                                        "answers": [{"text": "Rome", "answer_start": 0}],
                                    }
                                ],
                            }
                        ]
                    }
                ]
            }
        )
    )
    with pytest.raises(DataError, match=r"'Rome' is not at character 0"):
        read_squad(bad)


def test_squad_windows_keep_every_answer_reachable():
    from bertkit.tasks.squad import SquadExample, SquadTask, _windows

    assert _windows(10, 4, 3) == [(0, 4), (3, 4), (6, 4)]
    assert _windows(3, 4, 2) == [(0, 3)]
    task = SquadTask(1)
    words = [f"w{i}" for i in range(300)]
    context = " ".join(words)
    start = context.index("w250")
    example = SquadExample("q", "where is it?", context, (("w250 w251", start),))
    tok = train_vocab(
        texts=[context, "where is it?"], vocab_size=400, min_frequency=1, show_progress=False
    )
    features = task.featurize([example], tok, 64)
    assert len(features) > 1
    labelled = [f for f in features if f["start_positions"] > 0]
    assert labelled  # some window holds the answer
    for f in labelled:
        offsets = f["_offsets"]
        s = f["start_positions"] - f["_context_start"]
        e = f["end_positions"] - f["_context_start"]
        assert context[offsets[s][0] : offsets[e][1]] == "w250 w251"
    # every context piece has exactly one window where it has the most context
    counts = {}
    for f in features:
        for i, is_max in enumerate(f["_max_context"]):
            counts[f["_window_start"] + i] = counts.get(f["_window_start"] + i, 0) + is_max
    assert set(counts.values()) == {1}


def _squad(*questions, context="Ann did it."):
    return {"data": [{"paragraphs": [{"context": context, "qas": list(questions)}]}]}


QA = {"id": "q1", "question": "Who?", "answers": [{"text": "Ann", "answer_start": 0}]}


@pytest.mark.parametrize(
    "data, says",
    [  # doubtful inputs once taken silently, and faults once told in Python's words
        (_squad(QA, dict(QA, question="What?")), r"qas\[1\]: id 'q1' is also the id of "
                                                 r"data\[0\]\.paragraphs\[0\]\.qas\[0\]"),
        (_squad(dict(QA, question="  ")), r"qas\[0\] \(q1\)\.question: empty"),
        (_squad(dict(QA, answers=[{"text": "", "answer_start": 0}])),
         r"answers\[0\]\.text: empty"),
        (_squad(dict(QA, answers=[{"text": "Ann", "answer_start": "0"}])),
         r"answer_start: '0' \(a string\), not a whole number"),
        (_squad(dict(QA, answers=[{"text": "Ann", "answer_start": 0.0}])),
         r"answer_start: 0\.0 \(a number with a decimal point\)"),
        (_squad("What?"), r"qas\[0\]: not an object \(a string\)"),
        (_squad(dict(QA, answers="Ann")), r"answers: a string, not a list"),
        (_squad(dict(QA, answers=["Ann"])), r'answers\[0\]: not an object with "text"'),
        (_squad({"question": "Who?", "answers": []}), r"qas\[0\]: no 'id'"),
        (_squad(dict(QA, is_impossible="false")), r"is_impossible: 'false', not true/false"),
    ],
)  # fmt: skip
def test_doubtful_squad_inputs_are_refused_by_json_path(data, says, tmp_path):
    path = tmp_path / "train.json"
    path.write_text(json.dumps(data))
    with pytest.raises(DataError, match=says) as caught:
        read_squad(path)
    assert "train.json" in str(caught.value)
    assert "indices" not in str(caught.value) and "KeyError" not in str(caught.value)


def test_a_numeric_id_is_read_as_text(tmp_path):
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(_squad(dict(QA, id=7))))
    [example] = read_squad(path)
    assert example.qid == "7" and example.answers == (("Ann", 0),)
