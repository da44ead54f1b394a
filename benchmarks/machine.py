"""What a speed figure was measured on: the CPU's model, the vector extensions that decide
PyTorch's kernels (AVX2, AVX-512, AVX512-BF16, AMX), the kernels torch dispatches to (capped
by ATEN_CPU_CAPABILITY), the threads, torch's version.

    >>> describe()["threads"] > 0
    True
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
# what caps the instructions the libraries use (an AVX-512 machine run as an AVX2 one)
CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def describe() -> dict:
    """{"cpu": model name, "flags": the FLAGS it has, "kernels": torch's CPU capability,
    "threads": torch's, "torch": version}"""
    model, flags, ids = platform.processor() or "unknown", set(), {}
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() in ("cpu family", "model") and key.strip() not in ids:
                ids[key.strip()] = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    if ids:  # a generic name ("AMD EPYC") says little: family 26 is AMD Zen 5
        model += f", family {ids.get('cpu family', '?')} model {ids.get('model', '?')}"
    return {
        "cpu": model,
        "flags": [f for f in FLAGS if f in flags],
        "kernels": torch.backends.cpu.get_cpu_capability(),
        "caps": {name: os.environ[name] for name in CAPS if name in os.environ},
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        # a GPU run's speed is the GPU's: named where one is visible
        **({"gpu": torch.cuda.get_device_name()} if torch.cuda.is_available() else {}),
    }


def line(machine: dict | None = None) -> str:
    """describe() in one line: 'AMD EPYC (avx2 avx512f avx512_bf16; AVX512 kernels), 2 threads,
    torch 2.13.0'"""
    m = machine or describe()
    kernels = f"; {m['kernels']} kernels" if m.get("kernels") else ""
    if m.get("caps"):
        kernels += " (" + ", ".join(f"{k}={v}" for k, v in m["caps"].items()) + ")"
    return (f"{m['cpu']} ({' '.join(m['flags']) or 'no AVX2'}{kernels}), {m['threads']} threads, "
            f"torch {m['torch']}" + (f", GPU {m['gpu']}" if m.get("gpu") else ""))  # fmt: skip
