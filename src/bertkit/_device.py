"""The device a run or a model uses when none is named (decided here alone), and moving tensors
to it without making the host wait."""

from __future__ import annotations

import torch


def default_device(device: str | torch.device | None = None) -> torch.device:
    """`device` as given; where none is: a GPU when one is available, else the CPU (what
    `--device` means when it is left out, for every command)."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`tensor` on `device`. To a GPU through pinned memory (a batch the data workers made is
    pinned already): a copy from pageable memory would make the host wait for every kernel
    queued before it, so the host could not run ahead of the card."""
    device = torch.device(device)
    if device.type == "cuda" and tensor.device.type == "cpu" and not tensor.is_pinned():
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def as_float64(value: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor:
    """`value` as a 0-dim float64 tensor on `like`'s device. A number is written there by a
    fill, not copied from the host (a copy of a host number to a GPU waits as any pageable copy
    does)."""
    if isinstance(value, torch.Tensor) and value.device == like.device:
        return value.to(torch.float64)
    return torch.full((), float(value), dtype=torch.float64, device=like.device)
