"""`question-answering` and `multiple-choice` on users' own files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bertkit.finetuning.evaluation import evaluate
from bertkit.finetuning.train import FinetuneConfig, finetune
from bertkit.inference.predict import Predictor
from bertkit.tasks import get_task
from bertkit.tasks.base import DataError
from bertkit.tasks.own import DataConfig

from helpers import ENTITY_WORDS, FILLER, OWN_QUICK, choice_rows


def squad_file(path, count, seed, unanswerable=0.0):
    """SQuAD-format questions ("where does ann go?" -> a city in the context)."""
    rng = np.random.default_rng(seed)
    paragraphs = []
    for n in range(count):
        city, food = rng.choice(ENTITY_WORDS["city"]), rng.choice(ENTITY_WORDS["food"])
        context = f"{rng.choice(FILLER)} ann visits {city} and eats {food} {rng.choice(FILLER)}"
        if rng.random() < unanswerable:
            qas = [{"id": f"q{n}", "question": "where does bob go", "answers": [],
                    "is_impossible": True}]  # fmt: skip
        else:
            qas = [{"id": f"q{n}", "question": "what does ann eat",
                    "answers": [{"text": food, "answer_start": context.index(f"eats {food}") + 5}]}]  # fmt: skip
        paragraphs.append({"context": context, "qas": qas})
    path.write_text(
        json.dumps({"version": "mine", "data": [{"title": "t", "paragraphs": paragraphs}]})
    )
    return path


def test_question_answering_on_squad_files_of_any_name(words_model, tmp_path):
    data = DataConfig(train=str(squad_file(tmp_path / "my_questions.json", 80, 0, 0.3)),
                      validation=str(squad_file(tmp_path / "held.json", 20, 1, 0.3)))  # fmt: skip
    out = tmp_path / "run"
    results = finetune("question-answering", words_model, data, out,
                       FinetuneConfig(**OWN_QUICK | {"epochs": 2}))  # fmt: skip
    assert "SQuAD 2.0-style" in results["read"]["train"]["problem"]  # unanswerable ones: v2
    assert {"exact_match", "f1", "HasAns_exact", "NoAns_exact"} <= set(results["dev"])
    info = json.loads((out / "bertkit_task.json").read_text())
    assert info["version"] == 2 and "null_threshold" in info
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 20 and {"id", "question", "gold", "predicted", "score", "null_odds"} <= set(
        rows[0]
    )
    answer = Predictor(out)([{"question": "what does ann eat", "context": "ann eats sushi"}])[0]
    assert {"answer", "start", "end", "score", "no_answer"} <= set(answer)
    # the folder loads in transformers' AutoModelForQuestionAnswering with bertkit's logits
    import torch
    import transformers

    from bertkit.core.tokenizer import BertTokenizer
    from bertkit.inference.loader import load

    theirs = transformers.AutoModelForQuestionAnswering.from_pretrained(out).eval()
    ours = load(out, fine_tuned=True).model
    batch = BertTokenizer.from_pretrained(out)(["what does ann eat"], ["ann eats sushi today"],
                                               return_tensors="pt")  # fmt: skip
    with torch.no_grad():
        expected, got = theirs(**batch), ours(**batch)
    torch.testing.assert_close(got.start_logits, expected.start_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.end_logits, expected.end_logits, atol=1e-5, rtol=0)
    # records in Hugging Face's squad layout, and a file without answers to predict
    records = tmp_path / "records.jsonl"
    records.write_text(json.dumps({"id": "r1", "question": "what does ann eat",
                                   "context": "ann eats pizza", "answers": {
                                       "text": ["pizza"], "answer_start": [9]}}) + "\n")  # fmt: skip
    scored = evaluate(out, records)
    assert set(scored["dev"]) >= {"exact_match", "f1"}
    with pytest.raises(DataError, match=r"records.jsonl:1: column 'answers': 'pizza' is not at"):
        records.write_text(
            records.read_text().replace('"answer_start": [9]', '"answer_start": [3]')
        )
        evaluate(out, records)


def test_multiple_choice_from_json_lines(words_model, tmp_path):
    rng = np.random.default_rng(0)
    train, dev = choice_rows(120, rng), choice_rows(30, rng)
    dev[0]["label"] = dev[0]["choices"][dev[0]["label"]]  # the right choice's text works too
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in dev))
    data = DataConfig(train=str(tmp_path / "t.jsonl"), validation=str(tmp_path / "d.jsonl"))
    out = tmp_path / "run"
    results = finetune("multiple-choice", words_model, data, out, FinetuneConfig(**OWN_QUICK))
    assert results["dev"]["accuracy"] >= 0.9
    assert results["report"]["dev"]["confusion"]["labels"] == ["choice 0", "choice 1", "choice 2"]
    first = json.loads((out / "predictions.jsonl").read_text().splitlines()[0])
    assert first["gold"] == [r for r in dev[0]["choices"]].index(dev[0]["label"])
    answer = Predictor(out)(
        [{"context": "ann loves oslo", "choices": ["eats sushi", "visits oslo"]}]
    )
    assert set(answer[0]) == {"choice", "text", "probabilities"}
    # a row with another number of choices, a label that is no choice
    (tmp_path / "bad.jsonl").write_text(json.dumps({"context": "x", "choices": ["a", "b"],
                                                    "label": "c"}) + "\n")  # fmt: skip
    task = get_task("multiple-choice", DataConfig(train=str(tmp_path / "bad.jsonl")))
    with pytest.raises(DataError, match=r"bad.jsonl:1: column 'label': 'c' is neither a choice"):
        task.read(None, "train")
    # several choice columns instead of one list (SWAG's layout)
    flat = tmp_path / "flat.csv"
    flat.write_text("sent1,ending0,ending1,label\nann loves oslo,eats sushi,visits oslo,1\n")
    task = get_task("multiple-choice", DataConfig(train=str(flat), context_column="sent1",
                                                  choices_column="ending0,ending1"))  # fmt: skip
    (example,) = task.read(None, "train")
    assert example.endings == ("eats sushi", "visits oslo") and example.label == 1
