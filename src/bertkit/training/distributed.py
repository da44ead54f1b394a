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
        shared, rank, world_size = next(dist.rendezvous("env://"))
        store = attempt_store(shared, rank, world_size)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
    return Distributed(rank, world_size, local_rank, chosen)


ATTEMPT_KEY = "bertkit/attempt_store"


def attempt_store(shared: dist.Store, rank: int, world_size: int,
                  timeout: float = 600.0) -> dist.Store:  # fmt: skip
    """A store of this attempt's workers alone, which every node finds the same way.

    torchrun's elastic agent lends the workers its rendezvous store and keeps it across
    restarts, so a restarted group would read the addresses the killed workers had published
    and fail to connect ("Gloo connectFullMesh failed ... Connection refused"). Keys of each
    attempt's own (a prefix from TORCHELASTIC_RESTART_COUNT) are no cure across nodes: only the
    agent whose worker failed counts a restart, the others restart without counting, so the
    nodes' counts differ and their halves of the group waited under different keys for ever.
    Instead rank 0 starts a new store each attempt and publishes its address and a fresh
    nonce under one key of the shared store; the other ranks read that key until it names a
    store that answers with its nonce (an address left by a killed attempt refuses the
    connection; the new rank 0 overwrites it)."""
    import secrets
    import time
    from datetime import timedelta

    host = os.environ.get("MASTER_ADDR", "127.0.0.1")  # where node rank 0 (rank 0's) runs
    if rank == 0:
        own = dist.TCPStore(host, 0, world_size, is_master=True,
                            timeout=timedelta(seconds=timeout), wait_for_workers=False)  # fmt: skip
        nonce = secrets.token_hex(8)
        own.set("bertkit/nonce", nonce)
        shared.set(ATTEMPT_KEY, f"{host} {own.port} {nonce}")
        return own
    deadline = time.monotonic() + timeout
    while True:
        host, port, nonce = shared.get(ATTEMPT_KEY).decode().split()
        try:
            client = dist.TCPStore(host, int(port), world_size, is_master=False,
                                   timeout=timedelta(seconds=5))  # fmt: skip
            if client.get("bertkit/nonce").decode() == nonce:
                client.set_timeout(timedelta(seconds=timeout))
                return client
        except (RuntimeError, dist.DistError):  # refused, or gone: a killed attempt's
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"no store of this attempt from rank 0 in {timeout:.0f} s "
                               f"(the last address published: {host}:{port})")  # fmt: skip
        time.sleep(0.5)


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
