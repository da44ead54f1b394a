"""Process groups, DDP wrapping and reductions: the one module that talks to torch.distributed.

Launch with torchrun (`torchrun --nproc_per_node N -m bertkit.cli pretrain ...`): it sets RANK,
LOCAL_RANK and WORLD_SIZE; gloo is used on CPU, NCCL on GPU. Without them everything runs in one
process and every function here is a no-op.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from bertkit._device import default_device


@dataclass(frozen=True)
class Distributed:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def setup(device: str | None = None) -> Distributed:
    """Join the process group torchrun describes (if any) and pick this process's device."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device is None:
        device = default_device().type
    chosen = torch.device(f"cuda:{local_rank}" if device == "cuda" else device)
    if chosen.type == "cuda":
        torch.cuda.set_device(chosen)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if chosen.type == "cuda" else "gloo"
        # torchrun's elastic agent lends the workers its rendezvous store and keeps it across
        # restarts, so a restarted group read the addresses the killed workers had published
        # and could not connect ("Connection refused"): each attempt keeps to keys of its own
        store, rank, world_size = next(dist.rendezvous("env://"))
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        dist.init_process_group(backend, store=dist.PrefixStore(f"bertkit/attempt{attempt}", store),
                                rank=rank, world_size=world_size)  # fmt: skip
    return Distributed(rank, world_size, local_rank, chosen)


def wrap(model: nn.Module, info: Distributed) -> nn.Module:
    """DDP over the process group. The gradients are views into DDP's all-reduce buckets
    (`gradient_as_bucket_view`): no copy between the two after each backward, and one
    gradient-sized buffer less on each card."""
    if not info.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [info.device.index] if info.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=True)


def unwrap(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)


def all_reduce_sum(tensor: torch.Tensor, info: Distributed) -> torch.Tensor:
    if info.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def barrier(info: Distributed) -> None:
    if info.enabled:
        dist.barrier()


def cleanup(info: Distributed) -> None:
    """Leave the process group, once what holds it is gone (a DDP wrapper left in a reference
    cycle would otherwise outlive the group)."""
    if info.enabled and dist.is_initialized():
        import gc

        gc.collect()
        dist.destroy_process_group()


def broadcast_float(value: float, info: Distributed) -> float:
    """Rank 0's value on every rank (a time budget's clock, so all ranks stop at one step)."""
    if not info.enabled:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=info.device)
    dist.broadcast(tensor, src=0)
    return float(tensor.item())
