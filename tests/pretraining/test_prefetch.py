"""Batches made ahead in worker processes (bertkit.pretraining.prefetch): the stream's own
batches in its order, the same position to resume from, errors that say what happened."""

import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest
import torch

from bertkit.pretraining.dataset import PretrainingData
from bertkit.pretraining.prefetch import PrefetchedData, default_workers
from bertkit.pretraining.shards import Shards
from bertkit.pretraining.train import run_pretraining

from helpers import cli_command, synthetic_shards, synthetic_tokenizer, tiny_cli_args, tiny_settings


def stream(tmp_path, documents=30, batch_size=4):
    """A stream over shards made once in `tmp_path` (a second stream reads the same)."""
    tokenizer = synthetic_tokenizer()
    shards = Shards(tmp_path / "shards") if (tmp_path / "shards").exists() else None
    shards = shards or synthetic_shards(tmp_path, tokenizer, documents=documents)
    return PretrainingData(shards, tokenizer, batch_size=batch_size, seq_len=64, seed=3)


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert np.array_equal(a[name].numpy(), b[name].numpy()), name


@pytest.mark.parametrize("workers", [1, 3])
def test_the_same_batches_in_order_and_the_same_positions(tmp_path, workers):
    serial = stream(tmp_path)
    per_epoch = len(serial.plan(0)) // serial.global_batch
    count = per_epoch + 3  # across an epoch's end (its last, incomplete batch dropped)
    expected = []
    for _ in range(count):
        expected.append((serial.next_batch(), serial.state_dict()))
    ahead = PrefetchedData(stream(tmp_path), workers, depth=2)
    try:
        for batch, state in expected:
            assert_same(ahead.next_batch(), batch)
            assert ahead.state_dict() == state
        assert ahead.state_dict()["epoch"] == 1
    finally:
        ahead.close()


def test_resuming_from_a_position_continues_the_stream(tmp_path):
    serial = stream(tmp_path)
    for _ in range(5):
        serial.next_batch()
    position = serial.state_dict()
    expected = [serial.next_batch() for _ in range(4)]
    ahead = PrefetchedData(stream(tmp_path), 2)
    try:
        ahead.next_batch()  # the workers are running, ahead of a position now left
        ahead.load_state_dict(position)
        assert ahead.state_dict() == position
        for batch in expected:
            assert_same(ahead.next_batch(), batch)
    finally:
        ahead.close()


@pytest.mark.slow
def test_a_worker_error_and_a_killed_worker_are_reported(tmp_path):
    too_few = PrefetchedData(stream(tmp_path / "small", documents=2, batch_size=64), 1)
    with pytest.raises(RuntimeError, match="data worker 0 failed.*fewer than one global batch"):
        too_few.next_batch()
    ahead = PrefetchedData(stream(tmp_path / "kill"), 2, depth=1)
    ahead.next_batch()
    os.kill(ahead._processes[1].pid, signal.SIGKILL)
    ahead._processes[1].join()
    with pytest.raises(RuntimeError, match=r"data worker 1 ended \(exit code -9\)"):
        for _ in range(4):  # (batches already queued come first)
            ahead.next_batch()
    assert not ahead._processes  # the others were stopped too


def test_default_worker_count():
    assert default_workers(torch.device("cpu")) == 0
    assert 1 <= default_workers(torch.device("cuda")) <= 4
    assert default_workers(torch.device("cuda"), local_processes=1000) == 1


@pytest.mark.slow
def test_a_run_with_workers_is_the_run_without_them_and_resumes(setup, tmp_path):
    """The same log and the same weights, byte for byte; killed after a checkpoint and resumed
    with workers, the same again."""

    def run(out, workers, **more):
        settings = tiny_settings(setup, log_every=2, save_every=2)  # (log windows align)
        return run_pretraining(
            setup / "shards", out, settings, max_steps=7, warmup_steps=1, data_workers=workers,
            **more,
        )  # fmt: skip

    def logged(out):  # (a resumed run logs a "run" line for each session)
        entries = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
        drop = ("seconds", "tokens_per_s")
        return [
            {k: v for k, v in e.items() if k not in drop} for e in entries if e["split"] != "run"
        ]

    run(tmp_path / "serial", 0)
    run(tmp_path / "ahead", 2)
    assert logged(tmp_path / "ahead") == logged(tmp_path / "serial")
    weights = (tmp_path / "serial" / "model.safetensors").read_bytes()
    assert (tmp_path / "ahead" / "model.safetensors").read_bytes() == weights

    class Killed(Exception):
        pass

    def kill(entry):
        if entry["step"] == 4:  # after a checkpoint
            raise Killed

    with pytest.raises(Killed):
        run(tmp_path / "resumed", 2, on_entry=kill)
    run(tmp_path / "resumed", 2, resume=True)
    assert (tmp_path / "resumed" / "model.safetensors").read_bytes() == weights
    assert logged(tmp_path / "resumed") == logged(tmp_path / "serial")


@pytest.mark.slow
def test_a_killed_run_with_workers_leaves_no_worker_holding_its_folder(setup, tmp_path):
    """SIGKILL of the training process: its forked workers go too (they hold the run folder's
    lock through the file they inherited), so `--resume` right after it runs."""
    out = tmp_path / "run"
    args = tiny_cli_args(setup, out=out, steps=200, save_every=2)
    run = subprocess.Popen(
        cli_command("pretrain", *args, "--data-workers", "2"), stderr=subprocess.DEVNULL
    )
    log = out / "log.jsonl"
    deadline = time.monotonic() + 600  # (a guard against a hang, loose for a busy machine)
    while time.monotonic() < deadline and not (
        log.exists() and log.read_text().count("train") >= 3
    ):
        time.sleep(0.1)
    workers = _children(run.pid)
    assert len(workers) == 2, workers
    run.kill()
    run.wait()
    time.sleep(0.5)
    assert not [pid for pid in workers if _alive(pid)]
    again = subprocess.run(
        cli_command("pretrain", *args, "--data-workers", "0", "--resume"),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-2000:]


def _children(pid: int) -> list[int]:
    return [int(p) for p in open(f"/proc/{pid}/task/{pid}/children").read().split()]


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # (a zombie has ended; its parent has not reaped it)
