"""The model's thread count beside other work: the usable CPUs (affinity, cgroup quota) less
what other processes keep busy on them (`serve.cores.CoreShare`), read from fake /proc/stat
and cgroup files on a fake clock; and the server's choice of it (`--threads`, OMP_NUM_THREADS,
workers, the backend)."""

from __future__ import annotations

import os

import pytest
import torch

from bertkit import _device
from bertkit._device import Cpus, Threads
from bertkit.serve import cores as cores_module
from bertkit.serve.cores import CoreShare


class Clock:
    """time.monotonic and time.process_time, moved by hand."""

    def __init__(self) -> None:
        self.now, self.own = 100.0, 5.0

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(cores_module.time, "monotonic", lambda: self.now)
        monkeypatch.setattr(cores_module.time, "process_time", lambda: self.own)


def write_stat(path, busy_ticks: dict[int, int]) -> None:
    """/proc/stat with these CPUs' busy ticks (user), 1,000 idle ticks each, and a CPU this
    process may not use, always busy (it must not count)."""
    rows = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    for cpu, ticks in busy_ticks.items():
        rows.append(f"cpu{cpu} {ticks} 0 0 1000 7 0 0 0 0 0")
    rows.append(f"cpu999 {sum(busy_ticks.values()) * 50} 0 0 0 0 0 0 0 0 0")
    path.write_text("\n".join(rows) + "\nintr 1 2 3\n")


@pytest.fixture
def two_cpus(monkeypatch):
    """This process may use CPUs 0 and 1."""
    monkeypatch.setattr(cores_module.os, "sched_getaffinity", lambda pid: {0, 1})
    return Cpus(2, "affinity", "test")


def test_the_count_drops_while_another_process_holds_a_cpu_and_comes_back(
    tmp_path, monkeypatch, two_cpus
):
    tick = os.sysconf("SC_CLK_TCK")
    clock = Clock()
    clock.install(monkeypatch)
    stat = tmp_path / "stat"
    busy = {0: 0, 1: 0}
    write_stat(stat, busy)
    share = CoreShare(two_cpus, stat=str(stat), cgroup=None, window=0.25)
    assert share.threads() == 2 and share.info()["adaptive"]

    def elapse(seconds: float, others: float, own: float) -> int:
        """`seconds` pass with others keeping `others` CPUs busy and this process `own`."""
        clock.now += seconds
        clock.own += own * seconds
        busy[0] += round((others + own) * seconds * tick)
        write_stat(stat, busy)
        return share.threads()

    # this process alone, however busy: its own time is not others'
    assert [elapse(0.5, 0.0, 2.0) for _ in range(4)] == [2, 2, 2, 2]
    # a busy process on one CPU: the count goes to 1 within a few windows and stays there
    seen = [elapse(0.5, 1.0, 1.0) for _ in range(6)]
    assert seen[-3:] == [1, 1, 1] and seen.index(1) <= 2, seen
    assert share.info()["others_busy_cpus"] == pytest.approx(1.0, abs=0.1)
    # it stops: back to 2
    seen = [elapse(0.5, 0.0, 2.0) for _ in range(6)]
    assert seen[-3:] == [2, 2, 2], seen
    assert share.info()["changes"] == 2
    # a light client (a tenth of a CPU) leaves both threads
    assert [elapse(0.5, 0.1, 2.0) for _ in range(6)][-1] == 2
    # within a window nothing is read again
    clock.now += 0.1
    busy[0] += 10 * tick
    write_stat(stat, busy)
    assert share.threads() == 2


def test_under_a_quota_others_are_the_cgroups_own_usage(tmp_path, monkeypatch):
    """In a container with --cpus 2, what competes is the container's other processes: the
    cgroup's usage (cpu.stat) less this process's time — chosen by the CPUs' source, whatever
    the words that explain it."""
    clock = Clock()
    clock.install(monkeypatch)
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "cpu.max").write_text("200000 100000\n")
    usage = [0.0]

    def write() -> None:
        (cgroup / "cpu.stat").write_text(f"usage_usec {int(usage[0] * 1e6)}\nuser_usec 0\n")

    write()
    share = CoreShare(Cpus(2, "quota", "a container's limit"),
                      stat=str(tmp_path / "no-stat-needed"), cgroup=str(cgroup))  # fmt: skip
    for _ in range(6):
        clock.now += 0.5
        clock.own += 0.5  # one CPU of this process's own
        usage[0] += 1.0  # and one of another process in the container
        write()
        threads = share.threads()
    assert threads == 1


def test_unreadable_files_or_one_cpu_leave_the_count_fixed(tmp_path, two_cpus):
    share = CoreShare(two_cpus, stat=str(tmp_path / "missing"), cgroup=None)
    assert share.threads() == 2 and not share.info()["adaptive"]
    (tmp_path / "garbage").write_text("cpu0 a b c\n")
    assert not CoreShare(two_cpus, stat=str(tmp_path / "garbage"), cgroup=None).info()["adaptive"]
    assert CoreShare(Cpus(1, "affinity", "test"), cgroup=None).threads() == 1


def test_the_servers_thread_choice(monkeypatch):
    """--threads and OMP_NUM_THREADS are kept as given; several workers share the usable CPUs
    and do not adapt (each would count the others); one torch worker adapts from the usable
    CPUs, never the host's count."""
    from bertkit.serve import app
    from bertkit.serve.config import ServeConfig

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    fake = Cpus(3, "quota", "the cgroup's CPU quota (fake)")
    monkeypatch.setattr(_device, "usable_cpus", lambda cgroup=None: fake)
    monkeypatch.setattr(cores_module, "usable_cpus", lambda cgroup=None: fake)
    try:

        def fixed(config):  # the count it sets, and what set it (None: adapts)
            share = app._threads(config)
            assert share.current == torch.get_num_threads()
            return torch.get_num_threads(), share.set_by

        assert fixed(ServeConfig(threads=1)) == (1, "--threads")
        assert fixed(ServeConfig(workers=3)) == (1, "3 workers")
        assert fixed(ServeConfig(backend="onnx")) == (3, "the onnx backend")
        share = app._threads(ServeConfig())
        assert share.set_by is None and share.usable == 3 and torch.get_num_threads() == 3
        assert share.why == "the cgroup's CPU quota (fake)" and share.info()["adaptive"]
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        torch.set_num_threads(2)
        assert fixed(ServeConfig()) == (2, "OMP_NUM_THREADS")
        assert app._threads(ServeConfig()).info() == {
            "usable": 3, "why": "the cgroup's CPU quota (fake)", "now": 2, "adaptive": False,
            "set_by": "OMP_NUM_THREADS"}  # fmt: skip
    finally:
        torch.set_num_threads(before)


def test_commands_and_the_api_never_run_more_threads_than_the_usable_cpus(monkeypatch):
    """`fit_threads` (every command, `load`, the trainer): torch's count lowered to the usable
    CPUs, a lower one kept, OMP_NUM_THREADS kept."""
    from bertkit.inference.loader import load

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(_device, "usable_cpus", lambda cgroup=None: Cpus(1, "quota", "fake"))
    try:
        torch.set_num_threads(4)
        assert _device.fit_threads() == Threads(1, Cpus(1, "quota", "fake"), "cpus", "fake")
        torch.set_num_threads(4)
        with pytest.raises(OSError):  # (it fits the threads before it looks for the model)
            load("/no/such/model")
        assert torch.get_num_threads() == 1
        monkeypatch.setenv("OMP_NUM_THREADS", "4")
        torch.set_num_threads(4)
        assert _device.fit_threads().count == 4
        assert _device.fit_threads(2, workers=3) == Threads(2, Cpus(1, "quota", "fake"), "flag",
                                                            "--threads")  # fmt: skip
        monkeypatch.delenv("OMP_NUM_THREADS")
        assert _device.thread_policy(workers=2).count == 1  # never below one
    finally:
        torch.set_num_threads(before)


def test_serve_takes_the_model_as_every_command_does():
    """`bertkit serve --model M` as the other commands spell it, `bertkit serve M` as before;
    both at once, or neither, is refused by name; --help lists every route."""
    from bertkit.cli import build_parser
    from bertkit.cli.use import model_of
    from bertkit.serve.routes import ENDPOINTS

    parser = build_parser()
    assert model_of(parser.parse_args(["serve", "--model", "runs/a"]), "serve") == "runs/a"
    assert model_of(parser.parse_args(["serve", "runs/a", "--port", "9"]), "serve") == "runs/a"
    with pytest.raises(ValueError, match="two models given"):
        model_of(parser.parse_args(["serve", "runs/a", "--model", "runs/b"]), "serve")
    with pytest.raises(ValueError, match="give the model: bertkit serve --model MODEL"):
        model_of(parser.parse_args(["serve"]), "serve")
    subcommands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    described = subcommands["serve"].description or ""
    help_line = next(a.help for a in parser._subparsers._group_actions[0]._choices_actions
                     if a.dest == "serve")  # fmt: skip
    assert all(f"/{e}" in help_line + described for e in ENDPOINTS), help_line


def test_a_running_server_sets_each_batch_s_threads_and_reports_them(minilm_dir, monkeypatch):
    """The server asks its CoreShare before every batch and runs the batch with that count;
    /info reports the count now and how often it changed. (The share here says one thread
    from its second question on, as it would once another process holds a CPU.)"""
    pytest.importorskip("fastapi")
    from starlette.testclient import TestClient

    from bertkit.serve.app import Service, create_app
    from bertkit.serve.config import ServeConfig

    class Contended(CoreShare):
        asked = 0

        def threads(self) -> int:
            self.asked += 1
            if self.asked > 1 and self.current != 1:
                self.current, self.changes = 1, self.changes + 1
            return self.current

    before = torch.get_num_threads()
    try:
        service = Service(str(minilm_dir), ServeConfig(precision="fp32", threads=None))
        service.cores = Contended(Cpus(2, "affinity", "test"), stat=None)
        torch.set_num_threads(2)
        seen = []
        run = service.model.run
        monkeypatch.setattr(service.model, "run",
                            lambda *a: seen.append(torch.get_num_threads()) or run(*a))  # fmt: skip
        with TestClient(create_app(service)) as http:
            for _ in range(2):
                assert http.post("/embed", json={"inputs": "a text"}).status_code == 200
            threads = http.get("/info").json()["threads"]
        assert seen == [2, 1]
        assert (threads["now"], threads["changes"], threads["usable"]) == (1, 1, 2)
    finally:
        torch.set_num_threads(before)
