"""Fine-tuning end to end on fixtures (bertkit.finetuning.train): every task family, seeds, grid, resume."""

from __future__ import annotations

import dataclasses
import json
import os
import random
from pathlib import Path

import pytest
import torch

from bertkit import cli
from bertkit.finetuning.evaluation import evaluate
from bertkit.finetuning.runs import finetune_seeds
from bertkit.finetuning.train import FinetuneConfig, finetune
from bertkit.inference.predict import Predictor
from bertkit.tasks import get_task
from bertkit.tasks.glue import GLUE
from bertkit.tasks.squad import read_squad, with_unanswerable

from helpers import FIXTURES, KILLER, QUICK, data_path, grow_copies


@pytest.mark.parametrize("task", ["mnli", "qqp", "qnli"])
def test_finetune_glue_fixtures_end_to_end(task, tiny_checkpoint, tmp_path):
    data = grow_copies(FIXTURES / "glue" / GLUE[task].folder, tmp_path / "data", 5)
    out = tmp_path / "run"
    results = finetune(task, tiny_checkpoint, data, out, FinetuneConfig(**QUICK))
    saved = json.loads((out / "results.json").read_text())
    assert saved["dev"] == results["dev"]
    expected = {
        "mnli": {"accuracy", "accuracy_mismatched"},
        "qqp": {"accuracy", "f1"},
        "qnli": {"accuracy"},
    }
    assert expected[task] <= set(results["dev"])
    assert len(results["epochs"]) == 2 and results["steps"] == 2 * 4  # 30 examples / 8
    assert (out / "model.safetensors").exists() and (out / "curves.png").exists()
    assert not (out / "trainer_state.pt").exists()
    # the saved model evaluates to the figures of its best epoch, and writes a submission
    scored = evaluate(out, data, split="dev", out=tmp_path / "eval")
    figures = {k: v for k, v in results["dev"].items() if not k.endswith("mismatched")}
    assert scored["dev"] == pytest.approx(figures)
    submission = evaluate(out, data, split="test", out=tmp_path / "eval")
    lines = Path(submission["predictions"]).read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 31
    name = {"mnli": "MNLI-m.tsv", "qqp": "QQP.tsv", "qnli": "QNLI.tsv"}[task]
    assert Path(submission["predictions"]).name == name
    # raw text in, labels out: the Python API and the command line agree with evaluate
    dev = get_task(task).read(data, "dev")
    predicted = Predictor(out)([(e.text_a, e.text_b) for e in dev])
    evaluated = Path(scored["predictions"]).read_text().splitlines()[1:]
    assert [p["label"] for p in predicted] == [line.split("\t")[1] for line in evaluated]
    assert all(abs(sum(p["probabilities"].values()) - 1) < 1e-5 for p in predicted)


def test_finetune_learns_and_seeds_summarise(tiny_checkpoint, tmp_path):
    """A separable toy task is learnt (so the loop, loss and metric are wired right), and
    --seeds reports mean/std/min/max over the runs."""
    rng = random.Random(0)
    rows = []
    for _i in range(96):
        good = rng.random() < 0.5
        words = " ".join(
            rng.choice(
                ["cuts", "dives", "types", "onion", "pool"]
                if good
                else ["melts", "sings", "flies", "bird", "sky"]
            )
            for _ in range(6)
        )
        rows.append(f"{words}\t{int(good)}")
    data = tmp_path / "SST-2"
    data.mkdir()
    (data / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(rows[:64]) + "\n")
    (data / "dev.tsv").write_text("sentence\tlabel\n" + "\n".join(rows[64:]) + "\n")
    config = FinetuneConfig(**{**QUICK, "epochs": 4, "batch_size": 4})
    results = finetune_seeds("sst2", tiny_checkpoint, data, tmp_path / "seeds", config, seeds=2)
    assert results["seeds"] == [42, 43]
    assert results["dev"]["accuracy"] >= 0.9
    runs = [r["dev"]["accuracy"] for r in results["runs"]]
    assert results["dev_min"]["accuracy"] == min(runs) and results["dev_max"]["accuracy"] == max(
        runs
    )
    assert (tmp_path / "seeds" / "seed_43" / "results.json").exists()


def test_finetune_stsb_regression_and_cola(tiny_checkpoint, tmp_path):
    for task, folder in (("stsb", "STS-B"), ("cola", "CoLA")):
        source = data_path("glue", folder)
        data = tmp_path / folder
        data.mkdir()
        for split in ("train", "dev"):
            lines = (source / f"{split}.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
            keep = lines[:41] if task == "stsb" else lines[:40]
            (data / f"{split}.tsv").write_text("".join(keep))
        results = finetune(task, tiny_checkpoint, data, tmp_path / task, FinetuneConfig(**QUICK))
        expected = {"stsb": {"pearson", "spearman"}, "cola": {"mcc", "accuracy"}}[task]
        assert expected <= set(results["dev"])
        # the figures are those of the model's predictions, by scipy's and scikit-learn's
        # formulas (the official ones), against the gold of the dev file
        written = tmp_path / task / get_task(task).prediction_file("dev")
        predicted = [row.split("\t")[1] for row in written.read_text().splitlines()[1:]]
        rows = (data / "dev.tsv").read_text(encoding="utf-8").splitlines()
        if task == "stsb":
            from scipy.stats import pearsonr, spearmanr

            gold = [float(row.split("\t")[-1]) for row in rows[1:]]
            pairs = [row.split("\t")[7:9] for row in rows[1:]]
            # the scores in full (the file writes 3 decimals; 40 rows barely teach a tiny model,
            # whose near-equal scores move the figures in the 5th decimal by batching)
            guess = [a["score"] for a in Predictor(tmp_path / task)(pairs)]
            assert [f"{g:.3f}" for g in guess] == predicted and len(gold) == 40
            assert results["dev"]["pearson"] == pytest.approx(pearsonr(gold, guess)[0], abs=1e-4)
            assert results["dev"]["spearman"] == pytest.approx(spearmanr(gold, guess)[0], abs=1e-4)
        else:
            from sklearn.metrics import accuracy_score, matthews_corrcoef

            gold = [row.split("\t")[1] for row in rows]
            assert len(predicted) == len(gold) == 40 and set(predicted) <= {"0", "1"}
            assert results["dev"]["mcc"] == pytest.approx(matthews_corrcoef(gold, predicted))
            assert results["dev"]["accuracy"] == pytest.approx(accuracy_score(gold, predicted))


def test_finetune_conll_iob1_and_predictions_file(tiny_checkpoint, tmp_path):
    data = tmp_path / "conll"
    data.mkdir()
    for name in ("train.txt", "valid.txt", "test.txt"):
        text = (FIXTURES / "conll2003_iob1" / name).read_text()
        (data / name).write_text(text * 8)
    out = tmp_path / "run"
    results = finetune(
        "conll2003",
        tiny_checkpoint,
        data,
        out,
        FinetuneConfig(**{**QUICK, "epochs": 10, "batch_size": 2}),
    )
    assert {"f1", "precision", "recall", "accuracy"} <= set(results["dev"])
    written = (out / "predictions_dev.conll").read_text().split("\n\n")
    first = written[0].splitlines()
    assert first[0].split()[:4] == ["EU", "NNP", "I-NP", "I-ORG"] and len(first[0].split()) == 5
    assert results["dev"]["accuracy"] > 0.7  # 120 steps: tags are learnt (all-O: 0.58)
    text = "EU rejects German call, says Paris."
    tagged = Predictor(out)([text, ["Peter", "Blackburn"], {"text": "EU rejects"}])
    assert tagged[0]["words"] == ["EU", "rejects", "German", "call", ",", "says", "Paris", "."]
    assert [len(t["tags"]) for t in tagged] == [8, 2, 2]  # split as BERT's basic tokenizer does
    assert all(0 < p <= 1 for t in tagged for p in t["scores"])
    assert tagged[0]["entities"], tagged[0]["tags"]  # the offsets below are checked on some
    for entity in tagged[0]["entities"]:  # raw text: character offsets into it
        assert set(entity) == {"type", "text", "words", "score", "start", "end"}
        assert text[entity["start"] : entity["end"]] == entity["text"]
    assert tagged[1]["entities"], tagged[1]["tags"]  # (a list of words: no offsets)
    assert all(set(e) == {"type", "text", "words", "score"} for e in tagged[1]["entities"])
    assert tagged[0]["offsets"][6] == [text.index("Paris"), text.index("Paris") + 5]
    assert all(
        text[a:b] == w for w, (a, b) in zip(tagged[0]["words"], tagged[0]["offsets"], strict=True)
    )
    assert "offsets" not in tagged[1] and tagged[2]["offsets"] == [[0, 2], [3, 10]]  # dict input


def test_finetune_swag_fixture(tiny_checkpoint, tmp_path):
    data = grow_copies(FIXTURES / "swag", tmp_path / "swag", 6)
    results = finetune("swag", tiny_checkpoint, data, tmp_path / "run", FinetuneConfig(**QUICK))
    assert set(results["dev"]) == {"accuracy"}
    assert results["train_examples"] == 24
    # the accuracy is that of the choices written, against the dev file's gold endings
    import csv

    with open(data / "val.csv", newline="", encoding="utf-8") as handle:
        gold = [row["label"] for row in csv.DictReader(handle)]
    written = (tmp_path / "run" / get_task("swag").prediction_file("dev")).read_text()
    chosen = [row.split(",")[-1] for row in written.splitlines()[1:]]
    assert len(chosen) == len(gold) > 0 and set(chosen) <= {"0", "1", "2", "3"}
    assert results["dev"]["accuracy"] == pytest.approx(
        sum(c == g for c, g in zip(chosen, gold, strict=True)) / len(gold)
    )


def _squad_fixture(directory: Path, version: int) -> Path:
    """Small SQuAD files: the first two articles of the shared dev set (a few dozen questions),
    for v2.0 with unanswerable questions asked of another article's paragraphs."""
    data = json.loads(data_path("squad", "dev-v1.1.json").read_text())["data"]
    articles = []
    for article in data[:2]:
        paragraphs = [
            {"context": p["context"], "qas": p["qas"][:3]} for p in article["paragraphs"][:4]
        ]
        articles.append({"title": article["title"], "paragraphs": paragraphs})
    if version == 2:
        articles = with_unanswerable(articles, fraction=0.5, seed=0)
    directory.mkdir()
    name = {1: "v1.1", 2: "v2.0"}[version]
    for split in ("train", "dev"):
        (directory / f"{split}-{name}.json").write_text(
            json.dumps({"version": name, "data": articles})
        )
    return directory


@pytest.mark.parametrize("version", [1, 2])
def test_finetune_squad_end_to_end(version, tiny_checkpoint, tmp_path):
    data = _squad_fixture(tmp_path / "squad", version)
    out = tmp_path / "run"
    config = FinetuneConfig(**{**QUICK, "max_seq_length": 96, "epochs": 1})
    results = finetune(f"squad{version}", tiny_checkpoint, data, out, config)
    assert {"exact_match", "f1"} <= set(results["dev"])
    predictions = json.loads((out / "predictions.json").read_text())
    questions = read_squad(data / f"dev-{ {1: 'v1.1', 2: 'v2.0'}[version] }.json")
    assert set(predictions) == {q.qid for q in questions}
    # every answer is a slice of its context (offsets map back to the original text)
    contexts = {q.qid: q.context for q in questions}
    assert all(a in contexts[qid] for qid, a in predictions.items())
    first = questions[0]
    answer = Predictor(out)([{"question": first.question, "context": first.context}])[0]
    assert answer["answer"] == predictions[first.qid]
    if answer["answer"]:  # start and end are character offsets of the answer in the context
        assert first.context[answer["start"] : answer["end"]] == answer["answer"]
    if version == 2:
        assert {"HasAns_exact", "NoAns_exact", "best_f1", "best_f1_thresh"} <= set(results["dev"])
        assert (out / "null_odds.json").exists()
        info = json.loads((out / "bertkit_task.json").read_text())
        assert info["null_threshold"] == results["dev"]["best_f1_thresh"]


def test_finetune_resumes_after_an_error_in_epoch_two(tiny_checkpoint, tmp_path, monkeypatch):
    """A run that raises in epoch 2 resumes from the epoch-1 checkpoint to the same result (a
    real SIGKILL at each write: test_a_finetuning_run_killed_at_any_write_...)."""
    import bertkit.finetuning.train as ft

    data = grow_copies(FIXTURES / "glue" / "QNLI", tmp_path / "data", 5)
    whole = finetune("qnli", tiny_checkpoint, data, tmp_path / "whole", FinetuneConfig(**QUICK))
    calls = []
    real = ft.evaluate_split

    def dies_in_epoch_two(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("killed")
        return real(*args, **kwargs)

    monkeypatch.setattr(ft, "evaluate_split", dies_in_epoch_two)
    with pytest.raises(RuntimeError, match="killed"):
        finetune("qnli", tiny_checkpoint, data, tmp_path / "run", FinetuneConfig(**QUICK))
    assert torch.load(tmp_path / "run" / "trainer_state.pt", weights_only=True)["step"] == 4
    monkeypatch.setattr(ft, "evaluate_split", real)
    # the checkpoint carries the seconds it took; pretend the killed part took 1000
    state_file = tmp_path / "run" / "trainer_state.pt"
    state = torch.load(state_file, weights_only=True)
    assert state["seconds"] > 0
    torch.save({**state, "seconds": 1000.0}, state_file)
    (tmp_path / "run" / "trainer_state.sha256").unlink()  # edited by hand: no checksum to match
    resumed = finetune(
        "qnli", tiny_checkpoint, data, tmp_path / "run", FinetuneConfig(**QUICK, resume=True)
    )
    assert resumed["dev"] == pytest.approx(whole["dev"])
    # both parts counted: the killed part's 1000 s plus the resumed epoch (which can round to
    # 0.0 s on a fast machine, hence <=)
    assert 1000 <= resumed["seconds"] < 1000 + whole["seconds"] + 60

    def train_losses(directory):
        lines = (directory / "log.jsonl").read_text().splitlines()
        return [e["loss"] for e in map(json.loads, lines) if e["split"] == "train"]

    assert train_losses(tmp_path / "run") == pytest.approx(train_losses(tmp_path / "whole"))
    assert [e["score"] for e in resumed["epochs"]] == pytest.approx(
        [e["score"] for e in whole["epochs"]]
    )

    # a finished run is returned as it is, not trained again; other settings do train
    def no_training(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(ft.Trainer, "train", no_training)
    again = finetune(
        "qnli", tiny_checkpoint, data, tmp_path / "run", FinetuneConfig(**QUICK, resume=True)
    )
    assert again == resumed
    # a results.json written before bucket_batches was a setting counts as 50 (what it used)
    results_file = tmp_path / "run" / "results.json"
    saved = json.loads(results_file.read_text())
    assert saved["hyperparameters"]["bucket_batches"] == 50
    del saved["hyperparameters"]["bucket_batches"]
    # ... and one from before the optimiser's settings were nested: warmup_proportion, AdamW
    hyper = saved["hyperparameters"]
    hyper["warmup_proportion"] = hyper.pop("warmup_fraction")
    del hyper["warmup_steps"], hyper["optimizer"]
    results_file.write_text(json.dumps(saved))
    finetune("qnli", tiny_checkpoint, data, tmp_path / "run", FinetuneConfig(**QUICK, resume=True))
    changes = ({"learning_rate": 1e-4}, {"bucket_batches": 1}, {"warmup_steps": 1},
               {"optimizer": "bertadam"}, {"head_init": "truncated-normal"})  # fmt: skip
    for changed in changes:
        with pytest.raises(AssertionError, match="trained again"):
            other = FinetuneConfig(**{**QUICK, **changed}, resume=True)
            finetune("qnli", tiny_checkpoint, data, tmp_path / "run", other)


def test_taggers_and_sts_b_draw_random_batches_unless_told():
    """Length-sorted batches cost token tagging 1.6 F1 against a transformers user's loop
    (docs/results/own_data) and one epoch of STS-B 4.1 points (docs/results): taggers and
    GLUE's regression default to random batches, the rest to buckets."""
    for name, expected in (("conll2003", 1), ("token-classification", 1), ("stsb", 1),
                           ("mrpc", 50), ("sst2", 50), ("squad1", 50),
                           ("text-classification", 50)):  # fmt: skip
        assert FinetuneConfig().resolved(get_task(name)).bucket_batches == expected, name
    for name in ("conll2003", "stsb"):
        assert FinetuneConfig(bucket_batches=50).resolved(get_task(name)).bucket_batches == 50


def test_bilstm_heads_of_table_5(tiny_checkpoint, tmp_path):
    """`+ BiLSTM`: padding never reaches the recurrence, and the head round-trips through
    finetune -> evaluate/predict."""
    from bertkit.core.heads import BertBiLSTMForQuestionAnswering

    model = BertBiLSTMForQuestionAnswering.from_pretrained(tiny_checkpoint).eval()
    ids = torch.randint(5, 50, (1, 9))
    padded = torch.cat([ids, torch.zeros(1, 7, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(1, 9), torch.zeros(1, 7)], dim=1).long()
    alone = model(ids).start_logits
    with_padding = model(padded, attention_mask=mask).start_logits[:, :9]
    torch.testing.assert_close(alone, with_padding, rtol=1e-5, atol=1e-5)
    data = tmp_path / "conll"
    data.mkdir()
    for name in ("train.txt", "valid.txt", "test.txt"):
        (data / name).write_text((FIXTURES / "conll2003_iob1" / name).read_text() * 2)
    out = tmp_path / "run"
    config = FinetuneConfig(**{**QUICK, "epochs": 1, "bilstm": True})
    results = finetune("conll2003", tiny_checkpoint, data, out, config)
    assert json.loads((out / "bertkit_task.json").read_text())["head"] == (
        "BertBiLSTMForTokenClassification"
    )
    assert evaluate(out, data)["dev"]["f1"] == pytest.approx(results["dev"]["f1"])
    assert len(Predictor(out)(["EU rejects German call"])[0]["tags"]) == 4
    with pytest.raises(ValueError, match="--bilstm is for span and tagging tasks"):
        finetune("qnli", tiny_checkpoint, data, tmp_path / "x", config)


def test_grid_selects_on_dev(tiny_checkpoint, tmp_path):
    from bertkit.finetuning.runs import finetune_grid

    data = grow_copies(FIXTURES / "glue" / "QNLI", tmp_path / "data", 3)
    grid = {"batch_size": (8,), "learning_rate": (1e-3, 1e-5), "epochs": (1,)}
    config = FinetuneConfig(max_seq_length=64, progress=False)
    results = finetune_grid("qnli", tiny_checkpoint, data, tmp_path / "grid", config, grid=grid)
    assert [p["dir"] for p in results["grid"]] == ["b8_lr0.001_e1", "b8_lr1e-05_e1"]
    best = max(results["grid"], key=lambda p: p["score"])
    assert results["selected"]["dir"] == best["dir"] and results["dev"] == best["dev"]
    for point in results["grid"]:
        saved = json.loads((tmp_path / "grid" / point["dir"] / "results.json").read_text())
        assert saved["hyperparameters"]["learning_rate"] == point["learning_rate"]
    # --metric picks the point too (QQP: F1 alone, not the mean of accuracy and F1)
    data = grow_copies(FIXTURES / "glue" / "QQP", tmp_path / "qqp", 3)
    config = dataclasses.replace(config, metric="f1")
    by_f1 = finetune_grid("qqp", tiny_checkpoint, data, tmp_path / "f1", config, grid=grid)
    assert [p["score"] for p in by_f1["grid"]] == [p["dev"]["f1"] for p in by_f1["grid"]]
    best = max(by_f1["grid"], key=lambda p: p["dev"]["f1"])
    assert by_f1["selected"]["dir"] == best["dir"] and by_f1["selected_by"] == "f1"


def test_random_init_finetuning_draws_each_seed_its_own_encoder(tiny_checkpoint, tmp_path):
    """`bertkit finetune --config SIZE --vocab DIR`: the no-pre-training row. Nothing is read
    but the config and vocabulary; each seed initialises the whole model afresh, and the
    pre-trained path still loads the checkpoint's weights."""
    from safetensors.torch import load_file

    from bertkit.finetuning.train import build_model, random_init_dir

    data = grow_copies(FIXTURES / "glue" / "QNLI", tmp_path / "data", 5)
    init = random_init_dir(tiny_checkpoint / "config.json", tiny_checkpoint, tmp_path / "init")
    names = {p.name for p in init.iterdir()}
    assert {"config.json", "vocab.txt"} <= names and "model.safetensors" not in names
    task = get_task("qnli")
    saved = load_file(tiny_checkpoint / "model.safetensors")
    key = "embeddings.word_embeddings.weight"
    a = build_model(task, init, seed=1, random_init=True).state_dict()[f"bert.{key}"]
    b = build_model(task, init, seed=2, random_init=True).state_dict()[f"bert.{key}"]
    again = build_model(task, init, seed=1, random_init=True).state_dict()[f"bert.{key}"]
    loaded = build_model(task, tiny_checkpoint, seed=1).state_dict()[f"bert.{key}"]
    assert torch.equal(a, again) and not torch.equal(a, b)
    assert torch.equal(loaded, saved[key]) and not torch.equal(a, saved[key])
    assert 0.015 < float(a.std()) < 0.025  # BERT's N(0, 0.02) initialisation

    out = tmp_path / "run"
    argv = ["finetune", "qnli", "--config", "tiny", "--vocab", str(tiny_checkpoint)]
    argv += ["--data", str(data), "--out", str(out), "--epochs", "1", "--batch-size", "8"]
    assert cli.main([*argv, "--max-seq-length", "64"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["hyperparameters"]["random_init"] is True and "accuracy" in results["dev"]
    config = json.loads((out / "config.json").read_text())
    assert config["hidden_size"] == 128 and config["num_hidden_layers"] == 2  # the tiny preset
    both = ["finetune", "qnli", "--model", str(tiny_checkpoint), "--config", "tiny"]
    assert cli.main([*both, "--data", str(data), "--out", str(tmp_path / "x")]) == 2


@pytest.mark.parametrize("task", ["conll2003-pos", "conll2003-chunk"])
def test_finetune_pos_and_chunk(task, tiny_checkpoint, tmp_path):
    data = tmp_path / "conll"
    data.mkdir()
    for name in ("train.txt", "valid.txt", "test.txt"):
        (data / name).write_text((FIXTURES / "conll2003_iob1" / name).read_text() * 8)
    out = tmp_path / "run"
    # dev holds other sentences than train, of its words: the tags must carry over (120 steps)
    results = finetune(task, tiny_checkpoint, data, out,
                       FinetuneConfig(**{**QUICK, "epochs": 10, "batch_size": 2}))  # fmt: skip
    # a level from an independent reference: the majority tag's share of the dev tokens (the
    # textbook baseline; POS column 2, chunk column 3 of the CoNLL file)
    column = 1 if task.endswith("pos") else 2
    tags = [line.split()[column] for line in (data / "valid.txt").read_text().splitlines()
            if line.strip() and not line.startswith("-DOCSTART-")]  # fmt: skip
    majority = max(tags.count(t) for t in set(tags)) / len(tags)
    print(f"{task}: dev accuracy {results['dev']['accuracy']:.3f}, majority tag {majority:.3f}")
    assert results["dev"]["accuracy"] > majority + 0.05, (results["dev"], majority)
    line = (out / "predictions_dev.conll").read_text().splitlines()[0].split()
    assert line[0] == "EU" and len(line) == 5  # word, the two other columns, gold, predicted
    tagged = Predictor(out)(["EU rejects German call"])
    assert len(tagged[0]["tags"]) == 4


def test_one_writer_per_folder_and_no_silent_reuse(tiny_checkpoint, tmp_path):
    from bertkit._io import run_lock
    from bertkit.core.checkpoint import convert

    data = grow_copies(FIXTURES / "glue" / "QNLI", tmp_path / "data", 3)
    out = tmp_path / "run"
    with run_lock(out), pytest.raises(FileExistsError, match=r"another bertkit process \(pid"):
        finetune("qnli", tiny_checkpoint, data, out, FinetuneConfig(**QUICK))
    first = finetune("qnli", tiny_checkpoint, data, out, FinetuneConfig(**QUICK))
    with pytest.raises(FileExistsError, match="not empty .*--overwrite"):
        finetune("qnli", tiny_checkpoint, data, out, FinetuneConfig(**QUICK))
    again = finetune("qnli", tiny_checkpoint, data, out, FinetuneConfig(**QUICK, overwrite=True))
    assert again["dev"] == pytest.approx(first["dev"])  # the same seed, trained afresh
    # convert into a used folder: refused; with overwrite, no stale weights stay beside the new
    google = tmp_path / "google"
    convert(out, google, to="google")
    with pytest.raises(FileExistsError, match="not empty"):
        convert(out, google, to="google")
    hf = tmp_path / "hf"
    convert(google, hf)
    convert(out, hf, to="google", overwrite=True)
    assert not (hf / "model.safetensors").exists() and (hf / "bert_model.ckpt.index").exists()
    assert (hf / "bertkit_task.json").exists()  # a task model keeps its task when converted


def _separable_sst2(folder: Path, count: int = 96) -> Path:
    rng = random.Random(0)
    rows = []
    for _ in range(count):
        good = rng.random() < 0.5
        pool = ["cuts", "dives", "types", "onion", "pool"] if good else ["melts", "sings", "sky"]
        rows.append(f"{' '.join(rng.choice(pool) for _ in range(6))}\t{int(good)}")
    folder.mkdir(parents=True)
    (folder / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(rows[:64]) + "\n")
    (folder / "dev.tsv").write_text("sentence\tlabel\n" + "\n".join(rows[64:]) + "\n")
    return folder


def test_a_validation_split_picks_the_epoch_and_the_dev_set_is_a_test(tiny_checkpoint, tmp_path):
    """--validation-split: the epoch is chosen on examples carved from train (the same ones for
    every seed), the official dev set is scored once by the chosen model and reported as test."""
    data = _separable_sst2(tmp_path / "SST-2")
    config = FinetuneConfig(**{**QUICK, "epochs": 3, "batch_size": 4, "validation_split": 0.25})
    results = finetune_seeds("sst2", tiny_checkpoint, data, tmp_path / "run", config, seeds=2)
    first = json.loads((tmp_path / "run" / "seed_42" / "results.json").read_text())
    assert first["train_examples"] == 48 and first["validation_split"] == 0.25  # 64 - 16 carved
    assert first["hyperparameters"]["validation_split"] == 0.25
    # the test figures are the chosen model's on the official dev file, as evaluate scores it
    again = evaluate(tmp_path / "run" / "seed_42", data, split="dev")
    assert again["dev"] == pytest.approx(first["test"])
    assert first["dev"] != first["test"]  # 16 carved examples are not the 32 dev ones
    predictions = (tmp_path / "run" / "seed_42" / "predictions_dev.tsv").read_text().splitlines()
    assert len(predictions) == 1 + 32  # header + the official dev set's rows
    assert set(results) >= {"dev", "dev_std", "test", "test_std", "test_min", "test_max"}
    assert [r["test"] for r in results["runs"]] and results["test"]["accuracy"] == pytest.approx(
        sum(r["test"]["accuracy"] for r in results["runs"]) / 2
    )
    with pytest.raises(ValueError, match="--validation-split must be in"):
        FinetuneConfig(validation_split=1.0)


def test_fine_tuning_dropout_is_the_papers_not_the_checkpoints(tiny_checkpoint, tmp_path):
    """A checkpoint pre-trained without dropout (the laptop recipe's 0.0) fine-tunes at the
    paper's 0.1 unless told otherwise; dropout=None keeps the checkpoint's."""
    import shutil

    checkpoint = Path(shutil.copytree(tiny_checkpoint, tmp_path / "pretrained"))
    config = json.loads((checkpoint / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (checkpoint / "config.json").write_text(json.dumps(config))
    data = _separable_sst2(tmp_path / "SST-2")
    for dropout, expected in ((0.1, 0.1), (None, 0.0), (0.3, 0.3)):
        out = tmp_path / f"run_{dropout}"
        config = FinetuneConfig(**{**QUICK, "epochs": 1, "dropout": dropout})
        finetune("sst2", checkpoint, data, out, config)
        saved = json.loads((out / "config.json").read_text())
        assert saved["hidden_dropout_prob"] == saved["attention_probs_dropout_prob"] == expected


def test_a_new_head_is_the_one_transformers_draws_for_the_seed(tiny_checkpoint, tmp_path):
    """By default the head a checkpoint lacks is drawn as transformers draws it, value for value
    for the same seed; `head_init="truncated-normal"` draws Google's (nothing beyond 2 std).
    The run records the choice: a resumed run with the other one trains again."""
    transformers = pytest.importorskip("transformers")
    from bertkit.finetuning.train import build_model

    task = get_task("sst2")
    ours = build_model(task, tiny_checkpoint, seed=7).classifier.weight
    torch.manual_seed(7)
    theirs = transformers.BertForSequenceClassification.from_pretrained(
        tiny_checkpoint, num_labels=2
    ).classifier.weight
    assert torch.equal(ours, theirs)
    std = 0.02
    for seed in range(4):  # 4 x 64 draws: a plain normal's 4.6% beyond 2 std shows
        google = build_model(task, tiny_checkpoint, seed, head_init="truncated-normal")
        assert float(google.classifier.weight.abs().max()) <= 2 * std
    drawn = torch.cat([build_model(task, tiny_checkpoint, s).classifier.weight for s in range(4)])
    assert float(drawn.abs().max()) > 2 * std

    data = _separable_sst2(tmp_path / "SST-2")
    out = tmp_path / "run"
    config = FinetuneConfig(**{**QUICK, "epochs": 1, "head_init": "truncated-normal"})
    finetune("sst2", tiny_checkpoint, data, out, config)
    assert json.loads((out / "results.json").read_text())["hyperparameters"]["head_init"] == (
        "truncated-normal"
    )
    with pytest.raises(SystemExit):
        cli.main(["finetune", "sst2", "--head-init", "uniform", "--out", str(tmp_path / "x")])


def test_early_stopping_keeps_the_best_evaluation_and_stops(words_model, tmp_path, capsys):
    """--metric picks the evaluation whose model OUT keeps, --patience stops the run after that
    many evaluations without a better one, --eval-every evaluates within epochs; a resumed
    stopped run trains no further; an unknown --metric names the figures there are."""
    from bertkit.cli import main

    from helpers import OWN_QUICK, topic_files

    data = topic_files(tmp_path)
    settings = FinetuneConfig(
        **OWN_QUICK | {"epochs": 10}, metric="macro_f1", patience=2, eval_every=10
    )
    out = tmp_path / "run"
    results = finetune("text-classification", words_model, data, out, settings)
    evals = results["epochs"]
    assert results["selected_by"] == "macro_f1" and results["stopped_early"]["patience"] == 2
    assert results["stopped_early"]["step"] < results["steps"] == 200
    assert [e["epoch"] for e in evals[:2]] == [0.5, 1.0]  # every 10 steps of 20 an epoch
    best = max(evals, key=lambda e: e["macro_f1"])
    assert results["best_epoch"] == best["epoch"] and results["dev"]["macro_f1"] == best["macro_f1"]
    assert evals[-1]["epoch"] > best["epoch"] and len(evals) - evals.index(best) - 1 == 2
    # what OUT holds is the best evaluation's model
    assert evaluate(out, tmp_path / "dev.csv")["dev"]["macro_f1"] == pytest.approx(best["macro_f1"])
    card = (out / "README.md").read_text()  # the model card: the command that makes it again
    assert "bertkit finetune text-classification --model" in card and "--patience 2" in card
    assert "BertForSequenceClassification.from_pretrained" in card and "`sports`" in card
    # resumed, the stopped run trains no further
    again = finetune("text-classification", words_model, data, out,
                     dataclasses.replace(settings, resume=True))  # fmt: skip
    assert again["epochs"] == evals
    argv = ["finetune", "text-classification", "--model", str(words_model), "--train",
            str(tmp_path / "train.csv"), "--validation", str(tmp_path / "dev.csv"),
            "--text-column", "headline", "--label-column", "topic", "--epochs", "1",
            "--metric", "f2", "--out", str(tmp_path / "bad")]  # fmt: skip
    assert main(argv) == 2
    assert (
        "--metric f2: not a figure of text-classification's evaluation; its figures are "
        "accuracy, macro_f1, mcc, micro_f1" in capsys.readouterr().err
    )


def test_activation_checkpointing_fine_tunes_the_same_model(words_model, tmp_path, monkeypatch):
    """Fine-tuning with --activation-checkpointing: the same epochs' scores and the same
    weights as without (dropout's masks replayed in the backward pass)."""
    from safetensors.torch import load_file

    import bertkit.core.model

    from helpers import OWN_QUICK, topic_files

    replays, real = [], bertkit.core.model.activation_checkpoint
    monkeypatch.setattr(bertkit.core.model, "activation_checkpoint",
                        lambda *a, **k: replays.append(1) or real(*a, **k))  # fmt: skip
    data = topic_files(tmp_path)
    runs = [
        finetune("text-classification", words_model, data, tmp_path / f"r{int(on)}",
                 FinetuneConfig(**OWN_QUICK | {"epochs": 2}, activation_checkpointing=on))
        for on in (False, True)
    ]  # fmt: skip
    assert replays  # the second run replayed its layers
    assert [e["score"] for e in runs[1]["epochs"]] == pytest.approx(
        [e["score"] for e in runs[0]["epochs"]], abs=1e-6
    )
    plain, replayed = (load_file(tmp_path / f"r{on}" / "model.safetensors") for on in (0, 1))
    for name, weight in plain.items():
        torch.testing.assert_close(replayed[name], weight, atol=1e-6, rtol=1e-5)


def test_fine_tuning_steps_get_host_layouts(words_model, tmp_path, monkeypatch):
    """As pre-training's: every forward of a bertkit head, training and evaluation, gets the
    layouts worked out on the host (tests/core/test_heads.py: the same as the forward's own)."""
    from bertkit.core.model import BertModel

    from helpers import OWN_QUICK, topic_files

    seen, real = [], BertModel.forward
    monkeypatch.setattr(BertModel, "forward", lambda self, *a, **k: seen.append(
        (self.training, k.get("layouts") is not None)) or real(self, *a, **k))  # fmt: skip
    finetune("text-classification", words_model, topic_files(tmp_path), tmp_path / "run",
             FinetuneConfig(**OWN_QUICK | {"epochs": 1}))  # fmt: skip
    evaluated = [given for training, given in seen if not training]
    assert evaluated and len(evaluated) < len(seen) and all(given for _, given in seen)


@pytest.mark.slow  # a process per kill
def test_a_finetuning_run_killed_at_any_write_resumes_to_the_same_bytes(words_model, tmp_path):
    """SIGKILL at the files a fine-tuning run puts in place (the first write of its model, of
    its trainer state and of its results, and the run's last write), before the rename with the
    file half written, after the last rename, and inside log.jsonl's first and last appends:
    `--resume` then ends with the model bytes, losses and dev figures of a run never killed."""
    import subprocess
    import sys

    from helpers import topic_files, two_at_a_time

    data = topic_files(tmp_path)
    driver = tmp_path / "killer.py"
    driver.write_text(KILLER)

    def run(out, kill_at=0, when="before", *extra):
        argv = ["finetune", "text-classification", "--model", str(words_model), "--train",
                data.train, "--validation", data.validation, "--text-column", "headline",
                "--label-column", "topic", "--epochs", "2", "--batch-size", "16",
                "--max-seq-length", "32", "--out", str(out), *extra]  # fmt: skip
        env = {**os.environ, "KILL_AT": str(kill_at), "KILL_WHEN": when, "OMP_NUM_THREADS": "1",
               "WRITES": str(out) + ".writes", "TRAINED": str(out) + ".trained"}  # fmt: skip
        Path(env["TRAINED"]).unlink(missing_ok=True)
        done = subprocess.run([sys.executable, str(driver), *argv], env=env,
                              capture_output=True, text=True)  # fmt: skip
        trained = Path(env["TRAINED"])
        done.batches = len(trained.read_text().splitlines()) if trained.exists() else 0
        return done

    whole = run(tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    writes = (tmp_path / "whole.writes").read_text().splitlines()
    appends = int((tmp_path / "whole.writes.log").read_text())
    firsts = {name: writes.index(name) + 1 for name in writes}
    assert {"model.safetensors", "trainer_state.pt", "results.json"} <= set(firsts), writes
    assert whole.batches >= 8 and appends >= 4, (whole.batches, appends)

    def train_losses(directory):
        lines = (directory / "log.jsonl").read_text().splitlines()
        return [(e["step"], e["loss"]) for e in map(json.loads, lines) if e["split"] == "train"]

    expected = (tmp_path / "whole" / "model.safetensors").read_bytes()
    dev = json.loads((tmp_path / "whole" / "results.json").read_text())["dev"]
    # the first write of the model, of the trainer's state and of the results, and the run's
    # last write (every write of a save is swept by tests/training/test_loop.py's kill test)
    points = sorted({firsts["model.safetensors"], firsts["trainer_state.pt"],
                     firsts["results.json"], len(writes)})  # fmt: skip
    checkpointed = firsts["trainer_state.pt"]  # from this write on, a resume skips the trained
    kills = [(n, "before") for n in points] + [(len(writes), "after")]
    kills += [(1, "log"), (appends, "log")]  # inside log.jsonl's first and last appends

    def check(kill):
        at, when = kill
        out = tmp_path / f"killed_{at}_{when}"
        killed = run(out, at, when)
        assert killed.returncode == -9, (at, when, killed.stderr[-2000:])
        resumed = run(out, 0, "before", "--resume")
        assert resumed.returncode == 0, (at, when, resumed.stderr[-3000:])
        assert (out / "model.safetensors").read_bytes() == expected, (at, when)
        assert train_losses(out) == train_losses(tmp_path / "whole"), (at, when)
        assert json.loads((out / "results.json").read_text())["dev"] == dev, (at, when)
        # it resumed, not trained again from the start: past the first checkpoint the resumed
        # process takes fewer batches than a whole run, after the last write none
        if when == "after":
            assert resumed.batches == 0, (at, when, resumed.batches)
        elif (when == "log" and at == appends) or (when == "before" and at > checkpointed):
            assert 0 <= resumed.batches < whole.batches, (at, when, resumed.batches)
        assert killed.batches + resumed.batches >= whole.batches, (at, when)

    two_at_a_time(check, kills)


@pytest.mark.slow  # three fine-tuning runs
def test_parity_fine_tuning_follows_transformers_run_for_run(words_model, tmp_path, transformers):
    """`--parity --precision fp32`: a whole fine-tuning run (two epochs, every step's loss, the
    dev figures) gives the numbers of transformers' BertForSequenceClassification started from
    the same weights and run on the same batches with the same dropout draws. Without
    `--parity` the runs part: bertkit's masks are then its own (the same distribution)."""
    from bertkit.finetuning.train import build_model

    from helpers import OWN_QUICK, hf_config, topic_files

    class Theirs(torch.nn.Module):
        def __init__(self, ours) -> None:
            super().__init__()
            self.hf = transformers.BertForSequenceClassification(hf_config(ours.config))
            self.hf.load_state_dict(ours.state_dict(), strict=True)
            self.config = ours.config

        calls = 0  # forward passes transformers' model made (training and evaluation)

        def forward(self, **inputs):
            Theirs.calls += 1
            return self.hf(**inputs)

        def save_pretrained(self, directory, tokenizer=None) -> None:
            self.hf.save_pretrained(directory)
            tokenizer.save_pretrained(directory)

    data = topic_files(tmp_path)

    def losses(directory):
        lines = (directory / "log.jsonl").read_text().splitlines()
        return [e["loss"] for e in map(json.loads, lines) if e["split"] == "train"]

    runs = {}
    for parity in (True, False):
        config = FinetuneConfig(**OWN_QUICK | {"epochs": 2, "parity": parity,
                                               "precision": "fp32"})  # fmt: skip
        theirs = lambda task, model, seed: Theirs(build_model(task, model, seed))  # noqa: E731
        for side, build in (("ours", None), ("theirs", theirs)) if parity else (("ours", None),):
            out = tmp_path / f"{side}_{parity}"
            results = finetune("text-classification", words_model, data, out, config, build=build)
            runs[side, parity] = losses(out), results["dev"]
    (ours, ours_dev), (theirs, theirs_dev) = runs["ours", True], runs["theirs", True]
    # transformers' model made the "theirs" run: a forward of its own for every training step
    assert Theirs.calls >= len(theirs) >= 5, (Theirs.calls, len(theirs))
    assert len(ours) >= 5 and ours == pytest.approx(theirs, abs=1e-5), (ours, theirs)
    assert ours_dev == pytest.approx(theirs_dev, abs=1e-6)
    assert runs["ours", False][0] != pytest.approx(theirs, abs=1e-3)


def test_a_fine_tuning_run_ends_where_a_transformers_users_loop_ends(
    words_model, tmp_path, transformers, monkeypatch
):
    """The loop itself against the one transformers' documentation teaches, written here
    without bertkit's Trainer: transformers' BertForSequenceClassification from bertkit's
    starting weights, fed bertkit's batches (dropout 0, fp32, random batches), AdamW over the
    decay groups (eps 1e-6, weight decay 0.01), linear warm-up over a tenth of the steps then
    decay, gradients clipped at 1. One epoch of 20 steps: the same final weights (the
    --parity run against transformers' model inside bertkit's loop is the test above)."""
    from safetensors.torch import load_file

    from bertkit.finetuning import train as run_module
    from bertkit.finetuning.train import build_model

    from helpers import hf_config, topic_files

    start, batches = {}, []
    real_next = run_module.FinetuneData.next_batch

    def recorded(self):
        batch = real_next(self)
        batches.append({k: v.clone() for k, v in batch.items() if torch.is_tensor(v)})
        return batch

    def build(task, model, seed):  # what finetune builds (dropout 0), its weights kept
        net = build_model(task, model, seed, dropout=0.0)
        start.update({k: v.clone() for k, v in net.state_dict().items()})
        return net

    monkeypatch.setattr(run_module.FinetuneData, "next_batch", recorded)
    config = FinetuneConfig(epochs=1, batch_size=8, max_seq_length=64, progress=False,
                            learning_rate=5e-4, dropout=0.0, precision="fp32",
                            bucket_batches=1, seed=7)  # fmt: skip
    out = tmp_path / "ours"
    finetune("text-classification", words_model, topic_files(tmp_path), out, config, build=build)
    assert len(batches) == 20

    from bertkit.core.config import BertConfig

    ours_config = BertConfig.from_json_file(out / "config.json")
    theirs = transformers.BertForSequenceClassification(
        hf_config(ours_config, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    )
    theirs.load_state_dict(start, strict=True)
    no_decay = ("bias", "LayerNorm.weight", "LayerNorm.bias")
    groups = [
        {"params": [p for n, p in theirs.named_parameters() if not n.endswith(no_decay)],
         "weight_decay": 0.01},
        {"params": [p for n, p in theirs.named_parameters() if n.endswith(no_decay)],
         "weight_decay": 0.0},
    ]  # fmt: skip
    optimizer = torch.optim.AdamW(groups, lr=5e-4, eps=1e-6)
    # bertkit's documented schedule (training.optim.warmup_linear_decay), written out: up to the
    # peak on the warm-up's last step, then down; transformers' get_linear_schedule_with_warmup
    # is the same but spends the first step at a learning rate of 0
    total, warm = len(batches), 2
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warm if s < warm else (total - s) / (total - warm + 1)
    )
    theirs.train()
    for batch in batches:
        inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask", "labels")}
        theirs(**inputs).loss.backward()
        torch.nn.utils.clip_grad_norm_(theirs.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    ours = load_file(str(out / "model.safetensors"))
    moved = max(float((ours[k] - start[k]).abs().max()) for k in ours if k in start)
    assert moved > 1e-3  # the run learnt: a loop that did nothing would fail here
    for name, value in theirs.state_dict().items():
        if name in ours:
            torch.testing.assert_close(
                ours[name], value, atol=2e-5, rtol=0, msg=lambda m, n=name: f"{n}: {m}"
            )
