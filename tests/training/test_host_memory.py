"""Freed memory kept in the heap during CPU training (bertkit.training.host_memory)."""

import contextlib
import resource

import pytest
import torch

from bertkit.pretraining.train import run_pretraining
from bertkit.training import loop
from bertkit.training.host_memory import heap_kept, keep_heap


def _faults_per_allocation(
    rounds: int = 6, warm_up: int = 12, elements: int = 30522 * 384
) -> float:
    """Page faults of allocating and zeroing the word-embedding gradient's 47 MB, then freeing
    it (what a fine-tuning step of all-MiniLM-L6-v2 does), after `warm_up` such rounds (glibc
    grows the heap by a few such blocks before it reuses one)."""
    for _ in range(warm_up):
        torch.zeros(elements)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(rounds):
        torch.zeros(elements)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / rounds


def test_heap_kept_reuses_freed_blocks_and_restores_the_defaults():
    with heap_kept() as applied:
        if not applied:
            pytest.skip("the C library is not glibc: nothing to keep")
        kept = _faults_per_allocation()
    released = _faults_per_allocation()
    # 47 MB is 11,446 pages of 4 KiB, faulted in afresh (some or all) when malloc maps a block
    # and unmaps it when freed
    assert kept < 100 < 1000 < released, (kept, released)
    assert keep_heap(True) and _faults_per_allocation() < 100
    assert keep_heap(False) and _faults_per_allocation() > 1000
    # afterwards a 12 MB block comes from the heap, as glibc's own threshold adjustment would
    # have it (the 128 KiB threshold left fixed mapped it afresh: 3,072 faults each time)
    assert _faults_per_allocation(elements=3 << 20) < 1000


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
