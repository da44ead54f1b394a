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


@pytest.mark.slow
def test_an_elastic_torchrun_restarts_a_killed_worker_to_the_same_bytes(setup, tmp_path):
    """torchrun's elastic agent (c10d rendezvous, --max-restarts 2) with the command's own
    --resume: a worker killed with SIGKILL mid-run is restarted with the other, both continue
    from the last checkpoint, and the run ends with the very bytes and losses of a run never
    killed (docs/usage.md, the cluster section)."""
    import json
    import signal
    import time

    common = [*map(str, tiny_cli_args(setup, steps=600, config=setup / "nodrop.json",
                                      save_every=100)), "--resume"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}

    def torchrun(out):
        output = open(tmp_path / f"{out.name}.txt", "w")  # a file: a full pipe would block it
        return subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node",
             "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}",
             "--max-restarts", "2", "-m", "bertkit.cli", "pretrain", "--out", str(out), *common],
            env=env, stdout=output, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def said(out) -> str:
        return (tmp_path / f"{out.name}.txt").read_text()[-4000:]

    killed = torchrun(tmp_path / "killed")
    log = tmp_path / "killed" / "log.jsonl"
    deadline = time.monotonic() + 240
    steps: list[int] = []
    while not steps or max(steps) < 250:  # past the checkpoint of step 200, before the end
        assert killed.poll() is None and time.monotonic() < deadline, said(tmp_path / "killed")
        time.sleep(0.01)
        if log.exists():
            steps = [json.loads(x)["step"] for x in log.read_text().splitlines() if x.strip()]
    workers = subprocess.run(["pgrep", "-P", str(killed.pid)], capture_output=True, text=True)
    os.kill(int(workers.stdout.split()[-1]), signal.SIGKILL)
    assert killed.wait(timeout=600) == 0, said(tmp_path / "killed")
    text = (tmp_path / "killed.txt").read_text()  # the agent saw the kill, and restarted
    assert max(steps) < 600 and "(exitcode: -9)" in text and text.count("wrote ") == 2
    whole = torchrun(tmp_path / "whole")
    assert whole.wait(timeout=600) == 0, said(tmp_path / "whole")
    a = (tmp_path / "killed" / "model.safetensors").read_bytes()
    assert a == (tmp_path / "whole" / "model.safetensors").read_bytes()
    assert losses(tmp_path / "killed") == losses(tmp_path / "whole")
