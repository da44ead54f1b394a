"""`token-classification` on users' own tagged words (bertkit.tasks.token_classification and
tagging): entity types of their own in IOB1/IOB2, CoNLL-style columns and token/tag lists,
schemes checked line by line, stride windows, entities with character offsets."""

from __future__ import annotations

import json

import pytest

from bertkit.core.tokenizer import BertTokenizer
from bertkit.finetuning.train import FinetuneConfig, finetune
from bertkit.inference.predict import Predictor
from bertkit.tasks import get_task
from bertkit.tasks.base import DataError
from bertkit.tasks.own import DataConfig
from bertkit.tasks.tagging import TaggedSentence, detect_scheme, max_context, word_windows

from helpers import OWN_QUICK, tagged_sentences


def to_iob1(tags):
    """IOB2 -> IOB1: B- only where an entity follows one of its type."""
    out = []
    for i, tag in enumerate(tags):
        if tag.startswith("B-") and not (i and tags[i - 1][2:] == tag[2:] and tags[i - 1] != "O"):
            tag = "I-" + tag[2:]
        out.append(tag)
    return out


def write_conll(path, sentences, scheme="iob2"):
    lines = ["-DOCSTART-\tO", ""]
    for words, tags in sentences:
        tags = to_iob1(tags) if scheme == "iob1" else tags
        lines += [f"{w}\t{t}" for w, t in zip(words, tags, strict=True)] + [""]
    path.write_text("\n".join(lines) + "\n")
    return path


TAGGING = OWN_QUICK | {"epochs": 10}


def conll_data(tmp_path, scheme="iob2", **extra):
    return DataConfig(
        train=str(write_conll(tmp_path / "train.conll", tagged_sentences(400, 0), scheme)),
        validation=str(write_conll(tmp_path / "dev.conll", tagged_sentences(40, 1), scheme)),
        **extra,
    )


@pytest.mark.slow
def test_own_entity_types_end_to_end(words_model, tmp_path, transformers):
    out = tmp_path / "run"
    results = finetune("token-classification", words_model, conll_data(tmp_path), out,
                       FinetuneConfig(**TAGGING))  # fmt: skip
    assert results["dev"]["f1"] >= 0.85  # a word-by-word linear tagger: >= 0.95 (test_floors)
    assert {"f1", "precision", "recall", "accuracy", "f1_city", "f1_food", "macro_f1"} <= set(
        results["dev"]
    )
    read = results["read"]["train"]
    assert read["scheme"] == "iob2" and set(read["entity_types"]) == {"city", "food"}
    per_type = results["report"]["dev"]["per_class"]
    assert set(per_type) == {"city", "food"} and all(v["support"] > 0 for v in per_type.values())
    assert results["report"]["dev"]["confusion"]["labels"] == ["O", "city", "food"]
    assert (out / "confusion.png").exists()
    config = json.loads((out / "config.json").read_text())
    assert list(config["id2label"].values()) == ["O", "B-city", "I-city", "B-food", "I-food"]
    first = json.loads((out / "predictions.jsonl").read_text().splitlines()[0])
    assert set(first) == {"line", "tokens", "gold", "predicted", "correct"} and first["line"] == 3
    # raw text in: entities by word, with their characters in the text and a score
    text = "Ann loves  paris lima, and eats sushi."
    answer = Predictor(out)([text])[0]
    assert answer["words"] == ["Ann", "loves", "paris", "lima", ",", "and", "eats", "sushi", "."]
    assert answer["offsets"][2] == [11, 16]
    found = [(e["type"], text[e["start"] : e["end"]]) for e in answer["entities"]]
    assert ("food", "sushi") in found
    for entity in answer["entities"]:  # each entity's characters are its words, by offsets
        first, last = entity["words"]
        assert entity["text"] == text[answer["offsets"][first][0] : answer["offsets"][last][1]]
        assert 0 < entity["score"] <= 1
    # transformers' pipeline reads the same tag names off config.json ("first": a word takes its
    # first piece's tag, as the paper tags words and as bertkit answers)
    pipeline = transformers.pipeline("token-classification", model=str(out),
                                     aggregation_strategy="first")  # fmt: skip
    theirs = [(e["entity_group"], text[e["start"] : e["end"]]) for e in pipeline(text)]
    assert theirs == found


@pytest.mark.slow
def test_iob1_files_read_as_iob2(words_model, tmp_path):
    data = conll_data(tmp_path, "iob1")
    task = get_task("token-classification", data)
    train = task.read(None, "train")
    assert any(t.startswith("I-") and (i == 0 or s.tags[i - 1] == "O")
               for s in train for i, t in enumerate(s.tags))  # fmt: skip
    fitted = task.fitted(train)
    assert fitted.scheme == "iob1"
    assert fitted.labels() == ["O", "B-city", "I-city", "B-food", "I-food"]
    results = finetune(fitted, words_model, None, tmp_path / "run", FinetuneConfig(**TAGGING))
    assert results["dev"]["f1"] >= 0.85  # a word-by-word linear tagger: >= 0.95 (test_floors)


@pytest.mark.slow
def test_token_and_tag_lists_in_records(words_model, tmp_path):
    datasets = pytest.importorskip("datasets")
    names = ["O", "B-city", "I-city", "B-food", "I-food"]
    features = datasets.Features({
        "tokens": datasets.Sequence(datasets.Value("string")),
        "ner_tags": datasets.Sequence(datasets.ClassLabel(names=names)),
    })  # fmt: skip

    def table(sentences):
        return datasets.Dataset.from_dict(
            {"tokens": [w for w, _ in sentences],
             "ner_tags": [[names.index(t) for t in tags] for _, tags in sentences]},
            features=features,
        )  # fmt: skip

    table(tagged_sentences(400, 0)).save_to_disk(str(tmp_path / "train"))
    (tmp_path / "dev.jsonl").write_text("".join(
        json.dumps({"tokens": w, "ner_tags": t}) + "\n" for w, t in tagged_sentences(40, 1)))  # fmt: skip
    data = DataConfig(train=str(tmp_path / "train"), validation=str(tmp_path / "dev.jsonl"),
                      tags_column="ner_tags")  # fmt: skip
    results = finetune("token-classification", words_model, data, tmp_path / "run",
                       FinetuneConfig(**TAGGING))  # fmt: skip
    assert results["dev"]["f1"] >= 0.85  # a word-by-word linear tagger: >= 0.95 (test_floors)
    # records whose tags are not one per token
    (tmp_path / "bad.jsonl").write_text(
        json.dumps({"tokens": ["a", "b"], "ner_tags": ["O"]}) + "\n"
    )
    task = get_task("token-classification", DataConfig(train=str(tmp_path / "bad.jsonl"),
                                                       tags_column="ner_tags"))  # fmt: skip
    with pytest.raises(DataError, match=r"bad.jsonl:1: column 'ner_tags': 1 tags for 2 tokens"):
        task.read(None, "train")


def test_tag_sequences_that_break_the_scheme_name_the_line(tmp_path):
    sentences = tagged_sentences(20, 0)
    path = write_conll(tmp_path / "train.conll", sentences)
    lines = path.read_text().splitlines()
    bad = next(i for i, line in enumerate(lines) if i > 2 and line.endswith("\tO")
               and (lines[i - 1].endswith("\tO") or not lines[i - 1]))  # fmt: skip
    lines[bad] = lines[bad].split("\t")[0] + "\tI-food"  # an I- that continues nothing, in IOB2
    path.write_text("\n".join(lines) + "\n")
    task = get_task("token-classification", DataConfig(train=str(path)))
    with pytest.raises(DataError, match=rf"train.conll:{bad + 1}: tag 'I-food' (after|at).*IOB2"):
        task.fitted(task.read(None, "train"))
    # bare tags among IOB ones
    lines[bad] = lines[bad].split("\t")[0] + "\tfood"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=rf"train.conll:{bad + 1}: tag 'food' has no B-/I- prefix"):
        task.fitted(task.read(None, "train"))
    # a validation tag of a type training never saw
    good = write_conll(tmp_path / "good.conll", sentences)
    dev = write_conll(tmp_path / "dev.conll", [(["paris"], ["B-town"])])
    task = get_task("token-classification", DataConfig(train=str(good), validation=str(dev)))
    fitted = task.fitted(task.read(None, "train"))
    tokenizer = BertTokenizer(vocab=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "paris"])
    with pytest.raises(DataError, match=r"dev.conll:3: tag 'B-town' never occurs in the training"):
        fitted.featurize(fitted.read(None, "dev"), tokenizer, 16)


def test_plain_tags(tmp_path):
    pos = [(["ann", "loves", "paris"], ["NNP", "VBZ", "NNP"]), (["bob", "eats"], ["NNP", "VBZ"])]
    task = get_task(
        "token-classification", DataConfig(train=str(write_conll(tmp_path / "p.txt", pos)))
    )
    fitted = task.fitted(task.read(None, "train"))
    assert fitted.scheme == "plain" and fitted.labels() == ["NNP", "VBZ"]
    assert fitted.metrics == ("accuracy", "macro_f1")
    figures = fitted.score(fitted.read(None, "train"), [["NNP", "VBZ", "VBZ"], ["NNP", "VBZ"]])
    assert figures["accuracy"] == pytest.approx(0.8)


def test_schemes_detected():
    def sentences(*tag_lists):
        return [
            TaggedSentence(f"f:{i}", tuple("w" * len(t)), tuple(t)) for i, t in enumerate(tag_lists)
        ]

    assert detect_scheme(sentences(["B-X", "I-X", "O"])) == "iob2"
    assert detect_scheme(sentences(["I-X", "I-X", "O", "I-Y"])) == "iob1"
    assert detect_scheme(sentences(["I-X", "B-X"])) == "iob1"  # B- between two of a type
    assert detect_scheme(sentences(["S-X", "B-Y", "E-Y"])) == "iobes"
    assert detect_scheme(sentences(["NN", "VB"])) == "plain"
    with pytest.raises(DataError, match="every tag is O"):
        detect_scheme(sentences(["O", "O"]))


def test_stride_windows_give_each_word_its_most_context(words_model):
    assert word_windows([2, 2, 2, 2], 4, None) == [(0, 2), (2, 4)]
    assert word_windows([2, 2, 2, 2], 4, 2) == [(0, 2), (1, 3), (2, 4)]
    assert word_windows([1] * 10, 4, 2) == [(0, 4), (2, 6), (4, 8), (6, 10)]
    windows = word_windows([1] * 10, 4, 2)
    flags = max_context(windows, [1] * 10)
    chosen = {w: i for i, (first, end) in enumerate(windows)
              for w, best in zip(range(first, end), flags[i], strict=True) if best}  # fmt: skip
    assert sorted(chosen) == list(range(10))  # every word from exactly one window
    # word 3 sits at the end of window 0 (0 pieces after it) and one in from window 1's start
    assert [chosen[w] for w in range(10)] == [0, 0, 0, 1, 1, 2, 2, 3, 3, 3]
    # short sentences: the same features with and without a stride
    tokenizer = BertTokenizer.from_pretrained(words_model)
    plain, strided = (get_task("token-classification", DataConfig(stride=s)) for s in (None, 8))
    for task in (plain, strided):
        task.tag_names = ["O", "B-city", "I-city"]
    short = [plain.example_of("ann visits paris today", 0)]
    assert plain.featurize(short, tokenizer, 32) == strided.featurize(short, tokenizer, 32)
    long = [plain.example_of(" ".join(["paris", "today"] * 30), 0)]
    features = strided.featurize(long, tokenizer, 32)
    assert len(features) > 2 and all(len(f["input_ids"]) <= 32 for f in features)
    assert all("_max_context" in f for f in features)
