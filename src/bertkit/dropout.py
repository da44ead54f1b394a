"""Dropout masks: drawn fast by default, or as transformers draws them (`parity`).

torch's CPU dropout draws each mask element with its Mersenne Twister, one element after the
other on one thread: in a 2-thread fp32 fine-tuning step of all-MiniLM-L6-v2 that was 290 ms of
a 1,330 ms step (20 masks, 19.5% of its CPU time; Intel Xeon family 6 model 207 capped to AVX2:
docs/results/avx2_parity). `keep_mask` draws
from a counter-based generator instead: element i's bits are splitmix64 of (seed + i * golden),
an elementwise computation torch runs on every thread, four 16-bit decisions per 64-bit word. The
seed is one draw from torch's generator, so `torch.manual_seed`, the checkpointed RNG state and
activation checkpointing's replay govern it as they govern `F.dropout`. The drop probability is
that of `p` rounded to a multiple of 1/65536 (0.1 -> 0.100006), and the kept values are scaled by
the inverse of the rounded keep probability, so the expectation is exact. A 1.4M-element mask
took 5.2 ms against F.dropout's 23.9 ms at 2 threads on that Xeon (a one-off microbenchmark,
its script not committed). Different draws from
`F.dropout`'s, the same distribution: a run is statistically the same run, not the same numbers.

On a GPU `F.dropout` is already a fused, parallel Philox draw, and it stays; so it does in
compiled code.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)
_counter = torch.arange(0, dtype=torch.int64)  # grown as needed, sliced for each draw


def _counters(words: int) -> torch.Tensor:
    global _counter
    if len(_counter) < words:
        _counter = torch.arange(max(words, 2 * len(_counter)), dtype=torch.int64)
    return _counter[:words]


def _xor_shift(z: torch.Tensor, bits: int) -> None:  # z ^= z >>> bits (a logical shift)
    z ^= (z >> bits) & ((1 << (64 - bits)) - 1)


def keep_mask(shape: tuple[int, ...], p: float) -> torch.Tensor:
    """A CPU bool tensor of `shape`, each element False with probability `p` rounded to a
    multiple of 1/65536, independently; one seed drawn from torch's generator.

    >>> _ = torch.manual_seed(0); mask = keep_mask((1000, 1000), 0.1)
    >>> round(1 - mask.float().mean().item(), 3)
    0.1
    """
    size = 1
    for n in shape:
        size *= n
    words = -(-size // 4)
    seed = int(torch.randint(-(1 << 62), 1 << 62, (1,)))
    z = _counters(words) * _GOLDEN  # splitmix64 over the counters
    z += seed
    _xor_shift(z, 30)
    z *= _MIX1
    _xor_shift(z, 27)
    z *= _MIX2
    _xor_shift(z, 31)
    dropped = round(p * 65536)
    return (z.view(torch.int16)[:size] >= dropped - 32768).view(shape)


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """`F.dropout(x, p, training)` with `keep_mask`'s draws on the CPU (see the module doc).
    Compiled code draws with `F.dropout`, which inductor generates its own random numbers for
    (the seed `keep_mask` reads would break the graph at every dropout)."""
    if not training or p == 0.0 or x.device.type != "cpu" or torch.compiler.is_compiling():
        return F.dropout(x, p, training)
    dropped = round(p * 65536)
    if dropped >= 65536:
        return x * 0.0
    scale = 65536 / (65536 - dropped)
    return x * keep_mask(tuple(x.shape), p).to(x.dtype).mul_(scale)
