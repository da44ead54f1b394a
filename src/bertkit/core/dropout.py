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
its script not committed). The words are hashed 64K at a time, each chunk's passes in the
core's L2 cache, and `dropout`'s mask is written as the scaled float mask it multiplies by,
chunk by chunk. Different draws from
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
_golden = torch.arange(0, dtype=torch.int64)  # counter * golden, grown as needed, sliced per draw
# 64-bit words hashed a pass: 512 KiB, so a chunk's dozen elementwise passes stay in the core's L2
# cache instead of streaming a (B, A, S, S) mask's words through memory a dozen times
_CHUNK = 1 << 16


def _scaled_counters(words: int) -> torch.Tensor:
    global _golden
    if len(_golden) < words:
        _golden = torch.arange(max(words, 2 * len(_golden)), dtype=torch.int64) * _GOLDEN
    return _golden[:words]


def _xor_shift(z: torch.Tensor, bits: int) -> None:  # z ^= z >>> bits (a logical shift)
    z ^= (z >> bits) & ((1 << (64 - bits)) - 1)


def _splitmix(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser, in place, over counters already scaled and seeded."""
    _xor_shift(z, 30)
    z *= _MIX1
    _xor_shift(z, 27)
    z *= _MIX2
    _xor_shift(z, 31)
    return z


def _threshold(p: float) -> int:
    """An element is kept where its signed 16-bit draw is at least this: probability 1 - p,
    with p rounded to a multiple of 1/65536."""
    return round(p * 65536) - 32768


def _kept_value(p: float) -> float | None:
    """What a kept element is multiplied by: the inverse of the rounded keep probability;
    None where p rounds to 1 (everything dropped)."""
    dropped = round(p * 65536)
    return None if dropped >= 65536 else 65536 / (65536 - dropped)


def _draw(shape: tuple[int, ...], p: float, dtype: torch.dtype, kept: float) -> torch.Tensor:
    """The mask of `shape` in `dtype`: `kept` where an element is kept, 0 where it is dropped."""
    size = 1
    for n in shape:
        size *= n
    words = -(-size // 4)
    seed = int(torch.randint(-(1 << 62), 1 << 62, (1,)))
    threshold = _threshold(p)
    out = torch.empty(4 * words, dtype=dtype)
    scaled = _scaled_counters(words)
    for start in range(0, words, _CHUNK):
        z = _splitmix(scaled[start : start + _CHUNK] + seed)
        cells = out[4 * start : 4 * (start + len(z))]
        torch.ge(z.view(torch.int16), threshold, out=cells)
        if kept != 1.0:
            cells.mul_(kept)
    return out[:size].view(shape)


def keep_mask(shape: tuple[int, ...], p: float) -> torch.Tensor:
    """A CPU bool tensor of `shape`, each element False with probability `p` rounded to a
    multiple of 1/65536, independently; one seed drawn from torch's generator.

    >>> _ = torch.manual_seed(0); mask = keep_mask((1000, 1000), 0.1)
    >>> round(1 - mask.float().mean().item(), 3)
    0.1
    """
    return _draw(shape, p, torch.bool, 1.0)


def dropout_mask(shape: tuple[int, ...], p: float, dtype: torch.dtype) -> torch.Tensor:
    """What `dropout` multiplies by: 0 where an element is dropped, the inverse of the (rounded)
    keep probability where it is kept (all 0 where `p` rounds to 1)."""
    kept = _kept_value(p)
    return torch.zeros(shape, dtype=dtype) if kept is None else _draw(shape, p, dtype, kept)


def dropout_mask_at(
    shape: tuple[int, ...], index: torch.Tensor, p: float, dtype: torch.dtype
) -> torch.Tensor:
    """The elements at flat positions `index` (any shape, int64) of the `dropout_mask(shape, p,
    dtype)` the same generator state would draw, shaped as `index`, without drawing the rest:
    each element's bits are a hash of its own counter (the module doc). What a layer that
    computes a few rows of a (B, A, S, S) probability grid multiplies them by, so that its
    masks do not depend on what it computes (`BertLayer`'s queries where read)."""
    kept = _kept_value(p)
    if kept is None:
        return torch.zeros(index.shape, dtype=dtype)
    seed = int(torch.randint(-(1 << 62), 1 << 62, (1,)))
    words = _splitmix(torch.div(index, 4, rounding_mode="floor") * _GOLDEN + seed)
    lanes = words.view(torch.int16).view(*index.shape, 4)
    bits = lanes.gather(-1, (index % 4).unsqueeze(-1)).squeeze(-1)
    return torch.ge(bits, _threshold(p)).to(dtype).mul_(kept)


def _torch_draws(x: torch.Tensor) -> bool:
    """Whether masks for `x` are torch's own: on a GPU, and in compiled code, which inductor
    generates its own random numbers for (the seed `_draw` reads would break the graph)."""
    return x.device.type != "cpu" or torch.compiler.is_compiling()


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """`F.dropout(x, p, training)` with `keep_mask`'s draws on the CPU (see the module doc)."""
    if not training or p == 0.0 or _torch_draws(x):
        return F.dropout(x, p, training)
    return x * dropout_mask(tuple(x.shape), p, x.dtype)


def mask_like(x: torch.Tensor, shape: tuple[int, ...], p: float) -> torch.Tensor:
    """A `dropout_mask` of `shape` on `x`'s device and in its dtype, drawn as `dropout` draws
    for `x` (a mask of more rows than `x` has, for `x` to take some of: `TokenLayout.dropout`)."""
    if _torch_draws(x):
        return F.dropout(x.new_ones(shape), p, True)
    return dropout_mask(shape, p, x.dtype)


def mask_at(x: torch.Tensor, shape: tuple[int, ...], index: torch.Tensor, p: float) -> torch.Tensor:
    """`mask_like`'s mask of `shape` at flat positions `index`, shaped as `index`: on the CPU
    drawn there alone (`dropout_mask_at`); where torch draws, a mask of its own."""
    if _torch_draws(x):
        return F.dropout(x.new_ones(index.shape), p, True)
    return dropout_mask_at(shape, index, p, x.dtype).to(x.device)
