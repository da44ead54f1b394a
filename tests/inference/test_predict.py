"""`bertkit predict` and the Predictor on a fine-tuned checkpoint (bertkit.inference.predict), and whole
files (predict_file, `bertkit predict --input --output`): streamed in chunks, CSV/JSONL in and
out, stdin, entities with offsets, bad rows by line."""

from __future__ import annotations

import csv
import io
import json

import pytest

from bertkit import cli
from bertkit.cli import main
from bertkit.finetuning.train import FinetuneConfig, finetune
from bertkit.inference.predict import Predictor, predict_file
from bertkit.rows import read_conll_columns
from bertkit.tasks.base import DataError
from bertkit.tasks.own import DataConfig

from helpers import FIXTURES, OWN_QUICK, conll_text, grow_copies, tagged_sentences, topic_rows


def test_predict_command_line(tiny_checkpoint, tmp_path, capsys):
    data = grow_copies(FIXTURES / "glue" / "QNLI", tmp_path / "data", 5)
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
    # the task's own files, as they come (GLUE's TSV): dev with its gold labels, test with its
    # index, each answered as the same pairs given one by one
    predictor = Predictor(out)
    for split, name in (("dev", "dev.tsv"), ("test", "test.tsv")):
        examples = predictor.task.read(data, split)
        expected = predictor([(e.text_a, e.text_b) for e in examples])
        assert cli.main(["predict", "--model", str(out), "--input", str(data / name),
                         "--output", str(tmp_path / f"{split}.jsonl"), "--quiet"]) == 0  # fmt: skip
        rows = [json.loads(x) for x in (tmp_path / f"{split}.jsonl").read_text().splitlines()]
        assert [r["text_pair"] for r in rows] == [e.text_b for e in examples]
        if split == "dev":
            assert [r["label"] for r in rows] == [e.label for e in examples]
            assert [r["predicted_label"] for r in rows] == [a["label"] for a in expected]
        else:
            assert [r["index"] for r in rows] == [e.index for e in examples]
            assert [r["label"] for r in rows] == [a["label"] for a in expected]


def test_a_csv_streams_to_jsonl_and_csv(topics_model, tmp_path):
    rows = topic_rows(50, seed=5)
    source = tmp_path / "in.csv"
    with open(source, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "headline", "label"])  # "label": a column the answer also has
        writer.writerows([[r["id"], r["headline"], r["topic"]] for r in rows])
    predictor = Predictor(topics_model)
    expected = predictor([r["headline"] for r in rows])
    assert predict_file(predictor, source, tmp_path / "out.jsonl", chunk=16, progress=False) == 50
    written = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [w["id"] for w in written] == [str(r["id"]) for r in rows]  # input order, all columns
    assert [w["predicted_label"] for w in written] == [e["label"] for e in expected]
    assert [w["label"] for w in written] == [r["topic"] for r in rows]  # the input's, untouched
    assert written[0]["score"] == pytest.approx(expected[0]["score"], abs=1e-6)
    predict_file(predictor, source, tmp_path / "out.csv", chunk=7, progress=False)
    with open(tmp_path / "out.csv", newline="") as handle:
        table = list(csv.DictReader(handle))
    assert list(table[0]) == [
        "id",
        "headline",
        "label",
        "predicted_label",
        "score",
        "probabilities",
    ]
    assert [t["predicted_label"] for t in table] == [e["label"] for e in expected]
    assert json.loads(table[0]["probabilities"]).keys() == {"business", "sports", "tech"}


def test_stdin_one_text_a_line(topics_model, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("goal match team\n\nstocks bank shares\n"))
    assert main(["predict", "--model", str(topics_model), "--input", "-", "--quiet"]) == 0
    answers = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [a["text"] for a in answers] == ["goal match team", "stocks bank shares"]
    assert [a["label"] for a in answers] == ["sports", "business"]


def test_a_bad_row_names_its_line_and_leaves_no_file(topics_model, tmp_path, capsys):
    source = tmp_path / "in.jsonl"
    source.write_text('{"headline": "goal match"}\n{"title": "no headline here"}\n')
    out = tmp_path / "out.jsonl"
    assert main(["predict", "--model", str(topics_model), "--input", str(source),
                 "--output", str(out), "--quiet"]) == 2  # fmt: skip
    assert "in.jsonl:2: no column 'headline'" in capsys.readouterr().err
    assert not out.exists() and list(tmp_path.iterdir()) == [source]
    # --text-column names another column
    assert main(["predict", "--model", str(topics_model), "--input", str(source), "--output",
                 str(out), "--text-column", "title", "--quiet"]) == 2  # fmt: skip
    assert "in.jsonl:1: no column 'title'" in capsys.readouterr().err


def test_entities_with_offsets_from_a_file(tagger, tmp_path):
    source = tmp_path / "tweets.csv"
    source.write_text('id,text\n1,"ann visits paris, eats sushi"\n2,nothing here\n')
    predict_file(Predictor(tagger), source, tmp_path / "out.jsonl", progress=False)
    written = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    text = "ann visits paris, eats sushi"
    assert written[0]["words"] == ["ann", "visits", "paris", ",", "eats", "sushi"]
    assert {e["text"] for e in written[0]["entities"]} >= {"paris", "sushi"}
    for entity in written[0]["entities"]:
        assert entity["text"] == text[entity["start"] : entity["end"]]
        assert set(entity) == {"type", "text", "words", "score", "start", "end"}
    with pytest.raises(DataError, match=r"tweets.csv:2: no column 'tokens'"):
        predict_file(Predictor(tagger), source, None, text_column="tokens", progress=False)


def test_a_tagger_predicts_conll_files(tagger, topics_model, tmp_path, capsys):
    """A tagger trained on CoNLL columns tags a file of them (.txt read as it trained), each
    sentence a row with the file's own tags beside the predicted ones, to JSON Lines or to
    CoNLL columns again (word, the file's tag, the predicted: conlleval's input)."""
    sentences = tagged_sentences(12, seed=5)
    source = tmp_path / "test.txt"
    source.write_text("-DOCSTART- O\n\n" + conll_text(sentences))
    predictor = Predictor(tagger)
    expected = [a["tags"] for a in predictor([words for words, _ in sentences])]
    assert predict_file(predictor, source, tmp_path / "out.jsonl", progress=False) == 12
    written = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [w["words"] for w in written] == [words for words, _ in sentences]
    assert [w["tags"] for w in written] == [tags for _, tags in sentences]
    assert [w["predicted_tags"] for w in written] == expected
    assert all("predicted_words" not in w for w in written)  # the same words: not again
    assert main(["predict", "--model", str(tagger), "--input", str(source), "--output",
                 str(tmp_path / "out.conll"), "--quiet"]) == 0  # fmt: skip
    found, width = read_conll_columns(tmp_path / "out.conll", min_fields=3)
    assert width == 3 and len(found) == 12
    for sentence, (words, tags), predicted in zip(found, sentences, expected, strict=True):
        assert [r[0] for r in sentence.rows] == words
        assert [r[1] for r in sentence.rows] == tags
        assert [r[2] for r in sentence.rows] == predicted
    # words alone (a word a line): tagged, two columns out
    bare = tmp_path / "bare.conll"
    bare.write_text("".join("\n".join(words) + "\n\n" for words, _ in sentences))
    predict_file(predictor, bare, tmp_path / "bare_out.conll", progress=False)
    found, width = read_conll_columns(tmp_path / "bare_out.conll")
    assert width == 2 and [[r[1] for r in s.rows] for s in found] == expected
    # raw text, a sentence a line, is not read as words and tags
    raw = tmp_path / "raw.txt"
    raw.write_text("ann visits paris\nbob eats sushi\n")
    with pytest.raises(DataError, match=r"raw.txt:1: tag 'paris' is not O or B-/I-TYPE"):
        predict_file(predictor, raw, tmp_path / "raw.jsonl", progress=False)
    assert not (tmp_path / "raw.jsonl").exists()
    # a classifier neither reads nor writes CoNLL columns
    assert main(["predict", "--model", str(topics_model), "--input", str(bare), "--quiet"]) == 2
    assert "bare.conll: CoNLL columns hold words to tag" in capsys.readouterr().err
    with pytest.raises(ValueError, match="answers no tags"):
        predict_file(Predictor(topics_model), raw, tmp_path / "labels.conll", progress=False)


def _topic_of_other(rows, seed):
    """For each row, a headline of another topic (what a stray `text` column would say)."""
    pool = iter(topic_rows(400, seed=seed))
    return [next(p["headline"] for p in pool if p["topic"] != r["topic"]) for r in rows]


def test_the_trained_column_wins_over_a_column_named_text(topics_model, tmp_path, capsys):
    """Trained on `headline`, the model reads `headline` from a row that also has a `text`
    column (which says another topic), from a file, the command line and Python alike."""
    rows = topic_rows(40, seed=7)
    decoys = _topic_of_other(rows, seed=8)
    source = tmp_path / "new.csv"
    with open(source, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "headline", "text"])
        writer.writerows([[r["id"], r["headline"], d] for r, d in zip(rows, decoys, strict=True)])
    predictor = Predictor(topics_model)
    from_headlines = [a["label"] for a in predictor([r["headline"] for r in rows])]
    from_decoys = [a["label"] for a in predictor(decoys)]
    assert sum(a != b for a, b in zip(from_headlines, from_decoys, strict=True)) >= 30
    out = tmp_path / "a.jsonl"
    assert main(["predict", "--model", str(topics_model), "--input", str(source),
                 "--output", str(out), "--quiet"]) == 0  # fmt: skip
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [w["label"] for w in written] == from_headlines
    items = [{"headline": r["headline"], "text": d} for r, d in zip(rows, decoys, strict=True)]
    assert [a["label"] for a in predictor(items)] == from_headlines
    # a row without the trained column is an error naming the file, line and column, even
    # when it has a `text` (only the generic {"text"[, "text_pair"]} shape reads `text`)
    partial = tmp_path / "partial.csv"
    partial.write_text("id,text\n1,goal match team\n")
    assert main(["predict", "--model", str(topics_model), "--input", str(partial),
                 "--output", str(tmp_path / "b.jsonl"), "--quiet"]) == 2  # fmt: skip
    assert "partial.csv:2: no column 'headline'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no column 'headline'"):
        predictor([{"id": 1, "text": "goal match team"}])
    # a header alone: nothing to answer, and said so rather than a silent empty stdout
    (tmp_path / "header.csv").write_text("id,text\n")
    assert main(["predict", "--model", str(topics_model), "--input",
                 str(tmp_path / "header.csv"), "--quiet"]) == 0  # fmt: skip
    captured = capsys.readouterr()
    assert captured.out == "" and "header.csv: no rows to predict" in captured.err
    assert [a["label"] for a in predictor([{"text": "goal match team"}])] == ["sports"]


def test_predict_reads_files_as_the_model_was_trained(words_model, tmp_path):
    """The reading settings saved with the model (header-less columns, separator) read a new
    file of the same layout without flags; a flag overrides them."""

    def write(path, rows):
        path.write_text("".join(f"{r['id']};{r['headline']};{r['topic']}\n" for r in rows))
        return path

    train = write(tmp_path / "train.txt", topic_rows(160))
    dev = write(tmp_path / "dev.txt", topic_rows(32, seed=1))
    data = DataConfig(train=str(train), validation=str(dev), format="csv", delimiter=";",
                      columns="id,headline,topic", text_column="headline",
                      label_column="topic")  # fmt: skip
    finetune("text-classification", words_model, data, tmp_path / "run",
             FinetuneConfig(**OWN_QUICK))  # fmt: skip
    rows = topic_rows(20, seed=9)
    source = write(tmp_path / "new.txt", rows)  # the trained layout (with the label column)
    predictor = Predictor(tmp_path / "run")
    expected = [a["label"] for a in predictor([r["headline"] for r in rows])]
    assert predict_file(predictor, source, tmp_path / "a.jsonl", progress=False) == 20
    written = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert [w["id"] for w in written] == [str(r["id"]) for r in rows]
    assert [w["label"] for w in written] == expected
    # a flag wins over the saved setting: the same rows, comma-separated, with a header
    commas = tmp_path / "new.csv"
    commas.write_text("id,headline\n" + "".join(f"{r['id']},{r['headline']}\n" for r in rows))
    assert main(["predict", "--model", str(tmp_path / "run"), "--input", str(commas),
                 "--output", str(tmp_path / "b.jsonl"), "--delimiter", ",", "--columns", "",
                 "--quiet"]) == 0  # fmt: skip
    written = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert [w["label"] for w in written] == expected


def test_rerank_a_file_with_a_cross_encoder(words_model, topics_model, tmp_path, capsys):
    """`predict --rerank`: each row's query and texts get their ranking, the pair classifier's
    probability of "1" best first; a row without texts and a model that reads single texts are
    refused by name."""
    rows, others = topic_rows(120, seed=4), topic_rows(120, seed=5)
    train = tmp_path / "pairs.csv"
    with open(train, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["query", "text", "relevant"])
        for a, b in zip(rows, others, strict=True):
            writer.writerow([a["headline"], b["headline"], int(a["topic"] == b["topic"])])
    data = DataConfig(train=str(train), validation=str(train), text_column="query",
                      text_pair_column="text", label_column="relevant")  # fmt: skip
    finetune("text-classification", words_model, data, tmp_path / "ce",
             FinetuneConfig(**OWN_QUICK | {"epochs": 1}))  # fmt: skip
    texts = ["stocks bank shares", "coach league score", "chip phone cloud"]
    source = tmp_path / "queries.jsonl"
    source.write_text(json.dumps({"id": 7, "query": "goal match team", "texts": texts}) + "\n")
    out = tmp_path / "ranked.jsonl"
    assert main(["predict", "--model", str(tmp_path / "ce"), "--input", str(source), "--output",
                 str(out), "--rerank", "--quiet"]) == 0  # fmt: skip
    [row] = [json.loads(line) for line in out.read_text().splitlines()]
    predictor = Predictor(tmp_path / "ce")
    scores = [a["probabilities"]["1"] for a in predictor([("goal match team", t) for t in texts])]
    assert row["id"] == 7 and [r["index"] for r in row["ranking"]] == sorted(
        range(3), key=lambda i: -scores[i])  # fmt: skip
    assert [r["score"] for r in row["ranking"]] == pytest.approx(sorted(scores, reverse=True))
    source.write_text('{"query": "goal"}\n')
    assert main(["predict", "--model", str(tmp_path / "ce"), "--input", str(source), "--output",
                 str(out), "--rerank", "--quiet"]) == 2  # fmt: skip
    assert 'queries.jsonl:1: --rerank: "texts" must be a non-empty list' in capsys.readouterr().err
    with pytest.raises(ValueError, match="--rerank takes a cross-encoder"):
        predict_file(Predictor(topics_model), source, None, rerank=True, progress=False)


def test_a_fine_tuned_model_whose_file_changed_is_refused(topics_model, tmp_path, capsys):
    """Fine-tuning records its model's SHA-256 (no trainer state kept): bytes flipped inside a
    tensor (the file still loads) are refused by predict, export and serve's model, by name."""
    import shutil

    from bertkit.serve.engine import ServedModel

    run = tmp_path / "run"
    shutil.copytree(topics_model, run)
    assert json.loads((run / "trainer_state.sha256").read_text())["model.safetensors"]
    model = run / "model.safetensors"
    data = bytearray(model.read_bytes())
    data[-100:-90] = bytes(b ^ 0xFF for b in data[-100:-90])
    model.write_bytes(bytes(data))
    capsys.readouterr()
    for argv in (["predict", "--model", str(run), "--input", str(topics_model.parent / "dev.csv"),
                  "--output", str(tmp_path / "out.jsonl")],
                 ["export", "--onnx", str(run), str(tmp_path / "onnx")]):  # fmt: skip
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"{model}: its SHA-256 is not the one the run recorded" in err, err
        assert "run again what wrote it" in err
    with pytest.raises(ValueError, match="SHA-256 is not the one"):
        ServedModel(run)
    assert not (tmp_path / "out.jsonl").exists() and not (tmp_path / "onnx").exists()
