"""Task readers on the official layouts (shared GLUE/SQuAD/CoNLL files where we have them,
fixtures in tests/fixtures where we do not), their errors, and fine-tuning end to end on a
tiny model and a few dozen examples per task."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from conftest import data_path

from bertkit import BertConfig, BertModel, cli
from bertkit.finetune import FinetuneConfig, evaluate, finetune, finetune_seeds
from bertkit.predict import Predictor
from bertkit.tasks import DataError, get_task
from bertkit.tasks.glue import GLUE
from bertkit.tasks.squad import read_squad, split_by_article, with_unanswerable
from bertkit.tokenizer import train_vocab

FIXTURES = Path(__file__).parent / "fixtures"


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


def test_swag_reader_and_errors(tmp_path):
    task = get_task("swag")
    train = task.read(FIXTURES / "swag", "train")
    assert [e.label for e in train] == [0, 1, 2, 3] and len(train[0].endings) == 4
    assert task.read(FIXTURES / "swag", "test")[0].label is None
    text = (FIXTURES / "swag" / "train.csv").read_text().replace(",3\n", ",7\n")
    (tmp_path / "train.csv").write_text(text)
    with pytest.raises(DataError, match=r"train.csv:5: label 7 is not 0-3"):
        task.read(tmp_path, "train")


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


# --------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A random 2-layer BERT with a vocabulary learned from the fixtures and the shared data."""
    texts = []
    for path in FIXTURES.rglob("*"):
        if path.is_file():
            texts += path.read_text().splitlines()
    directory = tmp_path_factory.mktemp("tiny")
    tokenizer = train_vocab(texts=texts, vocab_size=600, min_frequency=1, show_progress=False)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    BertModel(config).save_pretrained(directory, tokenizer=tokenizer)
    return directory


def _grow(src: Path, dst: Path, copies: int) -> Path:
    """The fixture files with their data rows repeated (a few dozen examples)."""
    dst.mkdir(parents=True)
    for path in src.iterdir():
        lines = path.read_text().splitlines(keepends=True)
        head, rows = lines[:1], lines[1:]
        if path.suffix == ".csv":
            (dst / path.name).write_text("".join(head + rows * copies))
        else:
            (dst / path.name).write_text("".join(head + rows * copies))
    return dst


QUICK = dict(epochs=2, batch_size=8, max_seq_length=64, progress=False, learning_rate=1e-3)


@pytest.mark.parametrize("task", ["mnli", "qqp", "qnli"])
def test_finetune_glue_fixtures_end_to_end(task, tiny_checkpoint, tmp_path):
    data = _grow(FIXTURES / "glue" / GLUE[task].folder, tmp_path / "data", 5)
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


def test_predict_command_line(tiny_checkpoint, tmp_path, capsys):
    data = _grow(FIXTURES / "glue" / "QNLI", tmp_path / "data", 5)
    out = tmp_path / "run"
    argv = ["finetune", "qnli", "--model", str(tiny_checkpoint), "--data", str(data)]
    argv += ["--out", str(out), "--epochs", "1", "--batch-size", "8", "--max-seq-length", "64"]
    assert cli.main(argv) == 0
    assert "accuracy" in json.loads((out / "results.json").read_text())["dev"]
    capsys.readouterr()
    assert cli.main(["predict", "--model", str(out), "Who painted it?", "Anna painted it."]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["label"] in ("entailment", "not_entailment")
    assert cli.main(["predict", "--model", str(out), "only one text"]) == 2
    assert "takes two texts" in capsys.readouterr().err
    bad = tmp_path / "in.jsonl"
    bad.write_text('{"text": "a", "text_pair": "b"}\n{oops\n')
    assert cli.main(["predict", "--model", str(out), "--input", str(bad)]) == 2
    assert "in.jsonl:2: not JSON" in capsys.readouterr().err
    assert cli.main(["evaluate", "--model", str(out), "--data", str(data), "--split", "dev"]) == 0


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
    for entity in tagged[0]["entities"]:  # raw text: character offsets into it
        assert set(entity) == {"type", "text", "words", "score", "start", "end"}
        assert text[entity["start"] : entity["end"]] == entity["text"]
    assert all(set(e) == {"type", "text", "words", "score"} for e in tagged[1]["entities"])
    assert tagged[0]["offsets"][6] == [text.index("Paris"), text.index("Paris") + 5]
    assert all(
        text[a:b] == w for w, (a, b) in zip(tagged[0]["words"], tagged[0]["offsets"], strict=True)
    )
    assert "offsets" not in tagged[1] and tagged[2]["offsets"] == [[0, 2], [3, 10]]  # dict input


def test_finetune_swag_fixture(tiny_checkpoint, tmp_path):
    data = _grow(FIXTURES / "swag", tmp_path / "swag", 6)
    results = finetune("swag", tiny_checkpoint, data, tmp_path / "run", FinetuneConfig(**QUICK))
    assert set(results["dev"]) == {"accuracy"}
    assert results["train_examples"] == 24


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


def test_finetune_resumes_after_a_kill(tiny_checkpoint, tmp_path, monkeypatch):
    """A run that dies in epoch 2 resumes from the epoch-1 checkpoint to the same result."""
    import bertkit.finetune as ft

    data = _grow(FIXTURES / "glue" / "QNLI", tmp_path / "data", 5)
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
    with pytest.raises(AssertionError, match="trained again"):
        other = FinetuneConfig(**{**QUICK, "learning_rate": 1e-4}, resume=True)
        finetune("qnli", tiny_checkpoint, data, tmp_path / "run", other)


def test_bilstm_heads_of_table_5(tiny_checkpoint, tmp_path):
    """`+ BiLSTM`: padding never reaches the recurrence, and the head round-trips through
    finetune -> evaluate/predict."""
    from bertkit.heads import BertBiLSTMForQuestionAnswering

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
    from bertkit.finetune import finetune_grid

    data = _grow(FIXTURES / "glue" / "QNLI", tmp_path / "data", 3)
    grid = {"batch_size": (8,), "learning_rate": (1e-3, 1e-5), "epochs": (1,)}
    config = FinetuneConfig(max_seq_length=64, progress=False)
    results = finetune_grid("qnli", tiny_checkpoint, data, tmp_path / "grid", config, grid=grid)
    assert [p["dir"] for p in results["grid"]] == ["b8_lr0.001_e1", "b8_lr1e-05_e1"]
    best = max(results["grid"], key=lambda p: p["score"])
    assert results["selected"]["dir"] == best["dir"] and results["dev"] == best["dev"]
    for point in results["grid"]:
        saved = json.loads((tmp_path / "grid" / point["dir"] / "results.json").read_text())
        assert saved["hyperparameters"]["learning_rate"] == point["learning_rate"]


def test_random_init_finetuning_draws_each_seed_its_own_encoder(tiny_checkpoint, tmp_path):
    """`bertkit finetune --config SIZE --vocab DIR`: the no-pre-training row. Nothing is read
    but the config and vocabulary; each seed initialises the whole model afresh, and the
    pre-trained path still loads the checkpoint's weights."""
    from safetensors.torch import load_file

    from bertkit.finetune import build_model, random_init_dir

    data = _grow(FIXTURES / "glue" / "QNLI", tmp_path / "data", 5)
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


@pytest.mark.parametrize("task", ["conll2003-pos", "conll2003-chunk"])
def test_finetune_pos_and_chunk(task, tiny_checkpoint, tmp_path):
    data = tmp_path / "conll"
    data.mkdir()
    for name in ("train.txt", "valid.txt", "test.txt"):
        (data / name).write_text((FIXTURES / "conll2003_iob1" / name).read_text() * 4)
    out = tmp_path / "run"
    results = finetune(task, tiny_checkpoint, data, out, FinetuneConfig(**{**QUICK, "epochs": 4}))
    metric = "accuracy" if task.endswith("pos") else "f1"
    assert 0.0 <= results["dev"][metric] <= 1.0
    line = (out / "predictions_dev.conll").read_text().splitlines()[0].split()
    assert line[0] == "EU" and len(line) == 5  # word, the two other columns, gold, predicted
    tagged = Predictor(out)(["EU rejects German call"])
    assert len(tagged[0]["tags"]) == 4


def test_one_writer_per_folder_and_no_silent_reuse(tiny_checkpoint, tmp_path):
    from bertkit._io import run_lock
    from bertkit.checkpoint import convert

    data = _grow(FIXTURES / "glue" / "QNLI", tmp_path / "data", 3)
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


def test_vocab_with_a_byte_order_mark_and_an_empty_pair(tmp_path):
    from bertkit.tokenizer import BertTokenizer, load_vocab

    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]
    (tmp_path / "vocab.txt").write_text("\ufeff" + "\n".join(tokens) + "\n", encoding="utf-8")
    assert load_vocab(tmp_path / "vocab.txt") == tokens
    tokenizer = BertTokenizer.from_pretrained(tmp_path)
    assert tokenizer("a", "")["input_ids"] == tokenizer("a")["input_ids"] == [2, 5, 3]


def test_a_tab_inside_a_sentence_is_named_not_cut(tmp_path):
    mrpc = tmp_path / "MRPC"
    mrpc.mkdir()
    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    (mrpc / "train.tsv").write_text(header + "1\t1\t2\tA cat.\tA cat\tsat.\n")
    with pytest.raises(
        DataError, match=r"train.tsv:2: 6 tab-separated columns, the file's rows have 5"
    ):
        get_task("mrpc").read(mrpc, "train")
