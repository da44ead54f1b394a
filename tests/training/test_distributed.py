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


class TwoNodes:
    """A pre-training run by two torchrun agents on loopback (`--nnodes 2 --nproc_per_node 1`,
    c10d rendezvous, `--max-restarts 2`, the command's own --resume), each agent's output in
    a file of its own."""

    def __init__(self, setup, root) -> None:
        self.root = root
        self.common = [*map(str, tiny_cli_args(setup, steps=300, config=setup / "nodrop.json",
                                               save_every=50)), "--resume"]  # fmt: skip
        # LOGLEVEL=INFO: the agents say each rendezvous they complete (each start of workers)
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
                    "LOGLEVEL": "INFO"}  # fmt: skip

    def start(self, out):
        port, agents = _free_port(), []
        for node in (0, 1):
            output = open(self.root / f"{out.name}.node{node}.txt", "w")  # a full pipe blocks
            agents.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                 "--nproc_per_node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                 f"127.0.0.1:{port}", "--rdzv-id", out.name, "--local-addr", "127.0.0.1",
                 "--max-restarts", "2", "-m", "bertkit.cli", "pretrain", "--out", str(out),
                 *self.common],
                env=self.env, stdout=output, stderr=subprocess.STDOUT,
            ))  # fmt: skip
            # node 0 hosts the rendezvous store
            if node == 0:
                import time

                time.sleep(1.0)
        return agents

    def said(self, out, node) -> str:
        return (self.root / f"{out.name}.node{node}.txt").read_text()


@pytest.fixture(scope="module")
def two_nodes_whole(setup, tmp_path_factory):
    root = tmp_path_factory.mktemp("two_nodes")
    runner = TwoNodes(setup, root)
    agents = runner.start(root / "whole")
    for node, agent in enumerate(agents):
        assert agent.wait(timeout=600) == 0, runner.said(root / "whole", node)[-4000:]
    return runner, root / "whole"


@pytest.mark.slow
def test_a_two_node_elastic_run_restarts_either_nodes_killed_worker(two_nodes_whole):
    """Two torchrun agents on loopback, one worker each; node 0's worker SIGKILLed past the
    checkpoint of step 100, then node 1's (restarted) worker past that of step 200: both nodes
    restart together each time and the run ends with the bytes and losses of a run never
    killed. Before, only the failed node's agent counted the restart, the nodes'
    TORCHELASTIC_RESTART_COUNT differed, and the group's keys built from it did too: node 0's
    kill hung both restarted workers in init_process_group, node 1's spent a second restart."""
    import json
    import signal
    import time

    runner, whole = two_nodes_whole
    out = runner.root / "killed"
    agents = runner.start(out)
    log = out / "log.jsonl"
    deadline = time.monotonic() + 300
    steps: list[int] = []
    for node, past in ((0, 120), (1, 220)):  # past a checkpoint (every 50), before the end
        while not steps or max(steps) < past:
            assert all(a.poll() is None for a in agents) and time.monotonic() < deadline, \
                runner.said(out, node)[-4000:]  # fmt: skip
            time.sleep(0.01)
            if log.exists():
                steps = [json.loads(x)["step"] for x in log.read_text().splitlines()
                         if x.strip()]  # fmt: skip
        worker = subprocess.run(["pgrep", "-P", str(agents[node].pid)], capture_output=True,
                                text=True).stdout.split()[-1]  # fmt: skip
        os.kill(int(worker), signal.SIGKILL)
    for number, agent in enumerate(agents):
        assert agent.wait(timeout=600) == 0, runner.said(out, number)[-4000:]
    assert max(steps) < 300
    for number in (0, 1):  # its own worker killed once; two restarts each, none spent more
        said = runner.said(out, number)
        assert said.count("(exitcode: -9)") == 1, number
        assert said.count("Rendezvous complete for workers") == 3, number
    # the restarted workers resumed from a saved step (every 50), not from the start: each
    # start of the run's process writes the step it starts at
    starts = [e["step"] for e in map(json.loads, log.read_text().splitlines())
              if e["split"] == "run"]  # fmt: skip
    assert len(starts) == 3 and starts[0] == 0, starts
    assert 100 <= starts[1] < 220 and 200 <= starts[2] <= max(steps), (starts, max(steps))
    assert all(start % 50 == 0 for start in starts), starts
    assert (out / "model.safetensors").read_bytes() == (whole / "model.safetensors").read_bytes()
    assert losses(out) == losses(whole)
