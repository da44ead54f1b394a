"""SQuAD readers and windows (bertkit.tasks.squad)."""

from __future__ import annotations

import json

import pytest

from bertkit.tasks import DataError
from bertkit.tasks.squad import read_squad, split_by_article
from bertkit.tokenizer import train_vocab

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
