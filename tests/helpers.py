"""Helpers the tests share (imported as `helpers`: pytest puts tests/ on the path)."""

from __future__ import annotations

import csv
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit import (
    BertConfig,
    BertTokenizer,
)
from bertkit.core.checkpoint import load_state_dict_into
from bertkit.jobs.work import Job
from bertkit.pretraining.shards import (
    Shards,
    chunk_from_token_documents,
    write_shards,
)

ATOL = 1e-5


def hf_config(config: BertConfig, **extra):
    transformers = pytest.importorskip("transformers")
    data = config.to_dict()
    data.pop("model_type")
    data.update(extra)
    return transformers.BertConfig(**data, attn_implementation="eager")


def pair(name, config, **hf_extra):
    """transformers' model of the class `name` with its own random init, and ours of the same
    name loaded from its state dict."""
    from bertkit.core.heads import MODEL_CLASSES

    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = getattr(transformers, name)(hf_config(config, **hf_extra)).eval()
    ours = MODEL_CLASSES[name](config).eval()
    report = load_state_dict_into(ours, hf.state_dict(), strict=True)
    assert report == {"missing": [], "unexpected": [], "mismatched": []}
    return ours, hf


def close(a, b, atol=ATOL):
    torch.testing.assert_close(a, b, atol=atol, rtol=0)


SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def synthetic_tokenizer(words: int = 400, pieces: int = 60) -> BertTokenizer:
    vocab = SPECIALS + [f"[unused{i}]" for i in range(5)]
    vocab += [f"w{i}" for i in range(words)] + [f"##p{i}" for i in range(pieces)]
    return BertTokenizer(vocab=vocab, lowercase=True)


def synthetic_shards(tmp_path, tokenizer, documents=1500, seed=0, shard_tokens=1 << 27) -> Shards:
    """Documents of 1-40 sentences of 1-30 tokens; ~30% of tokens are ## continuations."""
    rng = np.random.default_rng(seed)
    vocab = tokenizer.vocab
    starts = np.asarray([i for t, i in vocab.items() if t.startswith("w")])
    continuations = np.asarray([i for t, i in vocab.items() if t.startswith("##")])
    docs = []
    for _ in range(documents):
        doc = []
        for _ in range(int(rng.integers(1, 41))):
            n = int(rng.integers(1, 31))
            ids = rng.choice(starts, n)
            cont = rng.random(n) < 0.3
            cont[0] = False
            ids[cont] = rng.choice(continuations, int(cont.sum()))
            doc.append(ids)
        docs.append(doc)
    write_shards(
        [chunk_from_token_documents(docs)],
        tokenizer,
        tmp_path / "shards",
        shard_tokens=shard_tokens,
    )
    return Shards(tmp_path / "shards")


def doc_of_token(shards: Shards, shard: int, offset: int) -> int:
    sentence = np.searchsorted(shards.sentences[shard], offset, side="right") - 1
    local = np.searchsorted(shards.documents[shard], sentence, side="right") - 1
    return int(shards.document_offsets[shard] + local)


FIXTURES = Path(__file__).parent / "fixtures"


def grow_copies(src: Path, dst: Path, copies: int) -> Path:
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


def cli_command(*args):
    return [sys.executable, "-m", "bertkit.cli", *map(str, args)]


def losses(out):
    return {
        e["step"]: e["loss"]
        for e in map(json.loads, (out / "log.jsonl").read_text().splitlines())
        if e["split"] == "train"
    }


def learnable_shards(root, tokenizer):
    """Sentences that are runs of consecutive words (w17 w18 w19 ...): a masked word follows
    from its neighbours, which even a tiny model learns in a few dozen steps."""
    rng = np.random.default_rng(0)
    words = np.asarray([tokenizer.vocab[f"w{i}"] for i in range(60)])

    def sentence():
        start = int(rng.integers(0, 40))
        return words[start : start + int(rng.integers(6, 20))]

    docs = [[sentence() for _ in range(int(rng.integers(3, 12)))] for _ in range(300)]
    write_shards([chunk_from_token_documents(docs)], tokenizer, root / "learnable")
    return root / "learnable"


def tiny_cli_args(setup, out=None, steps=40, **changes):
    """`bertkit pretrain` flags for a tiny run on the `setup` shards (`changes`: other values,
    by flag name with underscores; `out=None` leaves --out to the caller)."""
    flags = {
        "data": setup / "shards", "config": setup / "config.json", "max_steps": steps,
        "batch_size": 8, "seq_len": 64, "warmup_steps": 2, "log_every": 1, "save_every": 1000,
        "lr": 1e-3, "device": "cpu",
    } | changes  # fmt: skip
    if out is not None:
        flags["out"] = out
    return [item for key, value in flags.items() for item in ("--" + key.replace("_", "-"), value)]


def data_path(*parts: str) -> Path:
    root = os.environ.get("BERTKIT_DATA")
    if not root:
        pytest.skip("BERTKIT_DATA is not set")
    path = Path(root, *parts)
    if not path.exists():
        pytest.fail(f"BERTKIT_DATA={root} is set but {path} is missing")
    return path


def tiny_bert_config(vocab_size: int = 99, **overrides) -> BertConfig:
    """transformers' BertModelTester sizes (hidden 32, 2 layers, 4 heads, intermediate 37, 64
    positions), with `overrides`: the small BERT every test builds."""
    sizes = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
    )
    return BertConfig(vocab_size=vocab_size, **{**sizes, **overrides})


def tiny_settings(setup, **changes):
    """A `PretrainConfig` for a tiny run on the `setup` shards' config (`changes` on top)."""
    from bertkit.pretraining.train import PretrainConfig
    from bertkit.settings import from_values

    values = dict(
        config=str(setup / "config.json"), batch_size=8, seq_len=64, learning_rate=1e-3,
        log_every=1, progress=False,
    ) | changes  # fmt: skip
    return from_values(PretrainConfig, values)


# --------------------------------------------------------------------------- your own data
TOPICS = {
    "sports": ["goal", "match", "team", "coach", "league", "score"],
    "business": ["stocks", "market", "profit", "bank", "shares", "trade"],
    "tech": ["chip", "software", "startup", "phone", "cloud", "robot"],
}
FILLER = ["the", "a", "on", "in", "today", "after", "new", "big"]
ENTITY_WORDS = {"city": ["paris", "lima", "oslo"], "food": ["pizza", "sushi", "tacos"]}
WORDS = sorted({w for ws in TOPICS.values() for w in ws} | set(FILLER)
               | {w for ws in ENTITY_WORDS.values() for w in ws} | {"loves", "visits", "eats"})  # fmt: skip


def topic_rows(count: int, seed: int = 0, topics: int = 1, length: tuple[int, int] = (4, 10)):
    """Headlines whose words give their topic away (`topics` > 1: several topics each, the
    multi-label case), with filler words; as dicts {"id", "headline", "topic"}."""
    rng = np.random.default_rng(seed)
    names = sorted(TOPICS)
    rows = []
    for i in range(count):
        chosen = sorted(rng.choice(names, size=topics, replace=False))
        words = [str(rng.choice(TOPICS[t])) for t in chosen for _ in range(rng.integers(2, 4))]
        words += [str(rng.choice(FILLER)) for _ in range(rng.integers(*length) - len(words) + 2)]
        rng.shuffle(words)
        rows.append({"id": i, "headline": " ".join(words),
                     "topic": chosen[0] if topics == 1 else chosen})  # fmt: skip
    return rows


def scored_rows(train: int = 160, dev: int = 40, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Texts of six words whose score is the share of "goal" among them (1% noise), for
    regression: (train rows, dev rows) of {"text", "label"}."""
    rng = np.random.default_rng(seed)

    def rows(n):
        out = []
        for _ in range(n):
            good = int(rng.integers(0, 7))
            words = ["goal"] * good + ["chip"] * (6 - good)
            rng.shuffle(words)
            out.append({"text": " ".join(words), "label": round(good / 6 + rng.normal(0, 0.01), 3)})
        return out

    return rows(train), rows(dev)


def tagged_sentences(count: int, seed: int = 0):
    """Sentences with entities of two types of their own (city, food) of one or two words,
    each followed by a plain word (so a span's extent is never ambiguous), as (words, IOB2
    tags)."""
    rng = np.random.default_rng(seed)
    plain = FILLER + ["loves", "visits", "eats"]
    sentences = []
    for _ in range(count):
        words, tags = [], []
        for _ in range(rng.integers(2, 5)):
            if rng.random() < 0.5:
                kind = str(rng.choice(sorted(ENTITY_WORDS)))
                span = [str(rng.choice(ENTITY_WORDS[kind])) for _ in range(rng.integers(1, 3))]
                words += span
                tags += [f"B-{kind}"] + [f"I-{kind}"] * (len(span) - 1)
            words.append(str(rng.choice(plain)))
            tags.append("O")
        sentences.append((words, tags))
    return sentences


def choice_rows(count: int, rng) -> list[dict]:
    """Multiple-choice rows: a context naming a city, three choices (visiting it, eating two
    foods) in a random order, the index of the right one."""
    rows = []
    for _ in range(count):
        city = str(rng.choice(ENTITY_WORDS["city"]))
        choices = [f"visits {city}"] + [f"eats {f}" for f in rng.choice(ENTITY_WORDS["food"], 2)]
        order = rng.permutation(3)
        rows.append({"context": f"ann loves {city}", "choices": [choices[i] for i in order],
                     "label": int(np.argwhere(order == 0)[0][0])})  # fmt: skip
    return rows


def conll_text(sentences) -> str:
    """CoNLL columns: a word and its tag a line, a blank line after each sentence."""
    return "".join(
        "".join(f"{w} {t}\n" for w, t in zip(words, tags, strict=True)) + "\n"
        for words, tags in sentences
    )


def word_checkpoint(directory: Path, head=None) -> Path:
    """A random tiny BERT whose vocabulary holds every word of the toy data whole."""
    from bertkit import BertModel

    letters = "abcdefghijklmnopqrstuvwxyz"
    pieces = [c for c in letters if c not in WORDS] + [f"##{c}" for c in letters]
    tokenizer = BertTokenizer(vocab=SPECIALS + ["[unused0]", ",", ".", "-", '"'] + WORDS + pieces)
    # weights of std 0.1, not BERT's 0.02: a random 32-wide encoder at 0.02 passes the words too
    # faintly for a few steps to learn the toy tasks reliably (the headlines: 8 seeds of 8 at
    # 0.98 or more with either head, against 4 or 5 of 8 at 0.02)
    config = tiny_bert_config(tokenizer.vocab_size, max_position_embeddings=128,
                              initializer_range=0.1)  # fmt: skip
    torch.manual_seed(0)
    (head or BertModel)(config).save_pretrained(directory, tokenizer=tokenizer)
    return directory


def topic_files(root: Path):
    """train.csv (160 headlines) and dev.csv (32) of `topic_rows` in `root`, as the DataConfig
    that reads them (text column headline, label column topic)."""
    import csv

    from bertkit.tasks.own import DataConfig

    for name, rows in (("train", topic_rows(160)), ("dev", topic_rows(32, 1))):
        with open(root / f"{name}.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["headline", "topic"])
            writer.writerows([[r["headline"], r["topic"]] for r in rows])
    return DataConfig(train=str(root / "train.csv"), validation=str(root / "dev.csv"),
                      text_column="headline", label_column="topic")  # fmt: skip


OWN_QUICK = dict(epochs=5, batch_size=8, max_seq_length=64, progress=False, learning_rate=5e-3)


def _httpx():
    return pytest.importorskip("httpx")


class Server:
    """`bertkit serve MODEL ARGS...` on a free port, up once /health says ready."""

    def __init__(self, model, *args: str) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "bertkit.cli", "serve", str(model), "--port", str(port)]
        # its output to a file: a pipe nobody reads would block a server that logs a lot
        self.output = tempfile.TemporaryFile("w+")
        self.process = subprocess.Popen([*command, *args], stdout=self.output,
                                        stderr=subprocess.STDOUT, text=True)  # fmt: skip
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"the server exited: {self.read_output()}")
            try:
                if _httpx().get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except _httpx().TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        pytest.fail("the server did not become ready in 120 s")

    def post(self, path: str, body, **kwargs):
        return _httpx().post(self.url + path, json=body, timeout=30, **kwargs)

    def metric(self, name: str) -> float:
        text = _httpx().get(self.url + "/metrics", timeout=10).text
        found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
        assert found, f"{name} not in /metrics"
        return float(found.group(1))

    def rss_mb(self) -> float:
        """The server's resident memory (Linux)."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE).group(1)) / 1024

    def read_output(self) -> str:
        self.output.seek(0)
        return self.output.read()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> str:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=60)
        return self.read_output()


# --------------------------------------------------------------------------- pairs
SOURCE, SYNONYM = WORDS[:16], WORDS[16:]  # word i of the one means word i of the other


def synonym_pairs(count: int, seed: int, negatives: bool = False) -> list[dict]:
    """Anchors of three words, positives their synonyms shuffled: no word in common."""
    rng = np.random.default_rng(seed)
    rows, seen = [], set()
    while len(rows) < count:
        picked = tuple(sorted(rng.choice(16, size=3, replace=False)))
        if picked in seen:
            continue
        seen.add(picked)
        row = {"anchor": " ".join(SOURCE[i] for i in rng.permutation(picked)),
               "positive": " ".join(SYNONYM[i] for i in rng.permutation(picked))}  # fmt: skip
        if negatives:  # the synonyms of three other words
            other = rng.choice([i for i in range(16) if i not in picked], size=3, replace=False)
            row["hard"] = " ".join(SYNONYM[i] for i in other)
        rows.append(row)
    return rows


def write_rows(path, rows):
    """`rows` (dicts) as a CSV file with a header."""
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


# A driver for `bertkit` that kills itself at the n-th file put in place (KILL_AT), 'before' the
# rename with the new file cut to half its bytes or 'after' it (KILL_WHEN), or inside the n-th
# log.jsonl append with half the line written (KILL_WHEN=log); it writes the names of the files
# a whole run put in place to WRITES, and, where TRAINED is set, a line to that file for each
# training batch this process takes (a resumed run takes only the batches after its checkpoint).
def two_at_a_time(check, items) -> list:
    """`check(item)` for every item, two at once in threads (a kill sweep's points: each a
    killed process then its resume, mostly waiting on subprocesses, which a 2-core machine runs
    side by side); the results in order, the first failure raised."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(check, items))


KILLER = """
import os, signal, sys
from pathlib import Path

from bertkit.tasks.base import FinetuneData
from bertkit.training.run_folder import RunLog

real_next, real_write, appends = FinetuneData.next_batch, RunLog.write, []


def next_batch(self):
    if os.environ.get("TRAINED"):
        with open(os.environ["TRAINED"], "a") as trained:
            trained.write(f"{os.getpid()}\\n")
    return real_next(self)


def write(self, entry):
    appends.append(entry)
    if len(appends) == int(os.environ["KILL_AT"]) and os.environ.get("KILL_WHEN") == "log":
        import json

        line = json.dumps(entry) + "\\n"
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line[: len(line) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    real_write(self, entry)


FinetuneData.next_batch, RunLog.write = next_batch, write

# SIGKILL this process at the n-th file put in place (bertkit._io's atomic rename): 'before'
# it, with the new file cut to half its bytes (a write cut short), or 'after' it
n, when, names = int(os.environ["KILL_AT"]), os.environ.get("KILL_WHEN", "before"), []
real = os.replace


def replace(source, target):
    names.append(os.path.basename(target))
    count = len(names)
    if count == n and when == "before":
        size = os.path.getsize(source)
        os.truncate(source, size // 2)
        os.kill(os.getpid(), signal.SIGKILL)
    real(source, target)
    if count == n and when == "after":
        os.kill(os.getpid(), signal.SIGKILL)


os.replace = replace
from bertkit.cli import main

code = main(sys.argv[1:])
Path(os.environ["WRITES"]).write_text("\\n".join(names))
Path(os.environ["WRITES"] + ".log").write_text(str(len(appends)))
sys.exit(code)
"""


class _RecordingMapper:
    """A corpus job's mapper that appends this process's id and the rows to `record` before
    each shard it computes (what shows which processes did the work)."""

    def __init__(self, inner, record: str) -> None:
        self.inner, self.record = inner, record

    def __call__(self, rows):
        with open(self.record, "a", encoding="utf-8") as handle:
            handle.write(f"{os.getpid()} {len(rows)}\n")
        return self.inner(rows)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@dataclass
class RecordingJob(Job):
    """A job whose mapper records who computes each shard (picklable: the spawned workers
    import it from here)."""

    record: str = ""

    def mapper(self):
        return _RecordingMapper(super().mapper(), self.record)


def trec_eval_scores(run_file: Path, qrels: dict[str, dict[str, int]]) -> dict[str, float]:
    """pytrec_eval's (trec_eval's own code) nDCG@10, MRR@10 and recall@1/10/100 of a TREC run
    file, averaged over the judged queries and rounded as `scores_of` rounds: the reference the
    retrieval scores are checked against."""
    import numpy as np
    import pytrec_eval

    run: dict[str, dict[str, float]] = {}
    for line in run_file.read_text().splitlines():
        query, _, document, rank, _score, _ = line.split()
        run.setdefault(query, {})[document] = 1000.0 - int(rank)  # the run's order, no ties
    measures = {"ndcg_cut.10", "recip_rank", "recall.1", "recall.10", "recall.100"}
    full = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)
    top10 = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(
        {q: dict(sorted(d.items(), key=lambda kv: -kv[1])[:10]) for q, d in run.items()}
    )

    def mean(table, name):
        return round(float(np.mean([v[name] for v in table.values()])), 4)

    return {"ndcg@10": mean(full, "ndcg_cut_10"), "mrr@10": mean(top10, "recip_rank"),
            **{f"recall@{k}": mean(full, f"recall_{k}") for k in (1, 10, 100)}}  # fmt: skip


def cli_in_one_process(runs: dict[str, list[str]], env: dict[str, str]) -> dict[str, dict]:
    """Several `bertkit` command lines run one after the other in one fresh process with `env`
    (what a test needs where a library reads its environment when imported, e.g. datasets'
    cache): {name: {"code": the exit code, "out" and "err": what it wrote to stdout and
    stderr}}."""
    driver = ("import contextlib, io, json, sys\nfrom bertkit import cli\n"
              "for name, argv in json.loads(sys.argv[1]).items():\n"
              "    out, err = io.StringIO(), io.StringIO()\n"
              "    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
              "        code = cli.main(argv)\n"
              "    print(json.dumps({'name': name, 'code': code, 'out': out.getvalue(),\n"
              "                      'err': err.getvalue()}))\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", driver, json.dumps(runs)], env=env,
                          capture_output=True, text=True)  # fmt: skip
    answers = {a["name"]: a for a in map(json.loads, done.stdout.splitlines())}
    assert set(answers) == set(runs), done.stderr[-3000:]
    return answers
