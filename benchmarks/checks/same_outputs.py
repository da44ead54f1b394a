"""The outputs of every command, as one manifest: for showing that a change of the code's shape
changes nothing a user sees.

Runs the `bertkit` command of the source tree `--src` (put first on PYTHONPATH) through a
journey on small local data: every command's `--help`, a vocabulary, shards, a pre-training
run, a fine-tuning run over two seeds and the paper's grid, evaluate, predict, fill-mask,
similarity, attention, extract, viz, an ONNX export and a served model's answers. Writes
`manifest.json`: each help text and answer as text, each file as its SHA-256, each log line
without its clock readings (the keys `_CLOCK` names). Two manifests, one from the tree before
and one after, must be equal:

    git worktree add /tmp/before <REV>
    python benchmarks/checks/same_outputs.py --src /tmp/before/src --out /tmp/m-before
    python benchmarks/checks/same_outputs.py --src src --out /tmp/m-after
    diff /tmp/m-before/manifest.json /tmp/m-after/manifest.json && echo same

Everything runs in fp32 on the CPU with one thread, so that the bytes are reproducible.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
# Log keys that read a clock (or depend on one): left out of the comparison.
_CLOCK = re.compile(r"(time|second|elapsed|wall|per_s|_s$|rate|date|started|finished|eta|^port$)")
COMMANDS = [
    "vocab", "convert", "prepare", "pretrain", "finetune", "evaluate", "predict", "export",
    "serve", "fill-mask", "similarity", "attention", "extract", "viz", "demo",
]  # fmt: skip

CORPUS = """The cat sat on the mat. A dog barked at the cat near the river bank.
The river flows past the old mill. Children play by the water in summer.

Stock markets rose on Monday. Investors bought shares of banks and miners.
The central bank kept its rate unchanged. Analysts expect a cut next year.

The team won the final in extra time. Fans filled the streets of the city.
The coach praised his players. The captain lifted the cup above his head.
"""


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def clockless(value):
    if isinstance(value, dict):
        return {k: clockless(v) for k, v in value.items() if not _CLOCK.search(k)}
    if isinstance(value, list):
        return [clockless(v) for v in value]
    return value


def contents(value) -> object:
    """A loaded `.pt` or `.npz` as JSON: arrays as the SHA-256 of their bytes, clocks left out
    (a zip's member times and a trainer state's elapsed seconds differ from run to run)."""
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy()
    if isinstance(value, np.ndarray):
        return hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()
    if isinstance(value, dict):
        return {str(k): contents(v) for k, v in value.items() if not _CLOCK.search(str(k))}
    if isinstance(value, (list, tuple)):
        if len(value) > 16 and all(isinstance(v, (int, float)) for v in value):
            return hashlib.sha256(repr(list(value)).encode()).hexdigest()
        return [contents(v) for v in value]
    return value if isinstance(value, (int, float, str, bool, type(None))) else repr(value)


def loaded(file: Path) -> object:
    import numpy as np
    import torch

    if file.suffix == ".npz":
        with np.load(file) as arrays:
            return contents(dict(arrays))
    if file.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(file), "pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
            meta = f.metadata() or {}
        return contents({"tensors": tensors, "metadata": meta})
    state = torch.load(file, map_location="cpu", weights_only=False)
    if isinstance(state, dict) and isinstance(state.get("rng"), dict):
        # Python's and NumPy's generators are saved to be restored but a pre-training run
        # never seeds them (nor draws from them): they start from the OS's entropy.
        state["rng"] = {k: v for k, v in state["rng"].items() if k not in ("python", "numpy")}
    return contents(state)


def folder(path: Path) -> dict:
    """Every file under `path`: JSON and JSON Lines as their contents without clock readings,
    the rest as SHA-256."""
    out = {}
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        name = str(file.relative_to(path))
        if file.name.endswith(".lock"):  # the process that held the folder
            continue
        if file.suffix == ".jsonl":
            out[name] = [clockless(json.loads(line)) for line in file.read_text().splitlines()]
        elif file.suffix == ".json":
            out[name] = clockless(json.loads(file.read_text()))
        elif file.suffix in (".pt", ".npz"):
            out[name] = loaded(file)
        elif file.name.endswith(".sha256"):  # the digest of a .pt, compared by its contents
            continue
        elif file.suffix == ".md":  # a model card names the run's folder and its time
            out[name] = len(file.read_text().splitlines())
        else:
            out[name] = sha(file)
    return out


class Journey:
    def __init__(self, src: Path, work: Path) -> None:
        self.work = work
        self.env = dict(
            os.environ,
            PYTHONPATH=f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            OMP_NUM_THREADS="1",
            PYTHONHASHSEED="0",
            CUDA_VISIBLE_DEVICES="",
            TQDM_DISABLE="1",
        )
        self.manifest: dict = {}

    def bertkit(self, *args: str, check: bool = True) -> str:
        run = subprocess.run(
            [sys.executable, "-m", "bertkit.cli", *args],
            env=self.env,
            cwd=self.work,
            capture_output=True,
            text=True,
        )
        if check and run.returncode != 0:
            raise SystemExit(f"bertkit {' '.join(args)} failed:\n{run.stderr[-3000:]}")
        return run.stdout

    def run(self) -> dict:
        w, m = self.work, self.manifest
        m["help"] = {c: self.bertkit(c, "--help") for c in ["", *COMMANDS] if c} | {
            "": self.bertkit("--help")
        }
        (w / "corpus.txt").write_text(CORPUS * 30)
        self.bertkit("vocab", "corpus.txt", "--size", "300", "--out", "vocab")
        m["vocab"] = folder(w / "vocab")
        self.bertkit(
            "prepare", "corpus.txt", "--vocab", "vocab", "--out", "shards", "--workers", "1"
        )
        m["shards"] = folder(w / "shards")
        fp32 = ["--precision", "fp32", "--device", "cpu", "--compile", "off"]
        self.bertkit(
            "pretrain", "--data", "shards", "--out", "pre", "--config", "tiny",
            "--max-steps", "12", "--batch-size", "8", "--seq-len", "64", "--log-every", "2",
            "--save-every", "6", "--eval-data", "shards", "--eval-every", "6", "--warmup-steps", "2",
            *fp32,
        )  # fmt: skip
        m["pretrain"] = folder(w / "pre")
        qnli = str(FIXTURES / "glue" / "QNLI")
        tune = ["--model", "pre", "--data", qnli, "--epochs", "1", "--max-seq-length", "64"]
        self.bertkit("finetune", "qnli", *tune, "--out", "ft", "--seeds", "2", *fp32)
        m["finetune_seeds"] = folder(w / "ft")
        self.bertkit("finetune", "qnli", *tune, "--out", "grid", "--grid", *fp32)
        m["finetune_grid"] = folder(w / "grid")
        model = next(p.parent for p in sorted((w / "ft").rglob("model.safetensors"))).relative_to(w)
        m["evaluate"] = self.bertkit(
            "evaluate", "--model", str(model), "--data", qnli, "--device", "cpu"
        )
        texts = ["What flows past the mill?", "The river flows past the old mill."]
        m["predict"] = self.bertkit("predict", "--model", str(model), *texts, "--device", "cpu")
        m["fill-mask"] = self.bertkit("fill-mask", "--model", "pre", "The cat sat on the [MASK].")
        m["similarity"] = self.bertkit(
            "similarity", "--model", "pre", "the river bank", "the bank rate", "--out", "sim.png"
        )
        self.bertkit("attention", "--model", "pre", "The cat sat on the mat.", "--out", "att.png")
        self.bertkit("viz", "pre/log.jsonl", "--out", "curves.png")
        (w / "lines.txt").write_text("\n".join(line for line in CORPUS.splitlines() if line) + "\n")
        self.bertkit(
            "extract", "--model", "pre", "--input", "lines.txt", "--out", "features.safetensors"
        )
        m["extract"] = loaded(w / "features.safetensors")
        m["pictures"] = {p.name: sha(p) for p in sorted(w.glob("*.png"))}
        self.bertkit("export", "--onnx", str(model), "onnx")
        m["export"] = folder(w / "onnx")
        m["serve"] = self.serve(model)
        return m

    def serve(self, model: Path) -> dict:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = subprocess.Popen(
            [sys.executable, "-m", "bertkit.cli", "serve", str(model), "--port", str(port)],
            env=self.env,
            cwd=self.work,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(600):
                try:
                    urllib.request.urlopen(url + "/health", timeout=1)
                    break
                except OSError:
                    time.sleep(0.1)
            answers = {}
            for route, body in [
                ("/predict", {"texts": [["What flows past?", "The river flows past the mill."]]}),
                ("/embed", {"inputs": ["The river flows past the old mill."]}),
                ("/v1/embeddings", {"input": ["The cat sat."], "model": "m"}),
            ]:
                request = urllib.request.Request(
                    url + route, json.dumps(body).encode(), {"Content-Type": "application/json"}
                )
                try:
                    with urllib.request.urlopen(request, timeout=60) as response:
                        answers[route] = clockless(json.loads(response.read()))
                except urllib.error.HTTPError as err:
                    answers[route] = [err.code, err.read().decode()]
            with urllib.request.urlopen(url + "/info", timeout=10) as response:
                answers["/info"] = clockless(json.loads(response.read()))
            return answers
        finally:
            server.terminate()
            server.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, required=True, help="the source tree to run (src/)")
    parser.add_argument("--out", type=Path, required=True, help="a new folder")
    args = parser.parse_args()
    args.out.mkdir(parents=True)
    manifest = Journey(args.src.resolve(), args.out).run()
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    print(args.out / "manifest.json")


if __name__ == "__main__":
    main()
