"""Moving tensors to the device a step runs on without making the host wait."""

from __future__ import annotations

import torch


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`tensor` on `device`. To a GPU through pinned memory (a batch the data workers made is
    pinned already): a copy from pageable memory would make the host wait for every kernel
    queued before it, so the host could not run ahead of the card."""
    device = torch.device(device)
    if device.type == "cuda" and tensor.device.type == "cpu" and not tensor.is_pinned():
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)
