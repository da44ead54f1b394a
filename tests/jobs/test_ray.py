"""The corpus job on Ray Data, on a real cluster of two nodes on loopback (a head and a second
`ray start --address`), one worker process killed mid-job: the output equals one process's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from bertkit.jobs import shards
from bertkit.jobs.embed import embed

from helpers import WORDS


def worker_pids() -> list[int]:
    """The processes of the job's actors (Ray names them after the class)."""
    found = subprocess.run(["pgrep", "-f", "ShardWorker"], capture_output=True, text=True)
    return [int(p) for p in found.stdout.split()]


@pytest.mark.slow  # a Ray cluster of two nodes
def test_a_two_node_ray_job_with_a_worker_killed_equals_one_process(
    ray_cluster, words_model, tmp_path
):
    import random

    rng = random.Random(0)
    rows = [{"text": " ".join(rng.choices(WORDS, k=rng.randint(3, 20)))} for _ in range(600)]
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    local = embed(words_model, [source], tmp_path / "local", pooling="mean", threads=1,
                  rows_per_shard=25, progress=False)  # fmt: skip
    out = tmp_path / "on_ray"
    argv = [sys.executable, "-m", "bertkit.cli", "embed", "--model", str(words_model), "--input",
            str(source), "--out", str(out), "--pooling", "mean", "--threads", "1",
            "--rows-per-shard", "25", "--ray", ray_cluster, "--quiet"]  # fmt: skip
    job = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    killed = None
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and job.poll() is None:
        if len(shards.done_shards(out)) >= 3 and len(worker_pids()) >= 2:
            killed = worker_pids()[0]
            os.kill(killed, signal.SIGKILL)
            break
        time.sleep(0.2)
    _, err = job.communicate(timeout=600)
    assert job.returncode == 0, err[-4000:]
    assert killed is not None, "no worker to kill: the job ended before two actors ran"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["rows"] == 600
    assert len(manifest["shards"]) == len(local["shards"]) == 24

    def pairs(folder):
        table = shards.vectors(folder)
        return {(i, tuple(v)) for i, v in zip(table.column("id").to_pylist(),
                                              table.column("vector").to_pylist(), strict=True)}  # fmt: skip

    assert pairs(out) == pairs(tmp_path / "local")
    assert [s["sha256"] for s in manifest["shards"]] == [s["sha256"] for s in local["shards"]]
