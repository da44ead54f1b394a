"""Freed memory kept in the heap during CPU training (bertkit.training.host_memory)."""

import contextlib
import json
import subprocess
import sys

import pytest
import torch

from bertkit.pretraining.train import run_pretraining
from bertkit.training import host_memory, loop

# (in a fresh process: a test process's heap, grown by earlier tests' training, serves such
# blocks from its free chunks whatever the settings)
_MEASURE = """
import json, resource, torch
from bertkit.training.host_memory import heap_kept, keep_heap


def faults(elements=30522 * 384, rounds=6, warm_up=12):
    # allocating, zeroing and freeing the word-embedding gradient's 47 MB, as a fine-tuning
    # step of all-MiniLM-L6-v2 does, after `warm_up` such rounds (glibc grows the heap by a
    # few such blocks before it reuses one)
    for _ in range(warm_up):
        torch.zeros(elements)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(rounds):
        torch.zeros(elements)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / rounds


out = {"default": faults()}
with heap_kept() as applied:
    out["applied"], out["kept"] = applied, faults()
out["again"] = keep_heap(True) and faults()
print(json.dumps(out))
"""


def test_heap_kept_reuses_freed_blocks():
    done = subprocess.run([sys.executable, "-c", _MEASURE], capture_output=True, text=True,
                          check=True)  # fmt: skip
    got = json.loads(done.stdout.splitlines()[-1])
    if not got["applied"]:
        pytest.skip("the C library is not glibc: nothing to keep")
    # 47 MB is 11,446 pages of 4 KiB, faulted in afresh when malloc maps a block and unmaps it
    # when freed
    assert got["kept"] < 100 < 1000 < got["default"], got
    assert got["again"] < 100, got


def test_afterwards_the_thresholds_are_where_glibcs_own_adjustment_takes_them(monkeypatch):
    """Any mallopt of them ends glibc's adjustment for the process; its 128 KiB starting
    values left fixed made a later transformers step fault 59k-88k pages against 12k-23k."""
    calls = []

    class Libc:
        def mallopt(self, parameter, value):
            calls.append((parameter, value))
            return 1

        def malloc_trim(self, pad):
            calls.append(("trim", pad))

    monkeypatch.setattr(host_memory, "_glibc", lambda: Libc())
    with host_memory.heap_kept() as applied:
        assert applied and calls == [(-4, 0), (-1, 1 << 30)]  # no mmap; no trim below 1 GiB
    assert calls[2:] == [(-4, 65536), (-3, 32 << 20), (-1, 64 << 20), ("trim", 0)]


def test_cpu_training_runs_with_the_heap_kept(setup, tmp_path, monkeypatch):
    entered = []

    @contextlib.contextmanager
    def recorded():
        entered.append(torch.backends.mkldnn.enabled)
        yield True

    monkeypatch.setattr(loop, "heap_kept", recorded)
    run_pretraining(setup / "shards", tmp_path / "run", config=str(setup / "nodrop.json"),
                    max_steps=2, batch_size=4, seq_len=32, warmup_steps=1, progress=False,
                    precision="fp32")  # fmt: skip
    assert entered == [True]  # (oneDNN is switched off inside it, for fp32)
