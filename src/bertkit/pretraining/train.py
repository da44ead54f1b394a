"""`bertkit pretrain`: the paper's pre-training on prepared shards, through the one training loop.

Objectives (the paper's Table 5 ablations): "mlm+nsp" (BERT), "mlm" (No NSP: one contiguous
segment, masked LM only), "ltr" (left-to-right LM: causal attention, next-token loss, no NSP).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from bertkit.config import PRESETS, BertConfig
from bertkit.heads import IGNORE_INDEX, BertForMaskedLM, BertForPreTraining
from bertkit.pretraining.dataset import MaskingConfig, PretrainingData
from bertkit.pretraining.shards import Shards
from bertkit.tokenizer import BertTokenizer
from bertkit.training import distributed
from bertkit.training.loop import LOG_FILE, STATE_FILE, Trainer, TrainingConfig

logger = logging.getLogger("bertkit")


class PretrainingObjective:
    """Masked-LM (or next-token) loss over the step's masked tokens, plus NSP over its pairs."""

    def __init__(self, objective: str) -> None:
        self.nsp = objective == "mlm+nsp"

    def counts(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        masked = (batch["labels"] != IGNORE_INDEX).sum()
        pairs = len(batch["input_ids"]) if self.nsp else 0
        return torch.tensor([float(masked), float(pairs)], dtype=torch.float64)

    def loss(self, model, batch, totals):
        out = model(
            input_ids=batch["input_ids"],
            token_type_ids=batch["token_type_ids"],
            attention_mask=batch["attention_mask"],
            masked_positions=batch["masked_positions"],
        )
        logits = (out.mlm_logits if hasattr(out, "mlm_logits") else out.logits).float()
        labels = batch["labels"]
        valid = labels != IGNORE_INDEX
        mlm_sum = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            labels.reshape(-1),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )
        correct = ((logits.argmax(-1) == labels) & valid).sum()
        loss = mlm_sum / totals[0].clamp(min=1)
        stats = [mlm_sum.detach(), valid.sum(), correct]
        if self.nsp:
            nsp_logits = out.nsp_logits.float()
            nsp_labels = batch["next_sentence_label"]
            nsp_sum = F.cross_entropy(nsp_logits, nsp_labels, reduction="sum")
            loss = loss + nsp_sum / totals[1].clamp(min=1)
            stats += [
                nsp_sum.detach(),
                torch.tensor(len(nsp_labels)),
                (nsp_logits.argmax(-1) == nsp_labels).sum(),
            ]
        return loss, torch.stack(
            [torch.as_tensor(s, dtype=torch.float64, device=loss.device) for s in stats]
        )

    def log_entry(self, sums: torch.Tensor) -> dict[str, float]:
        s = sums.tolist()
        entry = {"mlm_loss": s[0] / max(s[1], 1), "mlm_accuracy": s[2] / max(s[1], 1)}
        if self.nsp:
            entry["nsp_loss"] = s[3] / max(s[4], 1)
            entry["nsp_accuracy"] = s[5] / max(s[4], 1)
        entry["loss"] = entry["mlm_loss"] + entry.get("nsp_loss", 0.0)
        return {k: round(v, 6) for k, v in entry.items()}


def resolve_config(
    config: str | BertConfig, vocab_size: int, seq_len: int, objective: str
) -> BertConfig:
    """A preset name (tiny … large), a config.json / bert_config.json path, or a BertConfig."""
    if isinstance(config, BertConfig):
        resolved = config
    elif config in PRESETS:
        resolved = BertConfig.from_preset(config, vocab_size=vocab_size)
    elif Path(config).is_file():
        resolved = BertConfig.from_json_file(config)
    else:
        raise ValueError(
            f"--config {config!r} is neither a preset ({', '.join(PRESETS)}) nor a file"
        )
    if resolved.vocab_size != vocab_size:
        raise ValueError(
            f"config vocab_size {resolved.vocab_size} != the shards' vocabulary ({vocab_size})"
        )
    if seq_len > resolved.max_position_embeddings:
        raise ValueError(
            f"--seq-len {seq_len} exceeds max_position_embeddings {resolved.max_position_embeddings}"
        )
    return dataclasses.replace(resolved, is_decoder=objective == "ltr")


def run_pretraining(
    data: str | os.PathLike,
    out: str | os.PathLike,
    *,
    config: str | BertConfig = "tiny",
    max_steps: int,
    batch_size: int = 256,
    seq_len: int = 128,
    objective: str = "mlm+nsp",
    eval_data: str | os.PathLike | None = None,
    eval_batches: int = 20,
    init_from: str | os.PathLike | None = None,
    masking: MaskingConfig | None = None,
    short_seq_prob: float = 0.1,
    learning_rate: float = 1e-4,
    warmup_steps: int = 10_000,
    accumulation: int = 1,
    log_every: int = 10,
    eval_every: int = 0,
    save_every: int = 1000,
    seed: int = 0,
    resume: bool = False,
    precision: str = "auto",
    device: str | None = None,
    progress: bool = True,
    model: torch.nn.Module | None = None,
) -> list[dict[str, Any]]:
    """Pre-train on the shards in `data`; `out` ends up a checkpoint directory (config.json,
    model.safetensors, vocab.txt) with `log.jsonl` and `trainer_state.pt` beside the weights.

    `batch_size` is the global batch (sequences per optimiser step, as in the paper: 256), split
    over processes and `accumulation` micro-batches. `init_from` continues from a checkpoint with
    a fresh schedule (the paper's phase 2 at length 512 after phase 1 at 128). `model` replaces
    the one `config` would build (it must take `masked_positions` and give `mlm_logits`, and
    `nsp_logits` for NSP; the benchmarks pass transformers' model through an adapter).
    """
    dist = distributed.setup(device)
    try:
        out = Path(out)
        if (out / STATE_FILE).exists() and not resume:
            raise FileExistsError(
                f"{out}: holds a run in progress; pass --resume to continue it or pick another --out"
            )
        shards = Shards(data)
        tokenizer = BertTokenizer.from_pretrained(data)
        parts = dist.world_size * accumulation
        if batch_size % parts:
            raise ValueError(
                f"--batch-size {batch_size} is not divisible by processes x accumulation = {parts}"
            )
        model_config = resolve_config(config, tokenizer.vocab_size, seq_len, objective)
        model_class = BertForPreTraining if objective == "mlm+nsp" else BertForMaskedLM
        torch.manual_seed(seed)
        if model is not None:
            pass
        elif init_from is not None:
            model = model_class.from_pretrained(init_from, config=model_config)
        else:
            model = model_class(model_config)
        stream = PretrainingData(
            shards,
            tokenizer,
            batch_size=batch_size // parts,
            max_seq_length=seq_len,
            short_seq_prob=short_seq_prob,
            objective=objective,
            masking=masking or MaskingConfig(),
            seed=seed,
            rank=dist.rank,
            world_size=dist.world_size,
        )
        objective_fn = PretrainingObjective(objective)
        evaluate = None
        if eval_data is not None:
            eval_stream = PretrainingData(
                Shards(eval_data),
                tokenizer,
                batch_size=batch_size // parts,
                max_seq_length=seq_len,
                objective=objective,
                masking=masking or MaskingConfig(),
                seed=seed + 1,
                rank=dist.rank,
                world_size=dist.world_size,
            )

            def evaluate(model):
                eval_stream.load_state_dict({"epoch": 0, "row": 0})  # the same batches each time
                sums = None
                ones = torch.ones(2, dtype=torch.float64)
                for _ in range(eval_batches):
                    batch = {k: v.to(dist.device) for k, v in eval_stream.next_batch().items()}
                    _, stats = objective_fn.loss(model, batch, ones)
                    sums = stats.cpu() if sums is None else sums + stats.cpu()
                sums = distributed.all_reduce_sum(sums.to(dist.device), dist).cpu()
                entry = objective_fn.log_entry(sums)
                return {"split": "eval", **{k: v for k, v in entry.items() if k != "loss"}}

        def save_model(model, directory: Path) -> None:
            model.save_pretrained(directory, tokenizer=tokenizer)

        training = TrainingConfig(
            out_dir=str(out),
            max_steps=max_steps,
            learning_rate=learning_rate,
            warmup_steps=warmup_steps,
            accumulation=accumulation,
            precision=precision,
            log_every=log_every,
            eval_every=eval_every,
            save_every=save_every,
            seed=seed,
            resume=resume,
            progress=progress,
        )
        trainer = Trainer(
            model,
            objective_fn,
            stream,
            training,
            dist_info=dist,
            evaluate=evaluate,
            save_model=save_model,
        )
        entries = trainer.train()
        if dist.is_main:
            from bertkit.viz import plot_log

            plot_log(out / LOG_FILE, out / "curves.png", title=f"pre-training: {out.name}")
        return entries
    finally:
        distributed.cleanup(dist)


def parse_phases(text: str) -> list[tuple[int, int]]:
    """`"128:900,512:100"` -> [(128, 900), (512, 100)]: (sequence length, steps) per phase.

    >>> parse_phases("128:900,512:100")
    [(128, 900), (512, 100)]
    """
    phases = []
    for part in text.split(","):
        try:
            length, steps = (int(x) for x in part.split(":"))
        except ValueError:
            raise ValueError(
                f"--phases: {part!r} is not SEQ_LEN:STEPS (e.g. 128:90000,512:10000)"
            ) from None
        if length <= 0 or steps <= 0:
            raise ValueError(f"--phases: {part!r} needs a positive length and step count")
        phases.append((length, steps))
    return phases


def run_phases(
    data: str | os.PathLike,
    out: str | os.PathLike,
    phases: list[tuple[int, int]],
    *,
    resume: bool = False,
    init_from: str | os.PathLike | None = None,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """The paper's schedule: phases of (sequence length, steps), each continuing from the previous
    phase's weights with a fresh optimiser and schedule. Earlier phases are kept in
    `out/phase<N>-seq<L>`; the last one writes to `out`. With `resume`, finished phases are skipped
    and the current one continues from its trainer state. `init_from` is where phase 1 starts."""
    out = Path(out)
    entries: list[dict[str, Any]] = []
    previous = Path(init_from) if init_from is not None else None
    for number, (seq_len, steps) in enumerate(phases, start=1):
        last = number == len(phases)
        directory = out if last else out / f"phase{number}-seq{seq_len}"
        state = directory / STATE_FILE
        if resume and state.exists() and _finished(state, steps):
            logger.info(
                "phase %d (%d x %d) already finished in %s", number, steps, seq_len, directory
            )
        else:
            phase_entries = run_pretraining(
                data,
                directory,
                seq_len=seq_len,
                max_steps=steps,
                init_from=previous,
                resume=resume and state.exists(),
                **kwargs,
            )
            entries.extend({**e, "phase": number} for e in phase_entries)
        previous = directory
    return entries


def _finished(state_file: Path, steps: int) -> bool:
    state = torch.load(state_file, map_location="cpu", weights_only=True)
    return int(state["step"]) >= steps
