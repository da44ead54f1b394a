"""The training loop (bertkit.training.loop): resume after kills, signals, NaN guard, state checks."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from bertkit.pretraining.train import run_pretraining

from helpers import cli_command, losses, tiny_cli_args, tiny_settings

ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}


def _pretraining(*args, stderr=subprocess.PIPE) -> subprocess.Popen:
    """`bertkit pretrain ARGS` started in a process of its own, on one thread."""
    command = cli_command("pretrain", *args)
    return subprocess.Popen(command, env=ONE_THREAD, stdout=subprocess.DEVNULL, stderr=stderr,
                            text=True)  # fmt: skip


def _wait_for_steps(out, steps: int, seconds: float = 120) -> None:
    """Until the run writing `out` has logged `steps` training steps (or `seconds` passed)."""
    log, deadline = out / "log.jsonl", time.time() + seconds
    while time.time() < deadline:
        if log.exists() and log.read_text().count('"split": "train"') >= steps:
            return
        time.sleep(0.02)


@pytest.mark.slow
def test_killed_run_resumes_with_identical_losses(setup, tmp_path):
    common = tiny_cli_args(setup, steps=60, warmup_steps=5, save_every=10)
    # beside the run to kill (one thread each, two cores)
    whole = _pretraining("--out", tmp_path / "whole", *common)
    killed = _pretraining("--out", tmp_path / "killed", *common, stderr=subprocess.DEVNULL)
    # kill it mid-run, after a checkpoint and some steps beyond it
    _wait_for_steps(tmp_path / "killed", 25)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    _, err = whole.communicate(timeout=300)
    assert whole.returncode == 0, err[-3000:]
    expected = losses(tmp_path / "whole")
    assert len(expected) == 60
    before = losses(tmp_path / "killed")
    assert 25 <= max(before) < 60, "the run was not killed mid-run"
    subprocess.run(
        cli_command("pretrain", "--out", tmp_path / "killed", *common, "--resume"),
        check=True,
        env=ONE_THREAD,
        capture_output=True,
    )
    after = losses(tmp_path / "killed")
    assert sorted(after) == list(range(1, 61))
    for step in range(1, 61):
        assert abs(after[step] - expected[step]) <= 1e-6, (step, after[step], expected[step])
    final_a = load_file(tmp_path / "whole" / "model.safetensors")
    final_b = load_file(tmp_path / "killed" / "model.safetensors")
    assert all(torch.equal(final_a[k], final_b[k]) for k in final_a)


def test_log_goes_to_tensorboard_when_installed(tmp_path, monkeypatch):
    """TensorBoard is optional: with it, every logged number is also a scalar; resuming purges
    the steps after the checkpoint, as log.jsonl does."""
    import types

    from bertkit.training.run_folder import RunLog

    calls = []

    class FakeWriter:
        def __init__(self, logdir, purge_step=None):
            calls.append(("open", logdir, purge_step))

        def add_scalar(self, tag, value, step):
            calls.append((tag, value, step))

        def flush(self):
            pass

    monkeypatch.setitem(
        sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=FakeWriter)
    )
    log = RunLog(tmp_path / "log.jsonl", enabled=True, keep_until=0)
    log.write({"step": 5, "split": "train", "loss": 2.5, "lr": 1e-4})
    log.write({"step": 5, "split": "eval", "mlm_accuracy": 0.25})
    assert calls == [
        ("open", str(tmp_path / "tensorboard"), 1),
        ("train/loss", 2.5, 5),
        ("train/lr", 1e-4, 5),
        ("eval/mlm_accuracy", 0.25, 5),
    ]
    calls.clear()
    RunLog(tmp_path / "log.jsonl", enabled=True, keep_until=5)
    assert calls == [("open", str(tmp_path / "tensorboard"), 6)]
    assert len((tmp_path / "log.jsonl").read_text().splitlines()) == 2


@pytest.mark.slow
def test_budget_run_stops_on_time_charges_no_evaluation_and_resumes_on_its_clock(setup, tmp_path):
    kwargs = dict(
        budget_seconds=3.0,
        eval_data=setup / "shards",
        eval_batches=2,
        eval_every=5,
        warmup_fraction=0.2,
    )
    settings = tiny_settings(setup)
    entries = run_pretraining(setup / "shards", tmp_path / "run", settings, **kwargs)
    train = [e for e in entries if e["split"] == "train"]
    assert len(train) >= 5  # several steps fit in 3 s of this model
    seconds = [e["seconds"] for e in train]
    assert seconds == sorted(seconds) and 3.0 <= seconds[-1] < 3.0 + 2 * max(
        b - a for a, b in zip([0.0, *seconds], seconds, strict=False)
    )
    lrs = [e["lr"] for e in train]
    peak = lrs.index(max(lrs))
    assert 0 < peak < len(lrs) - 1 and lrs[-1] < 0.5 * max(lrs)  # up, then down with the clock
    tokens = [e["tokens"] for e in train]
    assert tokens == sorted(tokens) and tokens[0] > 0
    state = torch.load(tmp_path / "run" / "trainer_state.pt", weights_only=True)
    assert state["train_seconds"] == pytest.approx(seconds[-1], abs=0.01)
    # a finished budget is not run again; a bigger one is refused (it would stretch the schedule)
    assert (
        run_pretraining(setup / "shards", tmp_path / "run", settings, resume=True, **kwargs) == []
    )
    with pytest.raises(ValueError, match="budget_seconds = 3.0, not 6.0"):
        run_pretraining(
            setup / "shards",
            tmp_path / "run",
            settings,
            resume=True,
            **kwargs | {"budget_seconds": 6.0},
        )


def test_resume_refuses_a_stretched_schedule_and_a_warmup_as_long_as_the_run(setup, tmp_path):
    common = dict(
        config=str(setup / "config.json"), batch_size=8, seq_len=64, log_every=2, progress=False
    )
    run_pretraining(setup / "shards", tmp_path / "run", max_steps=4, warmup_steps=1, **common)
    with pytest.raises(ValueError, match=r"max_steps = 4, not 8.*--max-steps.*--init-from"):
        run_pretraining(
            setup / "shards", tmp_path / "run", max_steps=8, warmup_steps=1, resume=True, **common
        )
    with pytest.raises(ValueError, match="never reach its peak"):
        run_pretraining(setup / "shards", tmp_path / "other", max_steps=400, **common)
    with pytest.raises(ValueError, match="--warmup-fraction"):
        run_pretraining(
            setup / "shards", tmp_path / "other", budget_seconds=5, warmup_steps=10, **common
        )


@pytest.mark.slow
def test_sigterm_saves_a_resumable_checkpoint_and_exits_with_one_line(setup, tmp_path):
    out = tmp_path / "run"
    steps = 120  # 5 logged before the pause; a step takes some 25 ms
    run = _pretraining(*tiny_cli_args(setup, out, steps=steps))
    _wait_for_steps(out, 5)
    # Paused while the second process starts (that takes longer than the run's steps on a
    # fast machine, and a run that has finished its loop dies of SIGTERM like any process).
    run.send_signal(signal.SIGSTOP)
    # a second writer into the live folder is refused, and the first run goes on
    second = subprocess.run(
        cli_command("pretrain", *tiny_cli_args(setup, out, steps=steps), "--resume"),
        env=ONE_THREAD,
        capture_output=True,
        text=True,
    )
    assert second.returncode == 2 and "another bertkit process (pid" in second.stderr
    assert run.poll() is None
    run.send_signal(signal.SIGTERM)  # pending until the run continues
    run.send_signal(signal.SIGCONT)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 128 + signal.SIGTERM, err
    lines = [line for line in err.splitlines() if line.startswith("bertkit pretrain:")]
    assert len(lines) == 1 and "stopped by SIGTERM at step" in lines[0] and "--resume" in lines[0]
    assert "Traceback" not in err
    step = int(lines[0].split("at step ")[1].split(";")[0])
    assert torch.load(out / "trainer_state.pt", weights_only=True)["step"] == step  # nothing lost
    assert max(losses(out)) == step
    (out / ".trainer_state.pt.leftover.tmp").write_bytes(b"x" * 100)  # what a SIGKILL can leave
    resumed = subprocess.run(
        cli_command("pretrain", *tiny_cli_args(setup, out, steps=steps), "--resume"),
        env=ONE_THREAD,
        capture_output=True,
        text=True,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(losses(out)) == list(range(1, steps + 1))
    assert not list(out.glob(".*.tmp"))


def test_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(setup, tmp_path):
    from bertkit.cli import main
    from bertkit.errors import TrainingDiverged
    from bertkit.pretraining import train as train_module

    out = tmp_path / "run"
    args = [str(a) for a in tiny_cli_args(setup, out, steps=6)]
    args[args.index("--save-every") + 1] = "2"
    real = train_module.PretrainingObjective.loss
    calls = []

    def poisoned(self, model, batch, totals):  # step 5's loss is NaN
        calls.append(1)
        loss, stats = real(self, model, batch, totals)
        return (loss * float("nan"), stats) if len(calls) == 5 else (loss, stats)

    train_module.PretrainingObjective.loss = poisoned
    try:
        with pytest.raises(TrainingDiverged, match="NaN or infinite at step 5"):
            train_module.run_pretraining(
                setup / "shards", out, phases=[(64, 6)], config=str(setup / "config.json"),
                batch_size=8, learning_rate=1e-3, warmup_steps=2, save_every=2, progress=False,
            )  # fmt: skip
    finally:
        train_module.PretrainingObjective.loss = real
    state = torch.load(out / "trainer_state.pt", weights_only=True)
    assert state["step"] == 4
    weights = load_file(out / "model.safetensors")
    assert all(torch.isfinite(v).all() for v in weights.values())
    assert all(torch.equal(weights[k], state["model"][k]) for k in weights if k in state["model"])
    # absurd learning rates end in a clear message, not a model of NaNs
    bad = tmp_path / "bad"
    args = [str(a) for a in tiny_cli_args(setup, bad, steps=5)]
    args[args.index("--lr") + 1] = "1e30"
    assert main(["pretrain", *args]) == 2
    assert not (bad / "model.safetensors").exists()


def test_a_finished_run_resumed_repairs_its_final_files(setup, tmp_path, caplog):
    import hashlib

    from bertkit.cli import main

    out = tmp_path / "run"
    args = [str(a) for a in tiny_cli_args(setup, out, steps=6)]
    args[args.index("--save-every") + 1] = "3"
    assert main(["pretrain", *args]) == 0
    final = load_file(out / "model.safetensors")
    # the model file's checksum is recorded beside the state's
    recorded = json.loads((out / "trainer_state.sha256").read_text())["model.safetensors"]
    assert recorded == hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    # a kill between the final model and the final state (older orders wrote the state first):
    # the model file is stale and the curves were never drawn
    stale = {k: torch.zeros_like(v) for k, v in final.items()}
    from safetensors.torch import save_file

    save_file(stale, out / "model.safetensors", metadata={"format": "pt"})
    (out / "curves.png").unlink()
    assert main(["pretrain", *args, "--resume"]) == 0
    assert "model.safetensors: not the model of step 6" in caplog.text
    repaired = load_file(out / "model.safetensors")
    assert all(torch.equal(repaired[k], final[k]) for k in final)
    assert (out / "curves.png").exists()
    assert sorted(losses(out)) == list(range(1, 7))  # nothing trained again


def test_a_corrupt_or_truncated_state_is_refused_by_name(setup, tmp_path):
    from bertkit.cli import main

    out = tmp_path / "run"
    args = [str(a) for a in tiny_cli_args(setup, out, steps=4)]
    args[args.index("--save-every") + 1] = "2"
    assert main(["pretrain", *args]) == 0
    state = out / "trainer_state.pt"
    good = state.read_bytes()
    flipped = bytearray(good)
    middle = len(flipped) // 2
    flipped[middle : middle + 64] = bytes(b ^ 0xFF for b in flipped[middle : middle + 64])
    for broken in (bytes(flipped), good[: len(good) // 3]):
        state.write_bytes(broken)
        with pytest.raises(ValueError, match="trainer_state.pt: the file is corrupt"):
            run_pretraining(
                setup / "shards", out, config=str(setup / "config.json"), max_steps=4,
                batch_size=8, seq_len=64, learning_rate=1e-3, warmup_steps=2, resume=True,
                progress=False,
            )  # fmt: skip
    (out / "trainer_state.sha256").unlink()  # without the checksum: still a clear error
    with pytest.raises(ValueError, match="trainer_state.pt: cannot read the trainer state"):
        run_pretraining(
            setup / "shards", out, config=str(setup / "config.json"), max_steps=4, batch_size=8,
            seq_len=64, learning_rate=1e-3, warmup_steps=2, resume=True, progress=False,
        )  # fmt: skip


def test_resume_names_log_lines_it_cannot_read(tmp_path, caplog):
    from bertkit.training.run_folder import RunLog

    log = tmp_path / "log.jsonl"
    log.write_bytes(
        b'{"step": 1, "split": "train"}\n\xff\xfe garbled\n{"step": 2, "split": "train"}\n'
        b'{"step": 3, "spl'  # the last line, cut short by a kill: dropped quietly
    )
    with caplog.at_level("WARNING", logger="bertkit"):
        writer = RunLog(log, True, keep_until=3)
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [1, 2]
    writer.write({"step": 4, "split": "train", "loss": float("nan")})  # no handle held between
    assert json.loads(log.read_text().splitlines()[-1]) == {
        "step": 4,
        "split": "train",
        "loss": None,
    }
    assert [r.getMessage() for r in caplog.records] == [
        f"{log}:2: not a log entry, dropped on resume"
    ]


def test_bf16_autocast_trains_on_cpu_close_to_fp32(setup, tmp_path):
    """The GPU path's autocast, exercised on the CPU: dtype bugs show here before a GPU user
    meets them."""
    kwargs = dict(
        config=str(setup / "nodrop.json"),
        max_steps=4,
        batch_size=8,
        seq_len=32,
        learning_rate=1e-3,
        warmup_steps=1,
        log_every=1,
        progress=False,
    )
    fp32 = run_pretraining(setup / "shards", tmp_path / "fp32", precision="fp32", **kwargs)
    bf16 = run_pretraining(setup / "shards", tmp_path / "bf16", precision="bf16", **kwargs)
    first = [e["loss"] for e in fp32 if e["split"] == "train"]
    second = [e["loss"] for e in bf16 if e["split"] == "train"]
    assert len(first) == len(second) == 4 and np.isfinite(second).all()
    assert np.allclose(first, second, rtol=0.02)  # bf16 keeps 8 bits of mantissa
    # and it did compute in bf16: the same seed in fp32 would give fp32's losses to the bit
    assert all(a != b for a, b in zip(first, second, strict=True)), (first, second)
    weights = load_file(tmp_path / "bf16" / "model.safetensors")
    assert all(v.dtype == torch.float32 for v in weights.values())  # master weights stay fp32


def test_a_kill_during_the_final_save_resumes_to_the_same_model(setup, tmp_path, monkeypatch):
    """The final save writes the model, then the state: killed inside it, the run resumes from
    the previous checkpoint and ends with the uninterrupted run's model and a finished state."""
    from bertkit.pretraining import train as train_module

    args = dict(
        config=str(setup / "nodrop.json"), max_steps=6, batch_size=4, seq_len=32,
        learning_rate=1e-3, warmup_steps=1, save_every=3, progress=False,
    )  # fmt: skip
    run_pretraining(setup / "shards", tmp_path / "whole", **args)
    real = train_module.Trainer.save

    def killed_in_the_final_save(self):
        if self.step == 6:
            self.save_model(self.model, self.out_dir)  # the model is written ...
            raise KeyboardInterrupt  # ... and the process dies before the state
        real(self)

    monkeypatch.setattr(train_module.Trainer, "save", killed_in_the_final_save)
    with pytest.raises(KeyboardInterrupt):
        run_pretraining(setup / "shards", tmp_path / "run", **args)
    assert torch.load(tmp_path / "run" / "trainer_state.pt", weights_only=True)["step"] == 3
    monkeypatch.setattr(train_module.Trainer, "save", real)
    run_pretraining(setup / "shards", tmp_path / "run", resume=True, **args)
    assert torch.load(tmp_path / "run" / "trainer_state.pt", weights_only=True)["step"] == 6
    whole = load_file(tmp_path / "whole" / "model.safetensors")
    resumed = load_file(tmp_path / "run" / "model.safetensors")
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)
    assert (tmp_path / "run" / "curves.png").exists()


@pytest.mark.slow
def test_ctrl_c_saves_and_says_one_line_instead_of_a_traceback(setup, tmp_path):
    out = tmp_path / "run"
    run = _pretraining(*tiny_cli_args(setup, out, steps=400))
    _wait_for_steps(out, 3)
    run.send_signal(signal.SIGINT)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 128 + signal.SIGINT, err
    assert "stopped by SIGINT at step" in err and "KeyboardInterrupt" not in err
    step = torch.load(out / "trainer_state.pt", weights_only=True)["step"]
    assert step == max(losses(out))


class _KillPoints:
    """Copies of a run folder as a SIGKILL would leave it at each point of each file write:
    a temporary file just made (empty), half written, whole but not renamed, renamed in; and
    after each log line, that line cut in half. `copies` lists (file, stage, folder)."""

    def __init__(self, out, root, monkeypatch):
        import tempfile

        from bertkit.training.run_folder import RunLog

        self.out, self.root, self.copies = out, root, []
        real_replace, real_mkstemp, real_write = os.replace, tempfile.mkstemp, RunLog.write

        def replace(src, dst, *args, **kwargs):
            name = os.path.basename(dst)
            if self._ours(dst):
                self.copy(name, "written, not renamed")
                self.copy(name, "half written", cut=(src, 0.5))
            real_replace(src, dst, *args, **kwargs)
            if self._ours(dst):
                self.copy(name, "renamed in")

        def mkstemp(*args, dir=None, **kwargs):
            made = real_mkstemp(*args, dir=dir, **kwargs)
            if dir is not None and self._ours(made[1]):  # atomic_path's ".NAME.XXXX.tmp"
                self.copy(os.path.basename(made[1])[1:].rsplit(".", 2)[0], "temporary made")
            return made

        def write(log, entry):
            real_write(log, entry)
            self.copy("log.jsonl", f"line of step {entry['step']} cut", cut=(log.path, "line"))

        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
        monkeypatch.setattr(RunLog, "write", write)

    def _ours(self, path) -> bool:
        return os.path.dirname(os.path.abspath(path)) == str(self.out)

    def copy(self, name, stage, cut=None):
        import shutil

        folder = self.root / f"kill{len(self.copies):03d}"
        shutil.copytree(self.out, folder)
        if cut is not None:
            path, how = cut
            target = folder / os.path.basename(path)
            data = target.read_bytes()
            if how == "line":  # the last line loses its second half and its newline
                start = data.rstrip(b"\n").rfind(b"\n") + 1
                data = data[: start + (len(data) - start) // 2]
            else:
                data = data[: int(len(data) * how)]
            target.write_bytes(data)
        self.copies.append((name, stage, folder))


@pytest.mark.slow
def test_a_kill_at_any_point_of_any_save_resumes_to_the_uninterrupted_run(
    setup, tmp_path, monkeypatch, caplog
):
    """Every point of every file write of a run (run record, log, the first save's model,
    vocabulary, config, state and digests, the final save, the curves): the folder a kill
    leaves there, resumed, ends with the uninterrupted run's losses and model bit for bit, and
    no temporary file. The first save included: a model beside no state is this run's own."""
    args = dict(
        config=str(setup / "config.json"), max_steps=4, batch_size=4, seq_len=32,
        learning_rate=1e-3, warmup_steps=1, save_every=2, log_every=1, progress=False,
    )  # fmt: skip
    run_pretraining(setup / "shards", tmp_path / "whole", **args)
    expected, model = losses(tmp_path / "whole"), (tmp_path / "whole" / "model.safetensors")
    points = _KillPoints(tmp_path / "run", tmp_path / "kills", monkeypatch)
    run_pretraining(setup / "shards", tmp_path / "run", **args)
    monkeypatch.undo()
    assert losses(tmp_path / "run") == expected  # the copying changed nothing
    written = {name for name, _, _ in points.copies}
    assert written >= {"run.json", "log.jsonl", "model.safetensors", "config.json", "vocab.txt",
                       "trainer_state.pt", "trainer_state.sha256", "curves.png"}, written  # fmt: skip
    first_save = [stage for name, stage, folder in points.copies
                  if name == "model.safetensors" and not (folder / "trainer_state.pt").exists()]  # fmt: skip
    assert "renamed in" in first_save, "no kill point between the first model and its state"
    tried: dict[tuple[str, str], int] = {}  # (file, stage) -> kill points: `pytest -s` prints
    seen = set()
    for name, stage, folder in points.copies:
        what = f"{name}: {stage} ({folder.name})"
        key = (name, "line cut" if stage.startswith("line of step") else stage)
        tried[key] = tried.get(key, 0) + 1
        # a folder another kill point left already (the same files; a temporary one, of any
        # length, beside them: a write's first three stages) resumes as that one did
        state = tuple(sorted((p.name, b"" if p.name.endswith(".tmp") else p.read_bytes())
                             for p in folder.iterdir()))  # fmt: skip
        if state in seen:
            continue
        seen.add(state)
        caplog.clear()
        run_pretraining(setup / "shards", folder, resume=True, **args)
        assert losses(folder) == expected, what
        assert (folder / "model.safetensors").read_bytes() == model.read_bytes(), what
        assert torch.load(folder / "trainer_state.pt", weights_only=True)["step"] == 4, what
        assert not list(folder.glob(".*.tmp")), what
    assert len(points.copies) >= 40 and len(seen) >= 30, (len(points.copies), len(seen))
    print(f"\n{len(points.copies)} kill points, {len(seen)} distinct folders resumed")
    print("| file | where the kill fell | kill points | resumed to the uninterrupted run |")
    print("|---|---|---|---|")
    for (name, stage), count in sorted(tried.items()):
        print(f"| {name} | {stage} | {count} | yes: losses and model bytes equal, no .tmp left |")


def test_resume_without_a_state_never_overwrites_a_model(setup, tmp_path):
    from bertkit.cli import main

    out = tmp_path / "run"
    args = [str(a) for a in tiny_cli_args(setup, out, steps=3)]
    assert main(["pretrain", *args, "--resume"]) == 0  # a new folder: --resume just starts
    (out / "trainer_state.pt").unlink()  # deleted by hand: the run's record says it existed
    before = (out / "model.safetensors").read_bytes()
    settings = tiny_settings(setup, max_steps=3, warmup_steps=2, resume=True)
    with pytest.raises(FileExistsError, match=r"no trainer_state.pt \(its checkpoint of step 3"):
        run_pretraining(setup / "shards", out, settings)
    (out / "run.json").unlink()  # a model from elsewhere
    with pytest.raises(FileExistsError, match=r"no trainer_state.pt \(no run.json says"):
        run_pretraining(setup / "shards", out, settings)
    assert (out / "model.safetensors").read_bytes() == before


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["on", "graphs"])
def test_a_compiled_run_equals_the_eager_run_and_logs_its_compile_time(
    setup, tmp_path, mode, monkeypatch
):
    """`compile="on"` on the CPU: the same losses and weights as eager within float tolerance
    (dropout off: compiled code draws its own masks); the compile time on a line of its own,
    not in the training seconds. `compile="graphs"` (CUDA graphs on a GPU): the padded path,
    every batch padded to seq_len and 20 predictions, compiled in reduce-overhead mode: the
    same run too, its held-out measure as well."""
    args = dict(
        config=str(setup / "nodrop.json"), max_steps=3, batch_size=4, seq_len=32,
        learning_rate=1e-3, warmup_steps=1, log_every=1, progress=False,
        eval_data=str(setup / "shards"), eval_batches=2,
    )  # fmt: skip
    eager = run_pretraining(setup / "shards", tmp_path / "eager", **args, compile="off")
    from bertkit.core.model import BertModel

    shapes, real = [], BertModel.forward

    def forward(self, input_ids, *args, **kwargs):  # what the encoder is asked to compute
        shapes.append((tuple(input_ids.shape), kwargs["unpad"], kwargs["read_positions"]))
        return real(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(BertModel, "forward", forward)
    compiled = run_pretraining(setup / "shards", tmp_path / "compiled", **args, compile=mode)
    if mode == "graphs":  # the padded path at one shape, nothing chosen by the data
        assert shapes and all(s == ((4, 32), False, None) for s in shapes)
    else:
        assert any(unpad for _, unpad, _ in shapes)
    losses_of = [[e["loss"] for e in run if e["split"] == "train"] for run in (eager, compiled)]
    np.testing.assert_allclose(losses_of[0], losses_of[1], rtol=1e-5)
    # the held-out measure too (with graphs, its batches are of one shape as well)
    [held_out], [held_out_compiled] = ([e for e in run if e["split"] == "eval"]
                                       for run in (eager, compiled))  # fmt: skip
    assert held_out.keys() == held_out_compiled.keys()
    measures = [key for key in held_out if key.startswith(("mlm_", "nsp_"))]
    assert len(measures) >= 6
    for key in measures:
        assert held_out_compiled[key] == pytest.approx(held_out[key], rel=1e-5), key
    a = load_file(tmp_path / "eager" / "model.safetensors")
    b = load_file(tmp_path / "compiled" / "model.safetensors")
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-5, rtol=1e-4)
    log = [
        json.loads(line) for line in (tmp_path / "compiled" / "log.jsonl").read_text().splitlines()
    ]
    assert log[0]["split"] == "run" and log[0]["compiled"] is True
    assert log[0]["graphs"] is (mode == "graphs")
    [spent] = [e["seconds"] for e in log if e["split"] == "compile"]
    trained = [e["seconds"] for e in log if e["split"] == "train"][-1]
    assert spent > 0 and trained < spent  # compiling a tiny model takes longer than 3 steps
    assert not any(e["split"] == "compile" for e in eager)


def test_the_divergence_rule_spares_every_committed_pretraining_curve():
    """48 real pre-training runs (docs/results: BERT-tiny and mini on Wikipedia, every lever and
    recipe tried, transformers' too), their logged losses fed to the rule as the loop feeds it
    (weights' norms steady): none trips it; a curve that climbs as `--lr 1000` did does."""
    from pathlib import Path

    from bertkit.training.guards import Divergence

    logs = sorted(Path(__file__).parents[2].glob("docs/results/**/*.jsonl"))
    curves = []
    for path in logs:
        losses = [e["loss"] for e in map(json.loads, path.read_text().splitlines())
                  if e.get("split") == "train" and e.get("loss") is not None]  # fmt: skip
        if len(losses) >= 5:
            curves.append((path, losses))
    assert len(curves) >= 40
    for path, losses in curves:
        rule = Divergence()
        assert all(rule.check(loss, 100.0) is None for loss in losses), path
    rule = Divergence()
    verdicts = [rule.check(loss, 100.0) for loss in (0.69, 0.71, 25_296.0, 913_408.0)]
    assert verdicts[:2] == [None, None] and verdicts[2].startswith("the loss diverged")
    rule = Divergence()
    assert rule.check(0.69, 100.0) is None and "norm exploded" in rule.check(0.6, 1e5)


def test_a_diverging_finetune_stops_with_exit_2_and_writes_no_results(tiny_checkpoint, tmp_path,
                                                                       capsys):  # fmt: skip
    """`bertkit finetune ... --lr 1000` (the issue's run, on a sentence-pair task here): the
    loss climbs without reaching infinity; stopped by name with exit 2, no results."""
    from bertkit.cli import main

    from helpers import FIXTURES, grow_copies

    data = grow_copies(FIXTURES / "glue" / "QNLI", tmp_path / "data", 5)
    out = tmp_path / "run"
    argv = ["finetune", "qnli", "--model", str(tiny_checkpoint), "--data", str(data), "--out",
            str(out), "--lr", "1000", "--epochs", "3", "--batch-size", "4",
            "--max-seq-length", "64"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "the loss diverged" in err or "norm exploded" in err, err
    assert "learning rate" in err and "last checkpoint is kept" in err and "Traceback" not in err
    assert not (out / "results.json").exists()


def test_a_model_file_that_is_not_the_one_the_run_recorded_is_refused(setup, tmp_path, capsys):
    """Bytes flipped inside a tensor of a run's model.safetensors (its header intact, so it
    still loads): convert, fill-mask and --init-from refuse it by name; a --resume of the run
    writes it again from the state, and then it loads."""
    from bertkit.cli import main

    out = tmp_path / "run"
    args = [str(a) for a in tiny_cli_args(setup, out, steps=3)]
    assert main(["pretrain", *args]) == 0
    model = out / "model.safetensors"
    data = bytearray(model.read_bytes())
    data[-100:-90] = bytes(b ^ 0xFF for b in data[-100:-90])  # inside the last tensor
    model.write_bytes(bytes(data))
    for argv in (["convert", str(out), str(tmp_path / "hf")],
                 ["fill-mask", "--model", str(out), "a [MASK] b"],
                 ["pretrain", *args[:-2], "--out", str(tmp_path / "next"), "--init-from",
                  str(out)]):  # fmt: skip
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"{model}: its SHA-256 is not the one the run recorded" in err, (argv, err)
    assert not (tmp_path / "hf").exists()
    assert main(["pretrain", *args, "--resume"]) == 0  # a finished run rewrites its model
    assert main(["convert", str(out), str(tmp_path / "hf")]) == 0
