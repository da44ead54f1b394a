"""Freed memory kept in the process during CPU training, instead of given back to the OS.

A CPU training step frees and allocates the same large buffers every step. glibc's malloc serves
a block above its mmap threshold (at most 32 MiB) with a fresh `mmap` and unmaps it when freed,
so each step touches its large buffers' pages anew: a page fault each 4 KiB, and the kernel
zeroes every page. all-MiniLM-L6-v2 on MRPC, batches of 32, fp32, 2 threads of an AMD EPYC
family 25 model 1 (AVX2): the word embeddings' 47 MB gradient, allocated and zeroed each step,
took 98 ms of a 1,258 ms step (`aten::fill_`). One process each way (`benchmarks/
finetune_step_ab.py --threads 2 --steps 8 --rounds 3 --variants default`, then `heap-released`):
1,342 ms and 43.7k page faults a step released, 1,132 ms (1.19x) and 136 faults kept, peak
resident memory 1.55 and 1.58 GB. Within `heap_kept()`, malloc takes no block from
`mmap` and does not trim the heap below 1 GiB of free space at its top, so freed blocks are
reused; afterwards the thresholds are those glibc's own adjustment reaches, and the free top of
the heap is returned (`malloc_trim`). A C library other than glibc (macOS, musl) is left alone.

The process's resident memory stays at its peak during training, which is what the steps reuse.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
from collections.abc import Iterator

import torch

# mallopt's parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4
KEPT_TOP = 1 << 30  # free bytes at the heap's top kept within `heap_kept`
# Afterwards: glibc's thresholds where its own adjustment takes them. Any mallopt of these ends
# that adjustment for the process (the mmap threshold rises to a freed mapped block's size, up to
# 32 MiB, the trim threshold to twice it), and its 128 KiB starting values left fixed would map
# every larger block: a transformers fine-tuning step run after a `heap_kept` took 59k-88k page
# faults against 12k-23k.
_AFTER_MMAP_THRESHOLD, _AFTER_TRIM_THRESHOLD, _AFTER_MMAP_MAX = 32 << 20, 64 << 20, 65536


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 (glibc's own symbol: not musl, not macOS)
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
    except (OSError, AttributeError):
        return None
    return libc


def keep_heap(kept: bool) -> bool:
    """Freed memory kept in the heap from now on (`kept`), or glibc's thresholds as its own
    adjustment leaves them (`_AFTER_*`), the free top of the heap returned to the OS; False
    where the C library is not glibc (nothing done)."""
    libc = _glibc()
    if libc is None:
        return False
    if kept:
        libc.mallopt(_M_MMAP_MAX, 0)
        libc.mallopt(_M_TRIM_THRESHOLD, KEPT_TOP)
        return True
    libc.mallopt(_M_MMAP_MAX, _AFTER_MMAP_MAX)
    libc.mallopt(_M_MMAP_THRESHOLD, _AFTER_MMAP_THRESHOLD)
    libc.mallopt(_M_TRIM_THRESHOLD, _AFTER_TRIM_THRESHOLD)
    libc.malloc_trim(0)
    return True


@contextlib.contextmanager
def heap_kept() -> Iterator[bool]:
    """Within it, freed memory stays in the heap for the next allocation (see the module's
    doc); yields whether it applied (glibc)."""
    applied = keep_heap(True)
    try:
        yield applied
    finally:
        if applied:
            keep_heap(False)


@contextlib.contextmanager
def onednn_off(off: bool) -> Iterator[None]:
    """oneDNN switched off within it (`off`). On CPU in fp32, oneDNN compiles and caches a
    primitive for every new shape; with batches padded to their longest sequence and packed to
    their real tokens, shapes change every step and that cache grew resident memory by ~13 MB a
    step (2.9 GB after 300 steps of BERT-tiny) while buying no speed (measured: the same s/step
    without it)."""
    previous = torch.backends.mkldnn.enabled  # (mkldnn.flags() also warns about TF32)
    if off:
        torch.backends.mkldnn.enabled = False  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = previous
