"""The training loop: schedule, resume after a kill (identical losses), and DDP equivalence with
torchrun on 2 CPU processes (identical parameters)."""

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from bertkit import BertConfig, BertForPreTraining
from bertkit.pretraining.shards import chunk_from_token_documents, write_shards
from bertkit.pretraining.train import run_pretraining
from bertkit.training.optim import parameter_groups, warmup_linear_decay
from tests.test_pretraining_data import synthetic_shards, synthetic_tokenizer


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    tokenizer = synthetic_tokenizer()
    synthetic_shards(root, tokenizer, documents=400)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    config.to_json_file(root / "config.json")
    dataclasses.replace(
        config, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    ).to_json_file(root / "nodrop.json")
    return root


def cli(*args):
    return [sys.executable, "-m", "bertkit.cli", *map(str, args)]


def losses(out):
    return {
        e["step"]: e["loss"]
        for e in map(json.loads, (out / "log.jsonl").read_text().splitlines())
        if e["split"] == "train"
    }


def test_schedule_and_parameter_groups():
    assert [round(warmup_linear_decay(s, 3, 8), 3) for s in range(8)] == [
        0.333,
        0.667,
        1.0,
        0.833,
        0.667,
        0.5,
        0.333,
        0.167,
    ]
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=50))
    decay, no_decay = parameter_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(names[id(p)].endswith(("bias", "LayerNorm.weight")) for p in no_decay["params"])
    assert all(not names[id(p)].endswith(("bias", "LayerNorm.weight")) for p in decay["params"])
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    total = sum(p.numel() for p in decay["params"] + no_decay["params"])
    assert total == model.num_parameters  # the tied decoder counted once


def learnable_shards(root, tokenizer):
    """Sentences that are runs of consecutive words (w17 w18 w19 ...): a masked word follows
    from its neighbours, which even a tiny model learns in a few dozen steps."""
    rng = np.random.default_rng(0)
    words = np.asarray([tokenizer.vocab[f"w{i}"] for i in range(60)])

    def sentence():
        start = int(rng.integers(0, 40))
        return words[start : start + int(rng.integers(6, 20))]

    docs = [[sentence() for _ in range(int(rng.integers(3, 12)))] for _ in range(300)]
    write_shards([chunk_from_token_documents(docs)], tokenizer, root / "learnable")
    return root / "learnable"


def test_pretraining_learns_and_writes_a_loadable_checkpoint(setup, tmp_path):
    data = learnable_shards(tmp_path, synthetic_tokenizer())
    entries = run_pretraining(
        data,
        tmp_path / "out",
        config=str(setup / "config.json"),
        max_steps=60,
        batch_size=16,
        seq_len=64,
        eval_data=data,
        eval_batches=4,
        learning_rate=5e-3,
        warmup_steps=4,
        log_every=5,
        eval_every=30,
        save_every=20,
        progress=False,
    )
    train = [e for e in entries if e["split"] == "train"]
    evals = [e for e in entries if e["split"] == "eval"]
    assert train[-1]["mlm_loss"] < train[0]["mlm_loss"] - 1.0
    assert evals[-1]["mlm_loss"] < evals[0]["mlm_loss"]
    assert {"step", "mlm_loss", "mlm_accuracy", "nsp_accuracy"} <= set(evals[-1])
    curves = tmp_path / "out" / "curves.png"
    assert curves.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    redrawn = tmp_path / "again.png"
    assert (
        subprocess.run(cli("viz", tmp_path / "out" / "log.jsonl", "--out", redrawn)).returncode == 0
    )
    assert redrawn.stat().st_size > 10_000
    model = BertForPreTraining.from_pretrained(tmp_path / "out")
    assert model.config.hidden_size == 32
    transformers = pytest.importorskip("transformers")
    hf = transformers.BertForPreTraining.from_pretrained(tmp_path / "out").eval()
    ids = torch.randint(10, 400, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(
            hf(ids).prediction_logits, model(ids).mlm_logits, atol=1e-5, rtol=0
        )
    with pytest.raises(FileExistsError, match="pass --resume"):
        run_pretraining(
            setup / "shards",
            tmp_path / "out",
            config=str(setup / "config.json"),
            max_steps=60,
            warmup_steps=4,
            batch_size=16,
            seq_len=64,
            progress=False,
        )
    with pytest.raises(ValueError, match="does not fit this model"):
        run_pretraining(
            setup / "shards",
            tmp_path / "out",
            config="tiny",
            max_steps=60,
            warmup_steps=4,
            learning_rate=5e-3,
            batch_size=16,
            seq_len=64,
            resume=True,
            progress=False,
        )


@pytest.mark.parametrize("objective", ["mlm", "ltr"])
def test_ablation_objectives_train(setup, tmp_path, objective):
    entries = run_pretraining(
        setup / "shards",
        tmp_path / objective,
        config=str(setup / "config.json"),
        max_steps=6,
        batch_size=8,
        seq_len=64,
        objective=objective,
        warmup_steps=1,
        log_every=3,
        learning_rate=1e-3,
        progress=False,
    )
    assert all("nsp_loss" not in e for e in entries)
    config = json.loads((tmp_path / objective / "config.json").read_text())
    assert config["architectures"] == ["BertForMaskedLM"] and config["is_decoder"] == (
        objective == "ltr"
    )


def test_killed_run_resumes_with_identical_losses(setup, tmp_path):
    common = [
        "--data",
        setup / "shards",
        "--config",
        setup / "config.json",
        "--max-steps",
        60,
        "--batch-size",
        8,
        "--seq-len",
        64,
        "--warmup-steps",
        5,
        "--log-every",
        1,
        "--save-every",
        10,
        "--lr",
        1e-3,
        "--device",
        "cpu",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        cli("pretrain", "--out", tmp_path / "whole", *common),
        check=True,
        env=env,
        capture_output=True,
    )
    expected = losses(tmp_path / "whole")
    assert len(expected) == 60
    killed = subprocess.Popen(
        cli("pretrain", "--out", tmp_path / "killed", *common),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    log = tmp_path / "killed" / "log.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline:  # kill it mid-run, after a checkpoint and some steps beyond it
        if log.exists() and len(log.read_text().splitlines()) >= 25:
            break
        time.sleep(0.02)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    before = losses(tmp_path / "killed")
    assert 25 <= max(before) < 60, "the run was not killed mid-run"
    subprocess.run(
        cli("pretrain", "--out", tmp_path / "killed", *common, "--resume"),
        check=True,
        env=env,
        capture_output=True,
    )
    after = losses(tmp_path / "killed")
    assert sorted(after) == list(range(1, 61))
    for step in range(1, 61):
        assert abs(after[step] - expected[step]) <= 1e-6, (step, after[step], expected[step])
    final_a = load_file(tmp_path / "whole" / "model.safetensors")
    final_b = load_file(tmp_path / "killed" / "model.safetensors")
    assert all(torch.equal(final_a[k], final_b[k]) for k in final_a)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_ddp_equals_one_process_with_the_same_global_batch(setup, tmp_path):
    common = [
        "--data",
        setup / "shards",
        "--config",
        setup / "nodrop.json",
        "--max-steps",
        8,
        "--batch-size",
        8,
        "--seq-len",
        64,
        "--warmup-steps",
        2,
        "--log-every",
        1,
        "--lr",
        1e-3,
        "--device",
        "cpu",
    ]
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
    subprocess.run(
        [
            *torchrun,
            "-m",
            "bertkit.cli",
            "pretrain",
            "--out",
            str(tmp_path / "ddp"),
            *map(str, common),
        ],
        check=True,
        env=env,
        capture_output=True,
    )
    subprocess.run(
        cli("pretrain", "--out", tmp_path / "one", *common),
        check=True,
        env=env,
        capture_output=True,
    )
    a = load_file(tmp_path / "ddp" / "model.safetensors")
    b = load_file(tmp_path / "one" / "model.safetensors")
    delta = max((a[k] - b[k]).abs().max().item() for k in a)
    print(f"\nDDP (2 ranks) vs 1 process after 8 steps: max |parameter difference| = {delta:.1e}")
    assert delta <= 1e-5
    la, lb = losses(tmp_path / "ddp"), losses(tmp_path / "one")
    assert all(abs(la[s] - lb[s]) <= 1e-5 for s in la)


def test_two_phases_continue_with_a_fresh_schedule_and_resume(setup, tmp_path):
    args = [
        "--data",
        setup / "shards",
        "--config",
        setup / "config.json",
        "--batch-size",
        8,
        "--warmup-steps",
        2,
        "--log-every",
        1,
        "--device",
        "cpu",
        "--out",
        tmp_path / "run",
    ]
    from bertkit.cli import main

    assert main(["pretrain", *map(str, args), "--phases", "32:6,64:4"]) == 0
    first = tmp_path / "run" / "phase1-seq32"
    assert (first / "model.safetensors").exists() and (
        tmp_path / "run" / "model.safetensors"
    ).exists()
    second = [
        json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()
    ]
    assert [e["step"] for e in second] == [1, 2, 3, 4]  # a fresh schedule: steps and warmup restart
    assert second[0]["lr"] < second[1]["lr"]
    phase1 = load_file(first / "model.safetensors")
    # resuming a finished run re-runs nothing
    before = (tmp_path / "run" / "log.jsonl").read_text()
    assert main(["pretrain", *map(str, args), "--phases", "32:6,64:4", "--resume"]) == 0
    assert (tmp_path / "run" / "log.jsonl").read_text() == before
    assert all(torch.equal(phase1[k], v) for k, v in load_file(first / "model.safetensors").items())
    with pytest.raises(ValueError, match="is not SEQ_LEN:STEPS"):
        from bertkit.pretraining.train import parse_phases

        parse_phases("128-100")


def test_log_goes_to_tensorboard_when_installed(tmp_path, monkeypatch):
    """TensorBoard is optional: with it, every logged number is also a scalar; resuming purges
    the steps after the checkpoint, as log.jsonl does."""
    import types

    from bertkit.training.loop import _Log

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
    log = _Log(tmp_path / "log.jsonl", enabled=True, keep_until=0)
    log.write({"step": 5, "split": "train", "loss": 2.5, "lr": 1e-4})
    log.write({"step": 5, "split": "eval", "mlm_accuracy": 0.25})
    assert calls == [
        ("open", str(tmp_path / "tensorboard"), 1),
        ("train/loss", 2.5, 5),
        ("train/lr", 1e-4, 5),
        ("eval/mlm_accuracy", 0.25, 5),
    ]
    calls.clear()
    _Log(tmp_path / "log.jsonl", enabled=True, keep_until=5)
    assert calls == [("open", str(tmp_path / "tensorboard"), 6)]
    assert len((tmp_path / "log.jsonl").read_text().splitlines()) == 2


def test_budget_schedule_follows_the_clock_and_keeps_it_in_its_state():
    from bertkit.training.optim import BudgetSchedule

    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=2.0)
    schedule = BudgetSchedule(optimizer, budget=100.0, warmup=0.2)
    expected = {0: 2e-3, 10: 1.0, 20: 2.0, 60: 1.0, 95: 0.125}
    for spent, lr in expected.items():
        schedule.set_spent(spent)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(lr)
        assert schedule.get_last_lr() == [pytest.approx(lr)]
    assert not schedule.done
    schedule.set_spent(100.0)
    assert schedule.done
    again = BudgetSchedule(torch.optim.SGD([parameter], lr=2.0), budget=100.0, warmup=0.2)
    again.load_state_dict(schedule.state_dict())
    assert again.spent == 100.0 and again.done
    with pytest.raises(ValueError, match="warm-up fraction"):
        BudgetSchedule(optimizer, budget=10.0, warmup=1.0)


def test_budget_run_stops_on_time_charges_no_evaluation_and_resumes_on_its_clock(setup, tmp_path):
    kwargs = dict(
        config=str(setup / "config.json"),
        budget_seconds=3.0,
        batch_size=8,
        seq_len=64,
        eval_data=setup / "shards",
        eval_batches=2,
        eval_every=5,
        learning_rate=1e-3,
        warmup_fraction=0.2,
        log_every=1,
        progress=False,
    )
    entries = run_pretraining(setup / "shards", tmp_path / "run", **kwargs)
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
    assert run_pretraining(setup / "shards", tmp_path / "run", resume=True, **kwargs) == []
    with pytest.raises(ValueError, match="budget_seconds = 3.0, not 6.0"):
        run_pretraining(
            setup / "shards", tmp_path / "run", resume=True, **{**kwargs, "budget_seconds": 6.0}
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


def test_held_out_measure_masks_every_chosen_piece(setup, tmp_path):
    """`mlm_accuracy` of the evaluation replaces every chosen piece by [MASK]; the 80/10/10 one
    leaves 10% of them visible, so a model that copies its input scores ~10% there and 0 here."""
    from bertkit.pretraining.dataset import MaskingConfig, PretrainingData
    from bertkit.pretraining.shards import Shards
    from bertkit.pretraining.train import PretrainingObjective, _held_out_evaluation
    from bertkit.tokenizer import BertTokenizer
    from bertkit.training import distributed

    tokenizer = BertTokenizer.from_pretrained(setup / "shards")
    vocab = tokenizer.vocab_size

    class Copier(torch.nn.Module):  # predicts each position's own input token
        def forward(self, input_ids, masked_positions, **_):
            seen = input_ids.gather(1, masked_positions)
            return type("Out", (), {"mlm_logits": torch.nn.functional.one_hot(seen, vocab) * 10.0})

    masking = MaskingConfig()
    evaluate = _held_out_evaluation(
        Shards(setup / "shards"),
        tokenizer,
        PretrainingObjective("mlm"),
        batch_size=16,
        seq_len=64,
        objective="mlm",
        masking=masking,
        seed=1,
        batches=8,
        dist=distributed.Distributed(),
    )
    result = evaluate(Copier())
    assert result["mlm_accuracy"] == 0.0
    assert 0.06 < result["mlm_accuracy_801010"] < 0.14
    stream = PretrainingData(
        Shards(setup / "shards"),
        tokenizer,
        batch_size=16,
        max_seq_length=64,
        objective="mlm",
        masking=dataclasses.replace(masking, mask_token_prob=1.0, random_token_prob=0.0),
    )
    batch = stream.next_batch()
    picked = batch["input_ids"].gather(1, batch["masked_positions"])[batch["labels"] != -100]
    assert set(picked.tolist()) == {tokenizer.vocab["[MASK]"]}


def test_phases_share_a_budget(setup, tmp_path):
    from bertkit.cli import main

    args = ["--data", setup / "shards", "--config", setup / "config.json", "--batch-size", 8]
    args += ["--log-every", 1, "--device", "cpu", "--out", tmp_path / "run", "--budget", "4s"]
    assert main(["pretrain", *map(str, args), "--phases", "32:0.5,64:0.5"]) == 0
    for directory in (tmp_path / "run" / "phase1-seq32", tmp_path / "run"):
        state = torch.load(directory / "trainer_state.pt", weights_only=True)
        assert 2.0 <= state["train_seconds"] < 3.5  # half of the budget each
    assert main(["pretrain", *map(str, args), "--phases", "32:0.5,64:0.6"]) == 2


def _short_run(setup, out, **settings) -> list[float]:
    """The training losses of 3 steps of the tiny dropout-free model (settings override)."""
    settings = {
        "config": str(setup / "nodrop.json"),
        "max_steps": 3,
        "batch_size": 4,
        "seq_len": 32,
        "warmup_steps": 1,
        "progress": False,
        **settings,
    }
    entries = run_pretraining(setup / "shards", out, **settings)
    return [e["loss"] for e in entries if e["split"] == "train"]


def test_mimetic_attention_starts_near_identity_and_trains(setup, tmp_path):
    from bertkit.pretraining.init_schemes import mimetic_attention_

    model = BertForPreTraining(BertConfig.from_json_file(setup / "nodrop.json")).requires_grad_(
        False
    )
    layer = model.bert.encoder.layer[0]
    mimetic_attention_(layer, qk=(0.0, 1.0), vo=(0.0, 0.5))
    size, attention = layer.head_size, layer.attention
    for head in range(layer.num_heads):  # rank-`size` part of I: a projection, PSD
        rows = slice(head * size, (head + 1) * size)
        product = attention.self.query.weight[rows].T @ attention.self.key.weight[rows]
        assert torch.allclose(product, product.T, atol=1e-5)
        assert torch.allclose(product @ product, product, atol=1e-5)
        assert float(product.trace()) == pytest.approx(size, rel=1e-4)
    value_output = attention.output.dense.weight @ attention.self.value.weight
    assert torch.allclose(value_output, -0.5 * torch.eye(value_output.shape[0]), atol=1e-5)
    assert np.isfinite(_short_run(setup, tmp_path / "run", attention_init="mimetic-qk")).all()


def test_local_attention_starts_on_the_neighbours(setup, tmp_path):
    from bertkit.pretraining.init_schemes import local_attention_

    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_json_file(setup / "nodrop.json")).eval()
    local_attention_(model)
    ids = torch.randint(10, 400, (4, 40))
    with torch.no_grad():
        maps = model.bert(ids, output_attentions=True).attentions[0][:, :, 1:-1]  # (B, A, S-2, S)
    rows = torch.arange(1, 39)
    left = maps[:, 0, torch.arange(38), rows - 1].mean()
    right = maps[:, 1, torch.arange(38), rows + 1].mean()
    assert left > 0.5 and right > 0.5  # uniform would be 1/40
    embeddings = model.bert.embeddings
    assert embeddings.word_embeddings.weight[:, -16:].abs().max() == 0  # positions own those
    assert embeddings.position_embeddings.weight[:, :-16].abs().max() == 0
    assert np.isfinite(_short_run(setup, tmp_path / "run", attention_init="local")).all()


def _tiny_cli_args(setup, out, steps=40):
    return [
        "--data", setup / "shards", "--config", setup / "config.json", "--max-steps", steps,
        "--batch-size", 8, "--seq-len", 64, "--warmup-steps", 2, "--log-every", 1,
        "--save-every", 1000, "--lr", 1e-3, "--device", "cpu", "--out", out,
    ]  # fmt: skip


def test_sigterm_saves_a_resumable_checkpoint_and_exits_with_one_line(setup, tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.Popen(
        cli("pretrain", *_tiny_cli_args(setup, out, steps=400)),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    log = out / "log.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (log.exists() and len(log.read_text().splitlines()) >= 5):
        time.sleep(0.02)
    # a second writer into the live folder is refused, and the first run goes on
    second = subprocess.run(
        cli("pretrain", *_tiny_cli_args(setup, out, steps=400), "--resume"),
        env=env,
        capture_output=True,
        text=True,
    )
    assert second.returncode == 2 and "another bertkit process (pid" in second.stderr
    assert run.poll() is None
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 128 + signal.SIGTERM, err
    lines = [line for line in err.splitlines() if line.startswith("bertkit pretrain:")]
    assert len(lines) == 1 and "stopped by SIGTERM at step" in lines[0] and "--resume" in lines[0]
    assert "Traceback" not in err
    step = int(lines[0].split("at step ")[1].split(";")[0])
    assert torch.load(out / "trainer_state.pt", weights_only=True)["step"] == step  # nothing lost
    assert max(losses(out)) == step
    (out / ".trainer_state.pt.leftover.tmp").write_bytes(b"x" * 100)  # what a SIGKILL can leave
    args = _tiny_cli_args(setup, out, steps=400)
    args[args.index("--max-steps") + 1] = 400
    resumed = subprocess.run(
        cli("pretrain", *args, "--resume"), env=env, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(losses(out)) == list(range(1, 401))
    assert not list(out.glob(".*.tmp"))


def test_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(setup, tmp_path):
    from bertkit.cli import main
    from bertkit.errors import TrainingDiverged
    from bertkit.pretraining import train as train_module

    out = tmp_path / "run"
    args = [str(a) for a in _tiny_cli_args(setup, out, steps=6)]
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
            train_module.run_phases(
                setup / "shards", out, [(64, 6)], config=str(setup / "config.json"),
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
    args = [str(a) for a in _tiny_cli_args(setup, bad, steps=5)]
    args[args.index("--lr") + 1] = "1e30"
    assert main(["pretrain", *args]) == 2
    assert not (bad / "model.safetensors").exists()


def test_a_finished_run_resumed_repairs_its_final_files(setup, tmp_path):
    from bertkit.cli import main

    out = tmp_path / "run"
    args = [str(a) for a in _tiny_cli_args(setup, out, steps=6)]
    args[args.index("--save-every") + 1] = "3"
    assert main(["pretrain", *args]) == 0
    final = load_file(out / "model.safetensors")
    # a kill between the final model and the final state (older orders wrote the state first):
    # the model file is stale and the curves were never drawn
    stale = {k: torch.zeros_like(v) for k, v in final.items()}
    from safetensors.torch import save_file

    save_file(stale, out / "model.safetensors", metadata={"format": "pt"})
    (out / "curves.png").unlink()
    assert main(["pretrain", *args, "--resume"]) == 0
    repaired = load_file(out / "model.safetensors")
    assert all(torch.equal(repaired[k], final[k]) for k in final)
    assert (out / "curves.png").exists()
    assert sorted(losses(out)) == list(range(1, 7))  # nothing trained again


def test_a_corrupt_or_truncated_state_is_refused_by_name(setup, tmp_path):
    from bertkit.cli import main

    out = tmp_path / "run"
    args = [str(a) for a in _tiny_cli_args(setup, out, steps=4)]
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


def test_bertadam_is_googles_update_without_bias_correction():
    """Against a reference written from Google's optimization.py (AdamWeightDecayOptimizer):
    m, v without bias correction; update = m / (sqrt(v) + eps) + wd * w; w -= lr * update; no
    weight decay on LayerNorm and biases (the groups of `parameter_groups`)."""
    from bertkit.training.optim import build_optimizer

    torch.manual_seed(0)
    model = torch.nn.ModuleDict(
        {"dense": torch.nn.Linear(5, 4), "LayerNorm": torch.nn.LayerNorm(4)}
    )
    start = {n: p.detach().double().numpy().copy() for n, p in model.named_parameters()}
    optimizer = build_optimizer(model, lr=0.01, weight_decay=0.1, kind="bertadam")
    grads = [{n: torch.randn_like(p) for n, p in model.named_parameters()} for _ in range(4)]
    for step in grads:
        for n, p in model.named_parameters():
            p.grad = step[n].clone()
        optimizer.step()
    beta1, beta2, eps, lr = 0.9, 0.999, 1e-6, 0.01
    for name, weights in start.items():
        m = np.zeros_like(weights)
        v = np.zeros_like(weights)
        decay = 0.0 if name.endswith("bias") or name.startswith("LayerNorm") else 0.1
        for step in grads:
            g = step[name].double().numpy()
            m = beta1 * m + (1.0 - beta1) * g
            v = beta2 * v + (1.0 - beta2) * g * g
            weights = weights - lr * (m / (np.sqrt(v) + eps) + decay * weights)
        got = dict(model.named_parameters())[name].detach().double().numpy()
        np.testing.assert_allclose(got, weights, rtol=1e-5, atol=1e-6)
    # the first step moves a weight ~3x lr (1 - b1) / sqrt(1 - b2), AdamW's about lr
    first = torch.nn.Parameter(torch.zeros(1))
    first.grad = torch.ones(1)
    build_optimizer(
        torch.nn.ParameterList([first]), lr=1.0, weight_decay=0.0, kind="bertadam"
    ).step()
    assert float(first.detach()) == pytest.approx(-0.1 / (0.001**0.5 + 1e-6), rel=1e-5)
    with pytest.raises(ValueError, match="adamw or bertadam"):
        build_optimizer(model, kind="sgd")


def test_resume_names_log_lines_it_cannot_read(tmp_path, caplog):
    from bertkit.training.loop import _Log

    log = tmp_path / "log.jsonl"
    log.write_bytes(
        b'{"step": 1, "split": "train"}\n\xff\xfe garbled\n{"step": 2, "split": "train"}\n'
        b'{"step": 3, "spl'  # the last line, cut short by a kill: dropped quietly
    )
    with caplog.at_level("WARNING", logger="bertkit"):
        writer = _Log(log, True, keep_until=3)
        writer.handle.close()
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [1, 2]
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
    weights = load_file(tmp_path / "bf16" / "model.safetensors")
    assert all(v.dtype == torch.float32 for v in weights.values())  # master weights stay fp32


def test_pretrain_prints_its_evaluations_and_where_it_wrote(setup, tmp_path, capsys):
    from bertkit.cli import main

    out = tmp_path / "run"
    args = [str(a) for a in _tiny_cli_args(setup, out, steps=4)]
    args += ["--eval-data", str(setup / "shards"), "--eval-batches", "1", "--eval-every", "2"]
    assert main(["pretrain", *args]) == 0
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert printed.startswith(f"wrote {out} (") and "held out: " in printed
    assert " mlm_accuracy " in printed and " nsp_accuracy " in printed


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


def test_ctrl_c_saves_and_says_one_line_instead_of_a_traceback(setup, tmp_path):
    out = tmp_path / "run"
    run = subprocess.Popen(
        cli("pretrain", *_tiny_cli_args(setup, out, steps=400)),
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    log = out / "log.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (log.exists() and len(log.read_text().splitlines()) >= 3):
        time.sleep(0.02)
    run.send_signal(signal.SIGINT)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 128 + signal.SIGINT, err
    assert "stopped by SIGINT at step" in err and "KeyboardInterrupt" not in err
    step = torch.load(out / "trainer_state.pt", weights_only=True)["step"]
    assert step == max(losses(out))
