"""Datasets by name (bertkit.tasks.named): `bertkit finetune text-classification --dataset imdb
--validation-split test` reads the splits `load_dataset("imdb")` cached, offline, with the
ClassLabel's names as labels; a name not in the cache, or a split it lacks, is one clear line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bertkit import cli as bertkit_cli

from helpers import cli_in_one_process, topic_rows

pytestmark = pytest.mark.slow  # subprocesses: the datasets library reads its settings at import


def cached_dataset(cache, name: str, config: str, splits: dict[str, list[dict]], labels):
    """A dataset laid in a datasets cache as load_dataset(NAME, CONFIG) leaves it when it
    downloads one from the Hub (the parquet builder's arrow files under NAME/CONFIG/...),
    made here without a network."""
    script = f"""
import os, sys
os.environ["HF_DATASETS_CACHE"] = {str(cache)!r}
import datasets, pyarrow as pa, pyarrow.parquet as pq
from datasets.data_files import DataFilesDict
from datasets.packaged_modules.parquet.parquet import Parquet
splits, files = {splits!r}, {{}}
for split, rows in splits.items():
    files[split] = [os.path.join({str(cache)!r}, split + ".parquet")]
    pq.write_table(pa.Table.from_pylist(rows), files[split][0])
features = datasets.Features({{"text": datasets.Value("string"),
                               "label": datasets.ClassLabel(names={labels!r})}})
builder = Parquet(dataset_name={name!r}, config_name={config!r}, features=features,
                  data_files=DataFilesDict.from_patterns(files), hash="0123abcd")
builder.download_and_prepare()
print(builder.cache_dir)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    made = done.stdout.strip().splitlines()[-1]
    # a download names the folder by the config alone (data files given here add a hash)
    config_dir = os.path.dirname(os.path.dirname(made))
    os.rename(config_dir, os.path.join(os.path.dirname(config_dir), config))


def test_a_dataset_by_name_from_the_cache(words_model, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    labels = ["business", "sports", "tech"]
    rows = {split: [{"text": r["headline"], "label": labels.index(r["topic"])}
                    for r in topic_rows(count, seed)]
            for split, count, seed in (("train", 160, 0), ("test", 32, 1))}  # fmt: skip
    cached_dataset(cache, "topics", "plain_text", rows, labels)
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1"}  # fmt: skip
    out = tmp_path / "run"
    command = [sys.executable, "-m", "bertkit.cli", "finetune", "text-classification", "--model",
               str(words_model), "--dataset", "topics", "--train-split", "train",
               "--validation-split", "test", "--epochs", "5", "--batch-size", "8", "--lr", "5e-3",
               "--max-seq-length", "64", "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    # the floor: below a bag of words on rows of the same generator (test_floors.py: >= 0.97)
    assert results["train_examples"] == 160 and results["dev"]["accuracy"] > 0.9
    assert json.loads((out / "config.json").read_text())["id2label"] == {
        "0": "business", "1": "sports", "2": "tech"}  # fmt: skip
    assert results["data"] == {"dataset": "topics"}

    # the refusals, in one process (each a start-up less): no validation split named and none
    # called "validation" (said, with the splits it has), a wrong configuration, an absent
    # dataset, a wrong split
    at = command.index("--validation-split")
    refused = {"no validation": command[3:at] + command[at + 2 : -1] + [str(tmp_path / "b")]}
    for name in ("topics:nope", "absent"):
        refused[name] = [name if part == "topics" else part for part in command[3:]]
    refused["dev"] = ["dev" if part == "test" else part for part in command[3:]]
    answers = cli_in_one_process(refused, env)
    says = {"no validation": "--dataset topics has no 'validation' split (its splits: train, "
                             "test)",
            "topics:nope": "--dataset topics:nope", "absent": "--dataset absent",
            "dev": "--dataset topics has no split 'dev' (its splits: train, test)"}  # fmt: skip
    for name, answer in answers.items():
        assert answer["code"] != 0 and says[name] in answer["err"], (name, answer)
        assert "Traceback" not in answer["err"]


def test_a_corpus_by_name_from_the_cache(words_model, tmp_path):
    """`prepare --dataset NAME` and `embed --dataset NAME` read a split from the cache: the
    shards its rows make as JSON Lines, and a vector for every row."""
    from helpers import synthetic_tokenizer

    cache = tmp_path / "cache"
    cache.mkdir()
    texts = [" ".join(f"w{(i * 7 + j) % 400}" for j in range(5 + i % 9)) + "." for i in range(40)]
    cached_dataset(cache, "corpus", "plain_text", {"train": [{"text": t, "label": 0}
                                                             for t in texts]}, ["x"])  # fmt: skip
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1"}  # fmt: skip
    synthetic_tokenizer().save_pretrained(tmp_path / "vocab")
    (tmp_path / "plain.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    vocab = ["--vocab", str(tmp_path / "vocab")]
    assert bertkit_cli.main(["prepare", str(tmp_path / "plain.jsonl"), *vocab, "--out",
                             str(tmp_path / "plain")]) == 0  # fmt: skip
    runs = {  # what reads the cache, in one process that has it in its environment
        "named": ["prepare", "--dataset", "corpus", "--split", "train", *vocab, "--out",
                  str(tmp_path / "named")],
        "embed": ["embed", "--model", str(words_model), "--dataset", "corpus", "--pooling",
                  "mean", "--out", str(tmp_path / "vectors"), "--quiet"],
    }  # fmt: skip
    for name, answer in cli_in_one_process(runs, env).items():
        assert answer["code"] == 0, (name, answer["err"][-3000:])
    for kind in ("tokens", "sentences", "documents"):
        name = f"shard-00000.{kind}"
        assert (tmp_path / "named" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()
    manifest = json.loads((tmp_path / "vectors" / "manifest.json").read_text())
    assert manifest["rows"] == 40 and manifest["plan"]["inputs"][0]["path"] == "corpus/train"
