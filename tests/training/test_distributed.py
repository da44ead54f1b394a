"""torchrun with 2 CPU processes equals one process with the global batch (bertkit.training.distributed)."""

import os
import socket
import subprocess
import sys

import pytest
from safetensors.torch import load_file

from helpers import cli_command, losses, tiny_cli_args


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("accumulate", [1, 2])
def test_two_process_ddp_equals_one_process_with_the_same_global_batch(setup, tmp_path, accumulate):
    """Also with accumulation: DDP's no_sync micro-batches and its gradient buckets (the
    gradients are views into them) add up to the one process's step."""
    common = [*tiny_cli_args(setup, steps=8, config=setup / "nodrop.json"),
              "--accumulate", accumulate]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
    ]
    ddp = [
        *torchrun,
        "-m",
        "bertkit.cli",
        "pretrain",
        "--out",
        str(tmp_path / "ddp"),
        *map(str, common),
    ]
    for command in (ddp, cli_command("pretrain", "--out", tmp_path / "one", *common)):
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        assert done.returncode == 0, f"{command[:6]} failed:\n{done.stderr[-4000:]}"
    a = load_file(tmp_path / "ddp" / "model.safetensors")
    b = load_file(tmp_path / "one" / "model.safetensors")
    delta = max((a[k] - b[k]).abs().max().item() for k in a)
    print(f"\nDDP (2 ranks) vs 1 process after 8 steps: max |parameter difference| = {delta:.1e}")
    assert delta <= 1e-5
    la, lb = losses(tmp_path / "ddp"), losses(tmp_path / "one")
    assert all(abs(la[s] - lb[s]) <= 1e-5 for s in la)
