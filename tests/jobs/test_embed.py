"""Corpus jobs (bertkit.jobs): `bertkit embed` and `predict --output FOLDER` over many files, in
shards with a manifest; killed anywhere and resumed to the same bytes; N processes equal to one;
bad input said per row or refused by name."""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bertkit import cli
from bertkit.jobs import shards
from bertkit.jobs.config import EmbedConfig
from bertkit.jobs.embed import EmbeddingMapper, embed
from bertkit.jobs.inputs import (
    Columns,
    corpus_rows,
    estimated_rows,
    expand,
    manifest_inputs,
    positions,
)
from bertkit.rows import FileConfig

from helpers import KILLER, WORDS, two_at_a_time, write_rows


def texts(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(3, 30))) for _ in range(count)]


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def vectors_by_id(folder: Path) -> dict[str, list[float] | None]:
    table = shards.vectors(folder)
    return dict(
        zip(table.column("id").to_pylist(), table.column("vector").to_pylist(), strict=True)
    )


def test_a_csv_embedded_with_a_released_model_as_sentence_transformers_does(
    minilm_dir, tmp_path, capsys
):
    """all-MiniLM-L6-v2 by its Hub name (the package that ships it, offline) on a CSV: each row's
    vector is SentenceTransformer's (its mean pooling and normalisation, read from the folder),
    keyed by the file's id column, with the columns asked kept; a blank text and a text over
    the model's 256 tokens are said per row, never dropped; float16 is the float32 vectors
    rounded."""
    from sentence_transformers import SentenceTransformer

    rows = [{"doc": f"d{i}", "body": t, "lang": "en"} for i, t in enumerate(texts(40))]
    rows[3]["body"] = "   "
    rows[5]["body"] = "word " * 300
    source = write_rows(tmp_path / "docs.csv", rows)
    out = tmp_path / "vectors"
    argv = ["embed", "--model", "sentence-transformers/all-MiniLM-L6-v2", "--input",
            str(source), "--text-column", "body", "--id-column", "doc", "--keep-columns",
            "lang", "--out", str(out), "--rows-per-shard", "16", "--quiet"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    assert "40 rows in 3 shards" in capsys.readouterr().err
    table = shards.vectors(out, ("id", "vector", "lang", "issue"))
    assert table.column("id").to_pylist() == [r["doc"] for r in rows]
    assert set(table.column("lang").to_pylist()) == {"en"}
    assert table.schema.field("vector").type == pa.list_(pa.float32(), 384)
    got = table.column("vector").to_pylist()
    assert got[3] is None and all(v is not None for i, v in enumerate(got) if i != 3)
    model = SentenceTransformer(str(minilm_dir), device="cpu")
    wanted = model.encode([r["body"] for i, r in enumerate(rows) if i != 3])
    np.testing.assert_allclose(np.array([v for v in got if v is not None]), wanted, atol=2e-6)
    manifest = json.loads((out / "manifest.json").read_text())
    plan = manifest["plan"]
    assert (plan["pooling"], plan["normalize"], plan["dimension"], plan["dtype"]) == (
        "mean", True, 384, "float32")  # fmt: skip
    assert plan["max_seq_length"] == 256 and plan["precision"] in ("fp32", "bf16")
    assert plan["inputs"][0]["sha256"] == shards.sha256_of(source)
    assert plan["model"]["sha256"] == shards.sha256_of(minilm_dir / "model.safetensors")
    assert manifest["complete"] and [s["rows"] for s in manifest["shards"]] == [16, 16, 8]
    assert manifest["issues"] == {"empty": 1, "truncated": 1}
    listed = shards.issues(out)
    assert [(i["id"], i["issue"], i["line"]) for i in listed] == [
        ("d3", "empty", 5), ("d5", "truncated: 302 tokens to 256", 7)]  # fmt: skip

    half = embed(minilm_dir, [source], tmp_path / "half", text_column="body", dtype="float16",
                 progress=False)  # fmt: skip
    assert half["plan"]["dtype"] == "float16"
    rounded = shards.vectors(tmp_path / "half").column("vector")
    assert rounded.type == pa.list_(pa.float16(), 384)
    assert np.array_equal(np.array(rounded.to_pylist()[0], np.float16), np.float16(got[0]))


def test_rows_of_many_files_in_order_each_from_its_own_position(tmp_path):
    """A glob of CSV, JSON Lines (one gzipped) and Parquet files is read in order, each row
    keyed FILE:LINE (a quoted CSV cell over two lines keeps its first line); a JSON line without
    the text, a number where a text should be and a blank text are rows with their issue, a
    bare JSON string is the text; and reading from any shard's recorded position gives exactly
    the rows a whole read gives from there."""
    (tmp_path / "in").mkdir()
    write_rows(tmp_path / "in" / "a.csv", [{"text": "one"}, {"text": "two\nlines"},
                                           {"text": "three"}])  # fmt: skip
    jsonl(tmp_path / "in" / "b.jsonl", [{"text": "four"}, {"other": 1}, {"text": 5}, {"text": ""}]
          + [{"text": f"row {i}"} for i in range(20)])  # fmt: skip
    with open(tmp_path / "in" / "b.jsonl", "a") as handle:
        handle.write("\n\n")  # blank lines are no rows
    pq.write_table(pa.table({"text": [f"pq {i}" for i in range(30)]}),
                   tmp_path / "in" / "c.parquet", row_group_size=7)  # fmt: skip
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": ["ds 0", "ds 1"]}).save_to_disk(tmp_path / "in" / "d")
    lines = "".join(json.dumps({"text": f"gz {i}"}) + "\n" for i in range(6)) + '"bare"\n'
    (tmp_path / "in" / "e.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
    sources = expand([str(tmp_path / "in" / "*")])
    assert [Path(s.path).name for s in sources] == ["a.csv", "b.jsonl", "c.parquet", "d",
                                                    "e.jsonl.gz"]  # fmt: skip
    everything = list(corpus_rows(sources, Columns()))
    assert len(everything) == 3 + 24 + 30 + 2 + 7 and everything[-1].text == "bare"
    assert Path(everything[-2].key).name == "e.jsonl.gz:6" and everything[-2].text == "gz 5"
    # the progress bar's total: what the files can say cheaply (a gzipped file's newlines are
    # not its rows)
    plain_and_gzipped = [sources[1], sources[4]]
    assert estimated_rows(plain_and_gzipped, manifest_inputs(plain_and_gzipped)) is None
    assert estimated_rows(sources[1:3], manifest_inputs(sources[1:3])) == 26 + 30
    assert [(Path(r.key).name, r.text, r.issue) for r in everything[:7]] == [
        ("a.csv:2", "one", None), ("a.csv:3", "two\nlines", None), ("a.csv:5", "three", None),
        ("b.jsonl:1", "four", None), ("b.jsonl:2", None, "missing"),
        ("b.jsonl:3", None, "not text: int"), ("b.jsonl:4", None, "empty"),
    ]  # fmt: skip
    for every in (1, 5, 11):
        starts = list(positions(sources, Columns(), FileConfig(), every))
        assert len(starts) == -(-len(everything) // every)
        for number, start in enumerate(starts):
            tail = list(corpus_rows(sources, Columns(), start=start))
            assert tail == everything[number * every :], (every, number, start)


def test_resuming_against_other_inputs_or_another_model_is_refused_by_name(
    words_model, mlm_dir, tmp_path
):
    source = jsonl(tmp_path / "docs.jsonl", [{"text": t} for t in texts(30)])
    out = tmp_path / "vectors"
    config = EmbedConfig(pooling="mean", rows_per_shard=10, progress=False)
    embed(words_model, [source], out, config)
    with pytest.raises(FileExistsError, match="--resume to continue it, --overwrite"):
        embed(words_model, [source], out, config)
    assert embed(words_model, [source], out, config, resume=True)["rows"] == 30  # nothing to do
    with pytest.raises(ValueError, match=r"cannot resume: the model is another"):
        embed(mlm_dir, [source], out, config, resume=True)
    jsonl(source, [{"text": t} for t in texts(30, seed=1)])
    with pytest.raises(ValueError, match=r"docs.jsonl changed since \(another SHA-256\)"):
        embed(words_model, [source], out, config, resume=True)
    with pytest.raises(ValueError, match=r"rows_per_shard was 10, now 20"):
        embed(words_model, [source], out, config, resume=True, rows_per_shard=20)
    assert embed(words_model, [source], out, config, overwrite=True)["complete"]


def test_n_processes_write_what_one_writes(words_model, tmp_path):
    """--workers 2 (one thread each) ends with the same shard bytes as one process of one
    thread: shard k holds the same rows, batched alike, whoever writes it — and two processes,
    neither of them this one, computed the shards (each shard's rows recorded by the process
    that embedded them)."""
    from bertkit.jobs.config import sources
    from bertkit.jobs.run import run_job

    from helpers import RecordingJob

    source = jsonl(tmp_path / "docs.jsonl", [{"text": t} for t in texts(120)])
    config = EmbedConfig(pooling="mean", rows_per_shard=25, threads=1, progress=False)
    one = embed(words_model, [source], tmp_path / "one", config)
    record = tmp_path / "pids"
    job = RecordingJob("embed", str(words_model), replace(config, workers=2), EmbeddingMapper,
                       str(record))  # fmt: skip
    two = run_job(job, sources([source], None, "train", "auto"), tmp_path / "two")
    assert [s["sha256"] for s in one["shards"]] == [s["sha256"] for s in two["shards"]]
    assert len(one["shards"]) == 5
    pids = [int(line.split()[0]) for line in record.read_text().splitlines()]
    assert len(pids) == 5 and len(set(pids)) == 2 and os.getpid() not in pids


@pytest.mark.slow  # a process per kill
def test_a_job_killed_at_any_write_or_moment_resumes_to_the_same_bytes(words_model, tmp_path):
    """SIGKILL before a file the job puts in place (the file half written) — its first, a shard,
    its last —, after the last, and at a random moment: `--resume` then ends with every file
    (shards, manifest, issues) equal byte for byte to a job never killed, and computes only the
    shards the kill left undone."""
    rows = [{"text": t} for t in texts(400)]
    rows[7] = {"text": ""}
    source = jsonl(tmp_path / "docs.jsonl", rows)
    driver = tmp_path / "killer.py"
    driver.write_text(KILLER)

    def run(out, kill_at=0, when="before", *extra, wait=True):
        argv = [sys.executable, str(driver), "embed", "--model", str(words_model), "--input",
                str(source), "--out", str(out), "--pooling", "mean", "--rows-per-shard", "100",
                "--threads", "1", "--quiet", *extra]  # fmt: skip
        env = {**os.environ, "KILL_AT": str(kill_at), "KILL_WHEN": when,
               "WRITES": str(out) + ".writes"}  # fmt: skip
        if not wait:
            return subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
        return subprocess.run(argv, env=env, capture_output=True, text=True)

    def files(folder):
        return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}

    whole = run(tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    expected = files(tmp_path / "whole")
    assert len([n for n in expected if n.endswith(".parquet")]) == 4
    writes = (tmp_path / "whole.writes").read_text().splitlines()
    assert writes[0] == "manifest.json" and writes[-1] == "manifest.json" and len(writes) == 7
    # the first file (the manifest of a new job), a shard cut short mid-job, the closing
    # manifest cut short, and after the last file: where a resume starts from nothing, from
    # some shards, and from every shard
    points = [(1, "before"), (3, "before"), (len(writes), "before"), (len(writes), "after")]
    shards_of = {n for n in expected if n.endswith(".parquet")}

    def check(point):
        at, when = point
        out = tmp_path / f"killed_{at}_{when}"
        if when == "moment":  # a kill at a random moment
            process = run(out, wait=False)
            try:
                process.wait(timeout=random.Random(0).uniform(2.5, 5.0))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            resumed = run(out, 0, "before", "--resume")
            assert resumed.returncode == 0, resumed.stderr[-3000:]
            assert files(out) == expected, point
            return
        killed = run(out, at, when)
        assert killed.returncode == -9, (at, when, killed.stderr[-2000:])
        done = {p.name for p in out.iterdir()} & shards_of
        resumed = run(out, 0, "before", "--resume")
        assert resumed.returncode == 0, (at, when, resumed.stderr[-3000:])
        assert files(out) == expected, (at, when)
        # the resume computed only what the kill left undone: no finished shard again
        rewritten = set(Path(str(out) + ".writes").read_text().splitlines()) & shards_of
        assert rewritten == shards_of - done, (at, when, sorted(done), sorted(rewritten))

    two_at_a_time(check, [*points, (0, "moment")])


def test_predict_with_a_sentence_transformers_model_embeds(minilm_dir, tmp_path, capsys):
    """What a newcomer types first: `predict --model <a sentence-transformers model> --input
    docs.csv --output vecs.jsonl` writes each row with its vector (it stopped with a flag that
    does not exist); into a folder it is the embed job; a plain BERT is told what to run."""
    rows = [{"body": t} for t in texts(5)]
    source = write_rows(tmp_path / "docs.csv", rows)
    argv = ["predict", "--model", str(minilm_dir), "--input", str(source), "--text-column",
            "body", "--quiet"]  # fmt: skip
    assert cli.main([*argv, "--output", str(tmp_path / "vecs.jsonl")]) == 0
    written = [json.loads(line) for line in (tmp_path / "vecs.jsonl").read_text().splitlines()]
    assert [w["body"] for w in written] == [r["body"] for r in rows]
    assert all(len(w["vector"]) == 384 for w in written)
    assert cli.main([*argv, "--output", str(tmp_path / "folder")]) == 0
    folder = vectors_by_id(tmp_path / "folder")
    np.testing.assert_allclose(folder[written[2]["id"]], written[2]["vector"], atol=1e-6)
    assert cli.main(["predict", "--model", str(minilm_dir), rows[0]["body"]]) == 0
    line = json.loads(capsys.readouterr().out.strip())
    np.testing.assert_allclose(line["vector"], written[0]["vector"], atol=1e-6)


def test_predict_with_a_plain_bert_names_what_to_run(words_model, capsys):
    assert cli.main(["predict", "--model", str(words_model), "a text"]) == 2
    err = capsys.readouterr().err
    assert "bertkit embed --model" in err and "pass the task" not in err


def test_a_classifier_predicts_a_corpus_into_shards(topics_model, tmp_path):
    """`predict --input FILES --output FOLDER` with a fine-tuned classifier: the answers of
    `predict --output file.jsonl` as shard columns, the same rows, a blank row said."""
    rows = [{"headline": t, "n": i} for i, t in enumerate(texts(30))]
    rows[4]["headline"] = ""
    source = write_rows(tmp_path / "news.csv", rows)
    base = ["predict", "--model", str(topics_model), "--input", str(source), "--text-column",
            "headline", "--quiet"]  # fmt: skip
    assert cli.main([*base, "--output", str(tmp_path / "shards"), "--rows-per-shard", "8"]) == 0
    table = shards.vectors(tmp_path / "shards", ("id", "label", "score", "probabilities", "issue"))
    assert table.num_rows == 30 and table.column("issue").to_pylist()[4] == "empty"
    answers = [r for i, r in enumerate(rows) if i != 4]
    write_rows(tmp_path / "plain.csv", answers)
    assert cli.main(["predict", "--model", str(topics_model), "--input",
                     str(tmp_path / "plain.csv"), "--text-column", "headline", "--quiet",
                     "--output", str(tmp_path / "plain.jsonl")]) == 0  # fmt: skip
    plain = [json.loads(x) for x in (tmp_path / "plain.jsonl").read_text().splitlines()]
    labels = [x for i, x in enumerate(table.column("label").to_pylist()) if i != 4]
    assert labels == [p["label"] for p in plain]
    probabilities = json.loads(table.column("probabilities").to_pylist()[0])
    assert probabilities == pytest.approx(plain[0]["probabilities"], abs=1e-6)
