"""Models fine-tuned elsewhere (`bertkit.tasks.saved`): tiny random classifiers (one, two and
three labels, multi-label, regression), token classifiers and extractive readers saved by
transformers for BERT and each of the six families, and cross-encoders saved by
sentence-transformers — answered by `Predictor`, `bertkit predict` and `bertkit serve` as
`pipeline()`, `CrossEncoder.predict` and the question-answering rule (computed here from
transformers' own logits and tokenizer) answer them, on texts the models never saw."""

from __future__ import annotations

import itertools
import json
import shutil

import numpy as np
import pytest
import torch

from bertkit import cli
from bertkit.inference.predict import Predictor
from bertkit.serve.engine import ServedModel
from bertkit.tasks.saved import AGGREGATIONS, saved_head

from families import FAMILIES, PAIRS, TEXTS, build

T = pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers")

ALL = ("bert", *FAMILIES)
TAGS = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")
# texts of several words, with words split into pieces, pairs as dicts (pipeline's pair input)
INPUTS = [*TEXTS, {"text": TEXTS[0], "text_pair": PAIRS[0]}, {"text": TEXTS[3], "text_pair": "mat"}]
CLASSIFIERS = {
    "one label": {"num_labels": 1},
    "two labels": {"num_labels": 2},
    "three labels": {"id2label": {0: "negative", 1: "neutral", 2: "positive"}},
    "multi-label": {"id2label": {0: "sport", 1: "politics", 2: "tech"},
                    "problem_type": "multi_label_classification"},
    "regression": {"num_labels": 1, "problem_type": "regression"},
}  # fmt: skip
CONTEXT = " ".join(TEXTS * 4)  # over one window of the tiny models' 64 positions
QUESTIONS = [{"question": "Who sat?", "context": TEXTS[0]},
             {"question": "Where did it bark?", "context": CONTEXT}]  # fmt: skip


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("saved")
    return {family: build(family, root / family) for family in ALL}


def saved(base, folder, auto, seed=3, **config):
    """`base` with a random head of `auto`'s class, saved by transformers into `folder`."""
    shutil.copytree(base, folder)
    if "id2label" in config:
        config["label2id"] = {name: i for i, name in config["id2label"].items()}
    torch.manual_seed(seed)
    model = auto.from_config(T.AutoConfig.from_pretrained(base, **config)).eval()
    model.save_pretrained(folder)
    return folder


def rounded(value, places=5):
    """Answers with their floats rounded: equal up to float noise."""
    if isinstance(value, float):
        return round(value, places)
    if isinstance(value, dict):
        return {k: rounded(v, places) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v, places) for v in value]
    return value


def ranked(answer):
    """Ours as pipeline(top_k=None) gives them: every label and its score, best first."""
    scores = (
        answer.get("probabilities") or answer.get("scores") or {answer["label"]: answer["score"]}
    )
    return sorted(scores.items(), key=lambda item: -item[1])


@pytest.mark.parametrize("family", ALL)
def test_a_saved_classifier_answers_as_pipeline(bases, family, tmp_path):
    for kind, config in CLASSIFIERS.items():
        folder = saved(bases[family], tmp_path / kind.replace(" ", "-"),
                       T.AutoModelForSequenceClassification, **config)  # fmt: skip
        ours = Predictor(folder, precision="fp32")(INPUTS)
        pipe = T.pipeline("text-classification", model=str(folder), device="cpu")
        theirs = pipe(INPUTS, top_k=None)
        for item, got, expected in zip(INPUTS, ours, theirs, strict=True):
            labels = [(e["label"], e["score"]) for e in expected]
            assert [n for n, _ in ranked(got)] == [n for n, _ in labels], (kind, item)
            np.testing.assert_allclose([s for _, s in ranked(got)], [s for _, s in labels],
                                       atol=1e-5, err_msg=f"{family} {kind} {item}")  # fmt: skip
            assert got["label"] == expected[0]["label"]
        if kind == "multi-label":
            assert all(set(a["labels"]) == {n for n, p in a["probabilities"].items() if p >= 0.5}
                       for a in ours)  # fmt: skip


@pytest.mark.parametrize("family", ALL)
def test_a_saved_tagger_groups_entities_as_pipeline_under_each_aggregation(bases, family, tmp_path):
    folder = saved(bases[family], tmp_path / "tagger", T.AutoModelForTokenClassification,
                   id2label=dict(enumerate(TAGS)))  # fmt: skip
    predictor = Predictor(folder, precision="fp32")
    pipe = T.pipeline("token-classification", model=str(folder), device="cpu")
    found = 0
    for strategy in AGGREGATIONS:
        predictor.task = predictor.task.with_aggregation(strategy)
        for text, got in zip(TEXTS, predictor(TEXTS), strict=True):
            expected = pipe(text, aggregation_strategy=strategy)
            ours = [(e["type"], e["start"], e["end"]) for e in got["entities"]]
            theirs = [(e.get("entity_group", e.get("entity")), e["start"], e["end"])
                      for e in expected]  # fmt: skip
            assert ours == theirs, (strategy, text)
            np.testing.assert_allclose([e["score"] for e in got["entities"]],
                                       [float(e["score"]) for e in expected], atol=1e-5)  # fmt: skip
            assert all(e["text"] == text[e["start"] : e["end"]] for e in got["entities"])
            if strategy == "none":
                assert [e["index"] for e in got["entities"]] == [e["index"] for e in expected]
            found += len(ours)
    assert found > 10  # a random head tags something


def reference_answers(folder, items, max_length, stride, impossible=False, longest=15):
    """The question-answering rule from transformers' own tokenizer (its overflowing windows)
    and logits: context pieces and [CLS] in each window's softmax, the best span of context
    pieces by p(start)·p(end), end >= start, at most `longest` pieces; with `impossible`, ""
    where the [CLS] span's least p·p beats it."""
    tokenizer = T.AutoTokenizer.from_pretrained(folder)
    model = T.AutoModelForQuestionAnswering.from_pretrained(folder).eval()
    answers = []
    for item in items:
        encoded = tokenizer(item["question"], item["context"], truncation="only_second",
                            max_length=max_length, stride=stride, return_overflowing_tokens=True,
                            return_offsets_mapping=True, padding=True, return_tensors="pt")  # fmt: skip
        inputs = {k: v for k, v in encoded.items()
                  if k in ("input_ids", "attention_mask", "token_type_ids")}  # fmt: skip
        if model.config.model_type in (
            "roberta",
            "xlm-roberta",
            "distilbert",
            "mpnet",
            "modernbert",
        ):
            inputs.pop("token_type_ids", None)
        with torch.no_grad():
            out = model(**inputs)
        best, null = None, 1.0
        for w in range(len(encoded["input_ids"])):
            context = np.array([s == 1 for s in encoded.sequence_ids(w)])
            allowed = context | (encoded["input_ids"][w].numpy() == tokenizer.cls_token_id)
            allowed &= encoded["attention_mask"][w].numpy().astype(bool)
            probs = []
            for logits in (out.start_logits[w], out.end_logits[w]):
                values = np.where(allowed, logits.double().numpy(), -10000.0)
                values = np.exp(values - values.max())
                probs.append(values / values.sum())
            null = min(null, probs[0][0] * probs[1][0])
            for i in np.flatnonzero(context):
                for j in np.flatnonzero(context):
                    if i <= j < i + longest:
                        score = probs[0][i] * probs[1][j]
                        if best is None or score > best[0]:
                            offsets = encoded["offset_mapping"][w]
                            best = (score, int(offsets[i][0]), int(offsets[j][1]))
        if impossible and null > best[0]:
            answers.append(("", None, None, null))
        else:
            answers.append((item["context"][best[1] : best[2]], best[1], best[2], best[0]))
    return answers


@pytest.mark.parametrize("family", ALL)
def test_a_saved_reader_answers_by_the_question_answering_rule(bases, family, tmp_path):
    folder = saved(bases[family], tmp_path / "reader", T.AutoModelForQuestionAnswering)
    for impossible in (False, True):
        predictor = Predictor(folder, precision="fp32", handle_impossible_answer=impossible)
        length = predictor.max_seq_length
        expected = reference_answers(folder, QUESTIONS, length, min(128, length // 2), impossible)
        for got, (text, start, end, score) in zip(predictor(QUESTIONS), expected, strict=True):
            assert (got["answer"], got["start"], got["end"]) == (text, start, end), family
            assert got["score"] == pytest.approx(score, abs=1e-5)
    assert len(predictor.task.featurize([predictor.task.example_of(QUESTIONS[1], 0)],
                                        predictor.tokenizer, length)) > 1  # windows  # fmt: skip


@pytest.mark.parametrize("family", ["bert", "xlm-roberta"])
def test_a_sentence_transformers_cross_encoder_reranks_as_cross_encoder_predict(bases, family,
                                                                              tmp_path):  # fmt: skip
    """A cross-encoder saved by sentence-transformers (with its own config and modules.json:
    not taken for an embedding model): /rerank, /v1/rerank, `predict --rerank` and
    `Predictor.relevance` score as `CrossEncoder.predict`, its sigmoid or a saved identity, and
    raw logits when asked."""
    from sentence_transformers.cross_encoder import CrossEncoder

    pairs = [(TEXTS[0], p) for p in PAIRS] + [(TEXTS[3], TEXTS[1])]
    for name, activation in (("sigmoid", None), ("identity", torch.nn.Identity())):
        torch.manual_seed(5)
        model = CrossEncoder(str(bases[family]), num_labels=1, device="cpu",
                             activation_fn=activation)  # fmt: skip
        # the drawn head's scores differ by 1e-6, where the order of a ranking is a coin toss:
        # a head 100 times as large sets them apart (1e-3 and more)
        with torch.no_grad():
            [m for m in model.model.modules() if isinstance(m, torch.nn.Linear)
             and m.out_features == 1][-1].weight.mul_(100.0)  # fmt: skip
        folder = tmp_path / name
        model.save(str(folder))
        assert saved_head(folder).saved_by == "sentence-transformers"
        expected = CrossEncoder(str(folder), device="cpu").predict(pairs)
        predictor = Predictor(folder, precision="fp32")
        np.testing.assert_allclose(predictor.relevance(pairs), expected, atol=1e-5)
        raw = CrossEncoder(str(folder), device="cpu").predict(
            pairs, activation_fn=torch.nn.Identity()
        )
        np.testing.assert_allclose(predictor.relevance(pairs, raw=True), raw, atol=1e-5)
        served = ServedModel(folder, precision="fp32")
        body = {"query": TEXTS[0], "texts": PAIRS}
        answer = served.shape("rerank", (items := served.parse("rerank", body)),
                              served.run("rerank", items))  # fmt: skip
        # best first by CrossEncoder's scores (two within 1e-5 of each other either way round)
        ranked = [a["index"] for a in answer]
        assert sorted(ranked) == [0, 1, 2, 3]
        assert all(expected[a] >= expected[b] - 1e-5 for a, b in itertools.pairwise(ranked)), ranked
        np.testing.assert_allclose([a["score"] for a in answer], np.sort(expected[:4])[::-1],
                                   atol=1e-5)  # fmt: skip
        items = served.parse("rerank", body | {"raw_scores": True})
        np.testing.assert_allclose(sorted(served.run("rerank", items)), sorted(raw[:4]), atol=1e-5)
        cohere = served.parse("v1/rerank", {"query": TEXTS[0], "documents": PAIRS, "top_n": 2})
        top = served.shape("v1/rerank", cohere, served.run("v1/rerank", cohere))["results"]
        assert [r["index"] for r in top] == [a["index"] for a in answer[:2]]
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"query": TEXTS[0], "texts": PAIRS}) + "\n")
    out = tmp_path / "ranked.jsonl"
    assert cli.main(["predict", "--model", str(folder), "--input", str(rows), "--rerank",
                     "--precision", "fp32", "--out", str(out), "--quiet"]) in (0, None)  # fmt: skip
    ranking = json.loads(out.read_text())["ranking"]
    assert [r["index"] for r in ranking] == [a["index"] for a in answer]


def test_predict_and_serve_take_a_saved_classifier_tagger_and_reader(bases, tmp_path):
    """Every door of a folder transformers saved: `bertkit predict` (texts, a file, a corpus
    folder), serve's /predict and `POST /` in InferenceClient's shapes, with the Predictor's
    answers; a setting the server does not answer by is refused by name."""
    base = bases["roberta"]
    classifier = saved(base, tmp_path / "classifier", T.AutoModelForSequenceClassification,
                       **CLASSIFIERS["three labels"])  # fmt: skip
    tagger = saved(base, tmp_path / "tagger", T.AutoModelForTokenClassification,
                   id2label=dict(enumerate(TAGS)))  # fmt: skip
    reader = saved(base, tmp_path / "reader", T.AutoModelForQuestionAnswering)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(TEXTS)))
    for folder in (classifier, tagger):
        expected = Predictor(folder, precision="fp32")(TEXTS)
        out = tmp_path / f"{folder.name}.jsonl"
        cli.main(["predict", "--model", str(folder), "--input", str(rows), "--out", str(out),
                  "--precision", "fp32", "--quiet"])  # fmt: skip
        written = [json.loads(line) for line in out.read_text().splitlines()]
        assert rounded([{k: v for k, v in w.items() if k not in ("text", "id")}
                        for w in written]) == rounded(expected)  # fmt: skip
        corpus = tmp_path / f"{folder.name}-corpus"
        cli.main(["predict", "--model", str(folder), "--input", str(rows), "--out", str(corpus),
                  "--precision", "fp32", "--quiet"])  # fmt: skip
        assert json.loads((corpus / "manifest.json").read_text())["rows"] == len(TEXTS)
        served = ServedModel(folder, precision="fp32")
        items = served.parse("predict", {"inputs": TEXTS})
        assert rounded(served.run("predict", items)) == rounded(expected)
    served = ServedModel(classifier, precision="fp32")
    endpoint, body, style = served.route({"inputs": TEXTS[0], "parameters": {"top_k": 2}})
    items = served.parse(endpoint, body)
    answer = served.shape(endpoint, items, served.run(endpoint, items), style)
    expected = Predictor(classifier, precision="fp32")([TEXTS[0]])[0]
    assert rounded([(e["label"], e["score"]) for e in answer[0]]) == rounded(ranked(expected)[:2])
    served = ServedModel(tagger, precision="fp32")
    endpoint, body, style = served.route({"inputs": TEXTS[1]})
    items = served.parse(endpoint, body)
    entities = served.shape(endpoint, items, served.run(endpoint, items), style)
    pipe = T.pipeline("token-classification", model=str(tagger), aggregation_strategy="simple")
    assert [(e["entity_group"], e["start"], e["end"]) for e in entities] == \
        [(e["entity_group"], e["start"], e["end"]) for e in pipe(TEXTS[1])]  # fmt: skip
    with pytest.raises(ValueError, match="answers with 'simple' .*--aggregation-strategy"):
        served.route({"inputs": TEXTS[1], "parameters": {"aggregation_strategy": "max"}})
    served = ServedModel(reader, precision="fp32")
    endpoint, body, style = served.route({"inputs": QUESTIONS[1]})
    items = served.parse(endpoint, body)
    answer = served.shape(endpoint, items, served.run(endpoint, items), style)
    expected = Predictor(reader, precision="fp32")([QUESTIONS[1]])[0]
    assert rounded(answer) == rounded(
        {
            "answer": expected["answer"],
            "score": expected["score"],
            "start": expected["start"],
            "end": expected["end"],
        }
    )
    with pytest.raises(ValueError, match="no context"):
        served.parse("predict", {"inputs": {"question": "Who?", "context": " "}})


def test_a_head_bertkit_does_not_run_and_labels_that_disagree_are_refused(bases, tmp_path,
                                                                          capsys):  # fmt: skip
    folder = saved(bases["bert"], tmp_path / "lm", T.AutoModelForCausalLM, is_decoder=True)
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["BertLMHeadModel"]
    with pytest.raises(ValueError, match=r"BertLMHeadModel, a head bertkit does not run; it "
                       r"runs \*ForSequenceClassification, \*ForTokenClassification"):  # fmt: skip
        Predictor(folder)
    labels = saved(bases["bert"], tmp_path / "labels", T.AutoModelForSequenceClassification,
                   **CLASSIFIERS["three labels"])  # fmt: skip
    config = json.loads((labels / "config.json").read_text())
    (labels / "config.json").write_text(json.dumps(config | {"num_labels": 2}))
    with pytest.raises(ValueError, match="num_labels is 2 but id2label names 3 labels"):
        Predictor(labels)
    assert cli.main(["predict", "--model", str(labels), "a text"]) == 2
    assert "num_labels is 2 but id2label names 3" in capsys.readouterr().err


def test_fine_tuning_a_saved_classifier_continues_it_on_its_labels(bases, tmp_path, capsys):
    """`finetune text-classification --model FOLDER` on a classifier transformers saved: the
    training file's labels are the classifier's (in its own order, not sorted), so its head
    goes on (a near-zero learning rate leaves pipeline()'s answers as they were), saved
    with its order; labels it was not trained on get a new classifier, and the run says which."""
    from bertkit.finetuning.train import FinetuneConfig, finetune

    from helpers import TOPICS, topic_files

    data = topic_files(tmp_path)
    order = sorted(TOPICS, reverse=True)
    folder = saved(bases["bert"], tmp_path / "classifier", T.AutoModelForSequenceClassification,
                   id2label=dict(enumerate(order)))  # fmt: skip
    config = FinetuneConfig(epochs=1, batch_size=32, max_seq_length=64, learning_rate=1e-12,
                            max_train_examples=32, precision="fp32")  # fmt: skip
    finetune("text-classification", folder, data, tmp_path / "continued", config)
    assert f"continues {folder}'s classifier" in capsys.readouterr().err
    written = json.loads((tmp_path / "continued" / "config.json").read_text())
    assert [written["id2label"][str(i)] for i in range(len(order))] == order
    texts = ["stocks and shares", "the match and the goal"]
    before = T.pipeline("text-classification", model=str(folder))(texts, top_k=None)
    after = Predictor(tmp_path / "continued", precision="fp32")(texts)
    for old, new in zip(before, after, strict=True):
        np.testing.assert_allclose([new["probabilities"][e["label"]] for e in old],
                                   [e["score"] for e in old], atol=1e-4)  # fmt: skip
    other = saved(bases["bert"], tmp_path / "other", T.AutoModelForSequenceClassification,
                  id2label=dict(enumerate(["x", "y", "z", "w"][: len(order)])))  # fmt: skip
    finetune("text-classification", other, data, tmp_path / "new", config)
    assert "a new classifier" in capsys.readouterr().err
    fresh = Predictor(tmp_path / "new", precision="fp32")(texts)
    theirs = T.pipeline("text-classification", model=str(other))(texts, top_k=None)
    assert not np.allclose(sorted(fresh[0]["probabilities"].values()),
                           sorted(e["score"] for e in theirs[0]), atol=1e-3)  # fmt: skip


def test_what_bertkit_fine_tunes_loads_in_pipeline_and_cross_encoder(bases, tmp_path):
    """The other way: a classifier bertkit fine-tuned answers in `pipeline()` as `Predictor`
    answers, and a regressor of text pairs (a reranker) scores in `CrossEncoder` as bertkit
    reranks it (its config.json names the identity activation)."""
    import csv

    from sentence_transformers.cross_encoder import CrossEncoder

    from bertkit.finetuning.train import FinetuneConfig, finetune
    from bertkit.tasks.own import DataConfig

    from helpers import topic_files, topic_rows

    config = FinetuneConfig(epochs=1, batch_size=16, max_seq_length=64, learning_rate=1e-3,
                            max_train_examples=64, precision="fp32", progress=False)  # fmt: skip
    finetune("text-classification", bases["bert"], topic_files(tmp_path), tmp_path / "cls", config)
    texts = ["stocks and shares rose", "the match and the goal", "a quiet day"]
    ours = Predictor(tmp_path / "cls", precision="fp32")(texts)
    theirs = T.pipeline("text-classification", model=str(tmp_path / "cls"))(texts, top_k=None)
    for got, expected in zip(ours, theirs, strict=True):
        assert rounded(ranked(got), 4) == rounded([(e["label"], e["score"]) for e in expected], 4)
    rows = topic_rows(48, 3)
    for name, part in (("train", rows[:32]), ("dev", rows[32:])):
        with open(tmp_path / f"pairs-{name}.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["query", "text", "score"])
            writer.writerows([[a["headline"], b["headline"], float(a["topic"] == b["topic"])]
                              for a, b in zip(part, part[1:] + part[:1], strict=True)])  # fmt: skip
    data = DataConfig(train=str(tmp_path / "pairs-train.csv"),
                      validation=str(tmp_path / "pairs-dev.csv"), text_column="query",
                      text_pair_column="text", label_column="score", problem="regression")  # fmt: skip
    finetune("text-classification", bases["bert"], data, tmp_path / "reranker", config)
    pairs = [(texts[0], texts[1]), (texts[0], "shares fell"), (texts[2], texts[1])]
    expected = CrossEncoder(str(tmp_path / "reranker"), device="cpu").predict(pairs)
    ours = Predictor(tmp_path / "reranker", precision="fp32").relevance(pairs)
    np.testing.assert_allclose(ours, expected, atol=1e-5)
