"""Pre-training runs (bertkit.pretraining.train): learning, ablations, phases, budget, init schemes."""

import dataclasses
import json
import subprocess

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from bertkit import BertForPreTraining
from bertkit.pretraining.train import run_pretraining

from helpers import cli_command, learnable_shards, synthetic_tokenizer, tiny_cli_args, tiny_settings


@pytest.mark.slow
def test_pretraining_learns_and_writes_a_loadable_checkpoint(setup, tmp_path):
    data = learnable_shards(tmp_path, synthetic_tokenizer())
    settings = tiny_settings(setup, batch_size=16, learning_rate=5e-3, log_every=5)
    entries = run_pretraining(
        data,
        tmp_path / "out",
        settings,
        max_steps=60,
        eval_data=data,
        eval_batches=4,
        warmup_steps=4,
        eval_every=30,
        save_every=20,
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
        subprocess.run(
            cli_command("viz", tmp_path / "out" / "log.jsonl", "--out", redrawn)
        ).returncode
        == 0
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
    with pytest.raises(ValueError, match=r"config.hidden_size = 32, not 128.*data.num_tokens"):
        run_pretraining(
            setup / "shards",
            tmp_path / "out",
            settings,  # the same run, but another model size
            config="tiny",
            max_steps=60,
            warmup_steps=4,
            resume=True,
        )


@pytest.mark.parametrize("objective", ["mlm", "ltr"])
def test_ablation_objectives_train(setup, tmp_path, objective):
    entries = run_pretraining(
        setup / "shards",
        tmp_path / objective,
        tiny_settings(setup, log_every=3),
        max_steps=6,
        objective=objective,
        warmup_steps=1,
    )
    assert all("nsp_loss" not in e for e in entries)
    config = json.loads((tmp_path / objective / "config.json").read_text())
    assert config["architectures"] == ["BertForMaskedLM"] and config["is_decoder"] == (
        objective == "ltr"
    )
    # what the objective trained: left to right, a token's prediction never sees the tokens
    # after it; masked LM, every token sees both sides (a changed last token moves the first)
    from bertkit.core.heads import BertForMaskedLM

    model = BertForMaskedLM.from_pretrained(tmp_path / objective).eval()
    ids = torch.randint(
        5, model.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0)
    )
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1 - 5) % (model.config.vocab_size - 5) + 5
    with torch.no_grad():
        before, after = model(ids).logits, model(changed).logits
    earlier_moved = (before[0, :-1] - after[0, :-1]).abs().max().item()
    assert (before[0, -1] - after[0, -1]).abs().max().item() > 1e-4  # the changed token's own
    if objective == "ltr":
        assert earlier_moved == 0.0, earlier_moved
    else:
        assert earlier_moved > 1e-4, earlier_moved
    losses = [
        e["mlm_loss"] if "mlm_loss" in e else e["loss"]
        for e in entries
        if e.get("split", "train") == "train"
    ]
    assert len(losses) >= 2 and all(np.isfinite(losses)), entries


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
    second = [  # the training entries (the "run" entry says the session's precision)
        e
        for e in map(json.loads, (tmp_path / "run" / "log.jsonl").read_text().splitlines())
        if e["split"] == "train"
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


def test_held_out_measure_masks_every_chosen_piece(setup, tmp_path):
    """`mlm_accuracy` of the evaluation replaces every chosen piece by [MASK]; the 80/10/10 one
    leaves 10% of them visible, so a model that copies its input scores ~10% there and 0 here."""
    from bertkit.core.tokenizer import BertTokenizer
    from bertkit.pretraining.dataset import MaskingConfig, PretrainingData
    from bertkit.pretraining.shards import Shards
    from bertkit.pretraining.train import PretrainingObjective, _held_out_evaluation
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
    result = evaluate(Copier(), 0)
    assert result["mlm_accuracy"] == 0.0
    assert 0.06 < result["mlm_accuracy_801010"] < 0.14
    stream = PretrainingData(
        Shards(setup / "shards"),
        tokenizer,
        batch_size=16,
        seq_len=64,
        objective="mlm",
        masking=dataclasses.replace(masking, mask_token_prob=1.0, random_token_prob=0.0),
    )
    batch = stream.next_batch()
    picked = batch["input_ids"].gather(1, batch["masked_positions"])[batch["labels"] != -100]
    assert set(picked.tolist()) == {tokenizer.vocab["[MASK]"]}


@pytest.mark.slow
def test_phases_share_a_budget(setup, tmp_path):
    from bertkit.cli import main

    args = ["--data", setup / "shards", "--config", setup / "config.json", "--batch-size", 8]
    args += ["--log-every", 1, "--device", "cpu", "--out", tmp_path / "run", "--budget", "4s"]
    assert main(["pretrain", *map(str, args), "--phases", "32:0.5,64:0.5"]) == 0
    for directory in (tmp_path / "run" / "phase1-seq32", tmp_path / "run"):
        state = torch.load(directory / "trainer_state.pt", weights_only=True)
        # half of the budget each: a phase stops after the step that reaches its share, so it
        # overshoots by less than its longest step (seconds on a loaded machine, not a constant)
        logged = [json.loads(line) for line in (directory / "log.jsonl").read_text().splitlines()]
        clock = [0.0] + [e["seconds"] for e in logged if e["split"] == "train"]
        longest = max(b - a for a, b in zip(clock, clock[1:], strict=False))
        assert 2.0 <= state["train_seconds"] < 2.0 + longest + 0.25
    assert main(["pretrain", *map(str, args), "--phases", "32:0.5,64:0.6"]) == 2


def test_pretrain_prints_its_evaluations_and_where_it_wrote(setup, tmp_path, capsys):
    from bertkit.cli import main

    out = tmp_path / "run"
    args = [str(a) for a in tiny_cli_args(setup, out, steps=4)]
    args += ["--eval-data", str(setup / "shards"), "--eval-batches", "1", "--eval-every", "2"]
    assert main(["pretrain", *args]) == 0
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert printed.startswith(f"wrote {out} (") and "held out: " in printed
    assert " mlm_accuracy " in printed and " nsp_accuracy " in printed


def test_activation_checkpointing_is_the_same_run(setup, tmp_path, monkeypatch):
    """`--activation-checkpointing` recomputes each layer in the backward pass: with dropout on,
    the replay draws the same masks (the RNG state is restored), so the losses and the weights
    are the run's without it."""
    import bertkit.core.model

    replayed = []
    real = bertkit.core.model.activation_checkpoint

    def counted(*args, **kwargs):
        replayed.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(bertkit.core.model, "activation_checkpoint", counted)
    runs = {}
    for on in (False, True):
        out = tmp_path / f"ckpt_{on}"
        settings = tiny_settings(setup, log_every=1, dropout=0.1)
        entries = run_pretraining(setup / "shards", out, settings, max_steps=4, warmup_steps=1,
                                  activation_checkpointing=on)  # fmt: skip
        runs[on] = ([e["loss"] for e in entries if e["split"] == "train"],
                    load_file(out / "model.safetensors"))  # fmt: skip
        assert bool(replayed) == on  # checkpointed: each layer of each step, and only then
    assert runs[True][0] == pytest.approx(runs[False][0], abs=1e-6)
    for name, weight in runs[False][1].items():
        torch.testing.assert_close(runs[True][1][name], weight, atol=1e-6, rtol=1e-5)


def test_the_loop_works_out_the_token_layouts_on_the_host(setup, tmp_path, monkeypatch):
    """Every training forward gets its layouts from the loop (`_Head.host_layouts`, on the
    batch before it moves to the device): on a GPU the step then never waits to count real
    tokens. The run is the one the forward's own layouts give (tests/test_heads.py)."""
    from bertkit.core.model import BertModel

    seen = []
    real = BertModel.forward

    def forward(self, *args, **kwargs):
        seen.append((self.training, kwargs.get("layouts") is not None))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(BertModel, "forward", forward)
    run_pretraining(setup / "shards", tmp_path / "run", tiny_settings(setup), max_steps=3,
                    warmup_steps=1, eval_data=setup / "shards", eval_batches=1)  # fmt: skip
    trained = [given for training, given in seen if training]
    assert len(trained) == 3 and all(trained)
    assert any(not training for training, _ in seen)  # evaluation: the forward's own


def test_compile_auto_takes_cuda_graphs_for_small_models_alone_on_a_gpu():
    """`--compile auto` on a GPU replays CUDA graphs for a model no wider than BERT-small (2.36M
    against 1.44M tokens/s in the loop on an H200), trained by one process without activation
    checkpointing; the loop resolves every other choice (on with CUDA, off on CPUs)."""
    from bertkit.core.config import BertConfig
    from bertkit.pretraining.train import PretrainConfig, resolve_compile
    from bertkit.training.distributed import Distributed

    gpu, cpu = Distributed(device=torch.device("cuda")), Distributed()
    small, base = BertConfig.from_preset("small"), BertConfig.from_preset("base")
    auto = PretrainConfig()
    assert auto.compile == "auto"
    assert resolve_compile(auto, small, gpu) == "graphs"
    assert resolve_compile(auto, BertConfig.from_preset("tiny"), gpu) == "graphs"
    assert resolve_compile(auto, base, gpu) == "auto"  # (the loop: compiled, unpadded)
    assert resolve_compile(auto, small, cpu) == "auto"  # (the loop: off)
    assert resolve_compile(auto, small, dataclasses.replace(gpu, world_size=2)) == "auto"
    checkpointed = dataclasses.replace(auto, activation_checkpointing=True)
    assert resolve_compile(checkpointed, small, gpu) == "auto"
    for chosen in ("on", "off"):
        assert resolve_compile(dataclasses.replace(auto, compile=chosen), small, gpu) == chosen


NEWS = [
    "The central bank raised interest rates on Tuesday. Markets fell sharply after the news.",
    "The home team won the match in the final minute. Fans cheered in the streets all night.",
    "A new phone was released this week. It has a larger screen and a faster chip.",
    "Heavy rain flooded the city centre. Several roads were closed until the evening.",
    "The government announced a new budget. Taxes on fuel will rise next year.",
    "Scientists found water on a distant planet. The discovery was published in a journal.",
]


def test_continued_pretraining_of_a_released_bert_in_one_command(mlm_dir, setup, tmp_path,
                                                                 capsys):  # fmt: skip
    """`bertkit pretrain --init-from CHECKPOINT --data TEXT/` continues a checkpoint on raw
    text: its own config and vocabulary (no --config, no vocab or prepare steps), its MLM head
    kept, the continue recipe's schedule; shards of another vocabulary are refused by name."""
    from safetensors.torch import load_file

    from bertkit import BertTokenizer
    from bertkit.cli import main
    from bertkit.pretraining.shards import Shards

    corpus = tmp_path / "news"
    corpus.mkdir()
    for n in range(4):  # plain text: blank-line-separated documents
        (corpus / f"part{n}.txt").write_text("\n\n".join(NEWS[n:] + NEWS[:n]) + "\n")
    out = tmp_path / "adapted"
    argv = ["pretrain", "--init-from", str(mlm_dir), "--data", str(corpus), "--out", str(out),
            "--max-steps", "2", "--batch-size", "4", "--seq-len", "32", "--lr", "1e-9",
            "--device", "cpu"]  # fmt: skip
    assert main(argv) == 0
    said = capsys.readouterr().err
    assert f"tokenising {corpus} with the vocabulary of {mlm_dir}" in said
    shards = Shards(tmp_path / "adapted-shards")
    assert shards.meta["vocab_hash"] == BertTokenizer.from_pretrained(mlm_dir).vocab_hash
    assert json.loads((out / "config.json").read_text())["hidden_size"] == json.loads(
        (mlm_dir / "config.json").read_text())["hidden_size"]  # fmt: skip
    before, after = load_file(mlm_dir / "model.safetensors"), load_file(out / "model.safetensors")
    head = "cls.predictions.transform.dense.weight"  # kept, not drawn afresh (lr 1e-9)
    torch.testing.assert_close(after[head], before[head], atol=1e-6, rtol=0)
    record = json.loads((out / "run.json").read_text())["identity"]
    assert record["objective"] == "mlm" and record["learning_rate"] == 1e-9
    assert record["warmup_fraction"] == 0.06  # the continue recipe's
    # again with --resume: the shards made before are found, not made again
    assert main([*argv, "--resume"]) == 0
    assert "tokenising" not in capsys.readouterr().err
    # shards of another vocabulary: refused by name before any training
    refused = tmp_path / "refused"
    assert main(["pretrain", "--init-from", str(mlm_dir), "--data", str(setup / "shards"),
                 "--out", str(refused), "--max-steps", "2"]) != 0  # fmt: skip
    assert f"{setup / 'shards'} was prepared with another vocabulary" in capsys.readouterr().err
    assert not (refused / "log.jsonl").exists()
    # raw text without a checkpoint to read it with
    assert main(["pretrain", "--data", str(corpus), "--out", str(tmp_path / "x"),
                 "--max-steps", "2"]) != 0  # fmt: skip
    assert "not a shards folder" in capsys.readouterr().err
