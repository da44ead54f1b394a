"""`text-classification` on users' own files (bertkit.tasks.text_classification): every format,
single-label, multi-label and regression, windows for long texts, label names surviving
predict, ONNX export and transformers' pipeline."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from bertkit.core.heads import BertForSequenceClassification
from bertkit.core.tokenizer import BertTokenizer
from bertkit.finetuning.runs import finetune_seeds
from bertkit.finetuning.train import FinetuneConfig, finetune
from bertkit.inference.predict import Predictor
from bertkit.tasks import get_task
from bertkit.tasks.base import run_outputs
from bertkit.tasks.own import DataConfig
from bertkit.tasks.text_classification import truncate_pair

from helpers import OWN_QUICK, scored_rows, topic_rows


def write_csv(path, rows, columns=("id", "headline", "topic"), separator=None):
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        for r in rows:
            values = [r[c] for c in columns]
            writer.writerow([separator.join(v) if isinstance(v, list) else v for v in values])
    return path


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def headlines(tmp_path, train=160, dev=48, **kind):
    return (
        write_csv(tmp_path / "train.csv", topic_rows(train, seed=0, **kind)),
        write_csv(tmp_path / "dev.csv", topic_rows(dev, seed=1, **kind)),
    )


def test_single_label_end_to_end(words_model, tmp_path, transformers):
    train, dev = headlines(tmp_path)
    rows = topic_rows(30, seed=2)
    rows[3]["headline"] += ', "quoted"\nand a second line'
    test = write_csv(tmp_path / "test.csv", rows)
    data = DataConfig(train=str(train), validation=str(dev), test=str(test),
                      text_column="headline", label_column="topic")  # fmt: skip
    out = tmp_path / "run"
    results = finetune("text-classification", words_model, data, out, FinetuneConfig(**OWN_QUICK))
    # floors below what an independent bag of words reaches on these files (test_floors.py)
    assert results["dev"]["accuracy"] >= 0.9 and results["test"]["accuracy"] >= 0.9
    assert set(results["dev"]) == {"accuracy", "macro_f1", "micro_f1", "mcc"}
    assert results["read"]["train"]["problem"] == "single-label"
    assert set(results["read"]["train"]["labels"]) == {"business", "sports", "tech"}
    report = results["report"]["dev"]
    assert set(report["per_class"]) == {"business", "sports", "tech"}
    assert sum(map(sum, report["confusion"]["matrix"])) == 48
    assert results["data"] == {"train": str(train), "validation": str(dev), "test": str(test),
                               "text_column": "headline", "label_column": "topic"}  # fmt: skip
    for name in ("confusion.png", "confusion_test.png", "curves.png", "model.safetensors"):
        assert (out / name).exists(), name
    predicted = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(predicted) == 48 and predicted[0]["line"] == 2
    assert set(predicted[0]) == {"line", "text", "gold", "predicted", "correct", "score",
                                 "probabilities"}  # fmt: skip
    assert sum(p["correct"] for p in predicted) / 48 == pytest.approx(results["dev"]["accuracy"])
    tested = (out / "predictions_test.jsonl").read_text().splitlines()
    assert json.loads(tested[3])["text"].endswith("and a second line")
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "business", "1": "sports", "2": "tech"}
    # the label names survive: Predictor, the ONNX export, transformers' pipeline
    texts = [r["headline"] for r in rows]
    ours = Predictor(out)(texts)
    assert [a["label"] for a in ours] == [r["topic"] for r in rows] or (
        np.mean([a["label"] == r["topic"] for a, r in zip(ours, rows, strict=True)]) >= 0.9
    )
    pipeline = transformers.pipeline("text-classification", model=str(out), device="cpu")
    theirs = pipeline(texts)
    assert [t["label"] for t in theirs] == [a["label"] for a in ours]
    assert [t["score"] for t in theirs] == pytest.approx([a["score"] for a in ours], abs=1e-5)


def test_label_names_survive_the_onnx_export(words_model, tmp_path, ort):
    from bertkit.inference.export import export_onnx

    train, dev = headlines(tmp_path, train=32, dev=16)
    data = DataConfig(train=str(train), validation=str(dev), text_column="headline",
                      label_column="topic")  # fmt: skip
    out = tmp_path / "run"
    finetune(
        "text-classification", words_model, data, out, FinetuneConfig(**OWN_QUICK | {"epochs": 1})
    )
    export_onnx(out, tmp_path / "onnx")
    texts = ["goal match today", "chip cloud"]
    by_torch, by_onnx = Predictor(out)(texts), Predictor(tmp_path / "onnx", backend="onnx")(texts)
    assert [a["label"] for a in by_onnx] == [a["label"] for a in by_torch]
    assert set(by_onnx[0]["probabilities"]) == {"business", "sports", "tech"}


def test_every_format_reads_the_same_examples(tmp_path):
    """CSV, TSV, JSON Lines, JSON, Parquet, a datasets folder, and compressed CSV and JSON
    Lines: the same training examples."""
    datasets = pytest.importorskip("datasets")
    rows = topic_rows(20)
    rows[0]["headline"] = 'with "quotes", commas\nand a newline'
    paths = {
        "csv": write_csv(tmp_path / "a.csv", rows),
        "jsonl": write_jsonl(tmp_path / "a.jsonl", rows),
    }
    (tmp_path / "a.json").write_text(json.dumps(rows))
    paths["json"] = tmp_path / "a.json"
    with open(tmp_path / "a.tsv", "w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t")
        writer.writerows(
            [["id", "headline", "topic"]] + [[r["id"], r["headline"], r["topic"]] for r in rows]
        )
    paths["tsv"] = tmp_path / "a.tsv"
    table = datasets.Dataset.from_list(rows)
    table.to_parquet(str(tmp_path / "a.parquet"))
    table.save_to_disk(str(tmp_path / "folder"))
    paths["parquet"], paths["arrow"] = tmp_path / "a.parquet", tmp_path / "folder"
    import gzip
    import lzma

    for kind, compress, suffix in (("csv", gzip.compress, "gz"), ("jsonl", lzma.compress, "xz")):
        packed = tmp_path / f"a.{kind}.{suffix}"  # compressed: known by their first bytes
        packed.write_bytes(compress(paths[kind].read_bytes()))
        paths[f"{kind}.{suffix}"] = packed
    seen = {}
    for kind, path in paths.items():
        task = get_task("text-classification", DataConfig(train=str(path), text_column="headline",
                                                          label_column="topic"))  # fmt: skip
        seen[kind] = [(e.text, e.label) for e in task.read(None, "train")]
    expected = [(r["headline"], r["topic"]) for r in rows]
    assert all(found == expected for found in seen.values()), seen
    # header-less, with --columns
    headerless = tmp_path / "noheader.csv"
    headerless.write_text("".join(line + "\n" for line in
                                  (tmp_path / "a.csv").read_text().splitlines(keepends=False)[1:]))  # fmt: skip
    task = get_task("text-classification", DataConfig(
        train=str(headerless), columns="id,headline,topic", text_column="headline",
        label_column="topic"))  # fmt: skip
    assert [(e.text, e.label) for e in task.read(None, "train")] == expected


def test_multi_label_thresholds_chosen_on_validation(words_model, tmp_path, transformers):
    train_rows, dev_rows = topic_rows(200, seed=0, topics=2), topic_rows(48, seed=1, topics=2)
    test_rows = topic_rows(48, seed=2, topics=2)  # never seen by the thresholds' tuning
    data = DataConfig(train=str(write_jsonl(tmp_path / "train.jsonl", train_rows)),
                      validation=str(write_jsonl(tmp_path / "dev.jsonl", dev_rows)),
                      test=str(write_jsonl(tmp_path / "test.jsonl", test_rows)),
                      text_column="headline", label_column="topic")  # fmt: skip
    out = tmp_path / "run"
    results = finetune("text-classification", words_model, data, out,
                       FinetuneConfig(**OWN_QUICK | {"epochs": 10}))  # fmt: skip
    assert results["read"]["train"]["problem"] == "multi-label"
    # scored on rows the thresholds were not tuned on, against the trivial answer (every label:
    # each row has 2 of the 3, so micro-F1 0.8); a bag of words reaches >= 0.95 on these rows
    # (test_floors.py)
    gold = sum(len(r["topic"]) for r in test_rows)
    every = 2 * gold / (3 * len(test_rows) + gold)  # precision gold/3n, recall 1
    assert every == pytest.approx(0.8)
    assert results["test"]["micro_f1"] >= max(0.85, every + 0.05), results["test"]
    info = json.loads((out / "bertkit_task.json").read_text())
    thresholds = info["thresholds"]
    assert set(thresholds) == {"business", "sports", "tech"}
    assert all(0 < t < 1 for t in thresholds.values())
    per_class = results["report"]["dev"]["per_class"]
    assert {n: per_class[n]["threshold"] for n in per_class} == pytest.approx(thresholds, abs=1e-4)
    assert (
        json.loads((out / "config.json").read_text())["problem_type"]
        == "multi_label_classification"
    )
    # every label over its own threshold, by name
    answer = Predictor(out)(["goal match stocks bank today"])[0]
    assert set(answer) == {"labels", "probabilities"}
    assert answer["labels"] == [n for n in ("business", "sports", "tech")
                                if answer["probabilities"][n] >= thresholds[n]]  # fmt: skip
    assert answer["labels"] == ["business", "sports"]
    pipeline = transformers.pipeline("text-classification", model=str(out), top_k=None)
    theirs = {d["label"]: d["score"] for d in pipeline(["goal match stocks bank today"])[0]}
    assert theirs == pytest.approx(answer["probabilities"], abs=1e-5)  # sigmoids, not softmax
    # the same labels in a CSV cell, split on --label-separator
    csv_train = write_csv(tmp_path / "train.csv", train_rows, separator="|")
    task = get_task("text-classification", DataConfig(train=str(csv_train), text_column="headline",
                                                      label_column="topic", label_separator="|"))  # fmt: skip
    fitted = task.fitted(task.read(None, "train"))
    assert fitted.problem == "multi-label" and fitted.labels() == ["business", "sports", "tech"]


def test_regression(words_model, tmp_path):
    train, dev = scored_rows()
    data = DataConfig(train=str(write_jsonl(tmp_path / "t.jsonl", train)),
                      validation=str(write_jsonl(tmp_path / "d.jsonl", dev)))  # fmt: skip
    results = finetune("text-classification", words_model, data, tmp_path / "run",
                       FinetuneConfig(**OWN_QUICK | {"epochs": 8}))  # fmt: skip
    assert results["read"]["train"]["problem"] == "regression"
    assert results["dev"]["pearson"] > 0.8  # a linear model of word counts: 0.99 (test_floors)
    # random batches, as STS-B's: a length that goes with the score must not sort the batches
    assert results["hyperparameters"]["bucket_batches"] == 1
    seeds = finetune_seeds("text-classification", words_model, data, tmp_path / "seeds",
                           FinetuneConfig(**OWN_QUICK | {"epochs": 1}), seeds=1)  # fmt: skip
    assert seeds["hyperparameters"]["bucket_batches"] == 1  # (a series too)
    told = finetune("text-classification", words_model, data, tmp_path / "told",
                    FinetuneConfig(**OWN_QUICK | {"epochs": 1, "bucket_batches": 50}))  # fmt: skip
    assert told["hyperparameters"]["bucket_batches"] == 50  # (unless told)
    assert "report" not in results and not (tmp_path / "run" / "confusion.png").exists()
    assert set(Predictor(tmp_path / "run")(["goal goal chip"])[0]) == {"score"}


def test_windows_agree_with_the_unwindowed_model_on_short_texts(words_model):
    tokenizer = BertTokenizer.from_pretrained(words_model)
    rows = topic_rows(12, seed=3)
    long = " ".join(f"goal {w}" for w in ["match", "team", "coach"] * 25)  # 150 pieces
    plain, windowed = (get_task("text-classification", DataConfig(stride=s)) for s in (None, 16))
    examples = [plain.example_of(r["headline"], n) for n, r in enumerate(rows)]
    a, b = (t.featurize(examples, tokenizer, 64) for t in (plain, windowed))
    assert all(np.array_equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, b, strict=True))
    # one long text: windows of 62 pieces sharing 16, the last moved back to end at the end
    features = windowed.featurize([plain.example_of(long, 0)], tokenizer, 64)
    pieces = tokenizer.encode_ids([long])[0]
    assert [list(f["input_ids"][1:-1]) for f in features] == [
        pieces[s : s + 62] for s in (0, 46, 88)
    ]
    assert all(f["_example"] == 0 for f in features)
    cut = plain.featurize([plain.example_of(long, 0)], tokenizer, 64)
    assert len(cut) == 1 and cut[0]["_cut"] == 150 - 62
    # pooled: the mean of the windows' logits; on short texts the same as without windows
    config = json.loads((words_model / "config.json").read_text())
    from bertkit.core.config import BertConfig

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig.from_dict(config).with_labels(3)).eval()
    for task in (plain, windowed):
        task.label_set = __import__("bertkit.tasks.labels", fromlist=["LabelSet"]).LabelSet(
            "single-label", ("a", "b", "c")
        )
    outputs = run_outputs(windowed, model, features, 8, torch.device("cpu"))
    pooled = windowed.predictions([None], features, outputs)
    assert pooled[0] == pytest.approx(outputs["logits"].mean(0), abs=1e-6)
    short = [
        run_outputs(t, model, f, 8, torch.device("cpu")) for t, f in ((plain, a), (windowed, b))
    ]
    np.testing.assert_allclose(plain.predictions(examples, a, short[0]),
                               windowed.predictions(examples, b, short[1]), atol=1e-6)  # fmt: skip


def test_truncation_is_the_tokenizers(words_model):
    """Pairs cut as the tokenizers library's longest_first (what GLUE features use)."""
    tokenizer = BertTokenizer.from_pretrained(words_model)
    rng = np.random.default_rng(0)
    for _ in range(200):
        a = [int(x) for x in rng.integers(10, 40, rng.integers(1, 40))]
        b = [int(x) for x in rng.integers(10, 40, rng.integers(1, 40))]
        length = int(rng.integers(8, 64))
        text_a = " ".join(tokenizer.convert_ids_to_tokens(a))
        text_b = " ".join(tokenizer.convert_ids_to_tokens(b))
        expected = tokenizer(text_a, text_b, max_length=length)["input_ids"]
        cut_a, cut_b = truncate_pair(a, b, length - 3)
        assert [tokenizer.cls_token_id, *cut_a, tokenizer.sep_token_id, *cut_b,
                tokenizer.sep_token_id] == expected  # fmt: skip


def test_class_weights_balanced(words_model, tmp_path):
    rows = topic_rows(120)
    skewed = [r for r in rows if r["topic"] != "tech"] + [r for r in rows if r["topic"] == "tech"][
        :4
    ]
    data = DataConfig(train=str(write_csv(tmp_path / "t.csv", skewed)), text_column="headline",
                      label_column="topic", class_weights="balanced")  # fmt: skip
    task = get_task("text-classification", data)
    fitted = task.fitted(task.read(None, "train"))
    counts = fitted.label_set.counts
    assert fitted.weights == pytest.approx(
        [len(skewed) / (3 * counts[n]) for n in ("business", "sports", "tech")]
    )
    assert fitted.weights[2] > 5 * fitted.weights[0]
