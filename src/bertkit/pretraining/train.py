"""`bertkit pretrain`: the paper's pre-training on prepared shards, through the one training loop.

Objectives (the paper's Table 5 ablations): "mlm+nsp" (BERT), "mlm" (No NSP: one contiguous
segment, masked LM only), "ltr" (left-to-right LM: causal attention, next-token loss, no NSP).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bertkit._device import as_float64
from bertkit._io import STATE_FILE
from bertkit.core.config import BertConfig
from bertkit.core.heads import BertForMaskedLM, BertForPreTraining
from bertkit.core.hub import model_dir
from bertkit.core.losses import IGNORE_INDEX, sequence_loss, token_loss
from bertkit.core.model import set_activation_checkpointing, set_dropout_parity, set_static_shapes
from bertkit.core.tokenizer import BertTokenizer
from bertkit.pretraining import init_schemes
from bertkit.pretraining.dataset import MaskingConfig, PretrainingData
from bertkit.pretraining.init_schemes import ATTENTION_INITS, POSITION_INITS
from bertkit.pretraining.instances import OBJECTIVES
from bertkit.pretraining.prefetch import PrefetchedData, default_workers
from bertkit.pretraining.shards import Shards
from bertkit.settings import (
    Settings,
    flat,
    flat_names,
    nested,
    replaced,
    setting,
)
from bertkit.training import distributed
from bertkit.training.config import ComputeConfig, TrainingConfig
from bertkit.training.loop import Trainer
from bertkit.training.optim import OptimConfig
from bertkit.training.run_folder import LOG_FILE, RUN_FILE, claim_folder

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
        labels = batch["labels"]
        valid = labels != IGNORE_INDEX
        fused = isinstance(distributed.unwrap(model), (BertForPreTraining, BertForMaskedLM))
        ours = {"labels": labels, "fused_mlm": True, "layouts": batch.get("layouts")}
        out = model(
            input_ids=batch["input_ids"],
            token_type_ids=batch["token_type_ids"],
            attention_mask=batch["attention_mask"],
            masked_positions=batch["masked_positions"],
            **(ours if fused else {}),
        )
        if fused:  # bertkit's heads: the vocabulary softmax without the logits in memory
            mlm_sum, correct = out.mlm_loss_sum.float(), out.mlm_correct
        else:  # another implementation (benchmarks): logits at the masked positions
            logits = (out.mlm_logits if hasattr(out, "mlm_logits") else out.logits).float()
            mlm_sum = token_loss(logits, labels, reduction="sum")
            correct = ((logits.argmax(-1) == labels) & valid).sum()
        loss = mlm_sum / totals[0].clamp(min=1)
        stats = [mlm_sum.detach(), valid.sum(), correct]
        if self.nsp:
            nsp_logits = out.nsp_logits.float()
            nsp_labels = batch["next_sentence_label"]
            nsp_sum = sequence_loss(
                nsp_logits, nsp_labels, "single_label_classification", reduction="sum"
            )
            loss = loss + nsp_sum / totals[1].clamp(min=1)
            stats += [
                nsp_sum.detach(),
                len(nsp_labels),
                (nsp_logits.argmax(-1) == nsp_labels).sum(),
            ]
        return loss, torch.stack([as_float64(s, loss) for s in stats])

    def log_entry(self, sums: torch.Tensor) -> dict[str, float]:
        s = sums.tolist()
        entry = {"mlm_loss": s[0] / max(s[1], 1), "mlm_accuracy": s[2] / max(s[1], 1)}
        if self.nsp:
            entry["nsp_loss"] = s[3] / max(s[4], 1)
            entry["nsp_accuracy"] = s[5] / max(s[4], 1)
        entry["loss"] = entry["mlm_loss"] + entry.get("nsp_loss", 0.0)
        return {k: round(v, 6) for k, v in entry.items()}


@torch.no_grad()
def unigram_bias_(bias: torch.Tensor, counts, smoothing: float = 0.5) -> torch.Tensor:
    """Start the MLM decoder's output bias at the log unigram probabilities of the training
    tokens (add-`smoothing` for unseen ids): a fresh model then predicts word frequencies from
    step 0. With a zero bias (Google's init) Adam can move each bias entry by about the learning
    rate per step, so the frequencies (log-probabilities down to -17) are first absorbed by the
    tied word embeddings, pushing every input embedding along one shared direction."""
    counts = torch.as_tensor(counts, dtype=torch.float64) + smoothing
    logp = counts.log() - counts.sum().log()
    bias.copy_((logp - logp.mean()).to(bias.dtype))
    return bias


def _held_out_evaluation(
    shards: Shards,
    tokenizer: BertTokenizer,
    objective_fn: PretrainingObjective,
    *,
    batch_size: int,
    seq_len: int,
    objective: str,
    masking: MaskingConfig,
    seed: int,
    batches: int,
    dist: distributed.Distributed,
    fixed_shapes: bool = False,
):
    """The held-out measure: the same `batches` batches of unseen text each time, scored twice on
    the same masked positions. `mlm_accuracy` / `mlm_loss` replace *every* chosen piece by [MASK]
    (nothing to copy: the number to rank recipes by); `mlm_accuracy_801010` / `mlm_loss_801010`
    corrupt them as training does (80% [MASK], 10% random, 10% kept, the last being free hits).
    `mlm_perplexity` is exp(mlm_loss)."""
    streams = {
        "": dataclasses.replace(masking, mask_token_prob=1.0, random_token_prob=0.0),
        "_801010": masking,
    }
    if objective == "ltr":  # no masking: one pass, next-token loss and accuracy
        streams = {"": masking}
    data = {
        suffix: PretrainingData(
            shards,
            tokenizer,
            batch_size=batch_size,
            seq_len=seq_len,
            objective=objective,
            masking=m,
            seed=seed,
            rank=dist.rank,
            world_size=dist.world_size,
            fixed_shapes=fixed_shapes,  # (CUDA graphs: one shape)
        )
        for suffix, m in streams.items()
    }

    def evaluate(model, step: int) -> dict[str, Any]:
        out: dict[str, Any] = {"split": "eval"}
        ones = torch.ones(2, dtype=torch.float64)
        for suffix, stream in data.items():
            stream.load_state_dict({"epoch": 0, "row": 0})  # the same batches each time
            sums = torch.zeros(0, dtype=torch.float64)
            for n in range(batches):
                batch = {k: v.to(dist.device) for k, v in stream.next_batch().items()}
                _, stats = objective_fn.loss(model, batch, ones)
                sums = stats.cpu() if n == 0 else sums + stats.cpu()
            sums = distributed.all_reduce_sum(sums.to(dist.device), dist).cpu()
            entry = objective_fn.log_entry(sums)
            if suffix:  # NSP does not depend on the masking: reported once
                entry = {k: v for k, v in entry.items() if k.startswith("mlm")}
            else:
                entry["mlm_perplexity"] = round(math.exp(min(entry["mlm_loss"], 50.0)), 3)
            out.update({k + suffix: v for k, v in entry.items() if k != "loss"})
        return out

    return evaluate


def resolve_config(
    config: str | BertConfig,
    vocab_size: int,
    seq_len: int,
    objective: str,
    dropout: float | None = None,
    layer_norm: str | None = None,
    feed_forward: str | None = None,
) -> BertConfig:
    """A preset name (tiny … large), a config.json / bert_config.json path, or a BertConfig;
    `dropout` (if given) replaces both the hidden and the attention dropout; `layer_norm` and
    `feed_forward` (if given) set the architecture beyond the paper (a GLU feed-forward with
    2/3 of the config's intermediate size, rounded to a multiple of 8: the MLP's parameters)."""
    resolved = BertConfig.resolve(config, vocab_size)
    if seq_len > resolved.max_length:
        raise ValueError(
            f"--seq-len {seq_len} exceeds the {resolved.max_length} positions the model has "
            f"(max_position_embeddings {resolved.max_position_embeddings}"
            + (f", less RoBERTa's offset of {resolved.position_offset})"
               if resolved.position_offset else ")")
        )  # fmt: skip
    if dropout is not None:
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"--dropout {dropout} is not in [0, 1)")
        resolved = dataclasses.replace(
            resolved, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout
        )
    if layer_norm is not None:
        resolved = dataclasses.replace(resolved, layer_norm_position=layer_norm)
    if feed_forward is not None and feed_forward != resolved.feed_forward:
        if feed_forward != "glu":
            raise ValueError(
                f"--feed-forward {feed_forward} on a GLU config: give an MLP config instead"
            )
        size = max(8, round(resolved.intermediate_size * 2 / 3 / 8) * 8)
        resolved = dataclasses.replace(resolved, feed_forward="glu", intermediate_size=size)
    return dataclasses.replace(resolved, is_decoder=objective == "ltr")


def objective_for(objective: str | None, model: BertConfig) -> str:
    """A run's objective: as given, else BERT's masked LM with next-sentence prediction, and
    the masked LM alone for a model of the family after BERT (RoBERTa dropped NSP, and no
    checkpoint of the family has a next-sentence head). NSP or the left-to-right LM (Table 5's
    BERT ablations) on such a model is refused, naming it."""
    if model.model_type == "bert":
        return objective or "mlm+nsp"
    if objective in (None, "mlm"):
        return "mlm"
    raise ValueError(
        f"--objective {objective}: a {model.model_type} model pre-trains with --objective mlm "
        "(the family after BERT has no next-sentence head, and left-to-right LM is an ablation "
        "of BERT's)"
    )


@flat_names
@dataclass
class PretrainConfig(Settings):
    """Settings of a pre-training run; the `bertkit pretrain` flags are these fields (the
    optimiser's and the masking's among them). Defaults are the paper's (`--recipe laptop`
    changes some: `bertkit.pretraining.recipes.apply_recipe`). Build one from flat names with
    `settings.from_values(PretrainConfig, {...})` or change one with `settings.replaced`."""

    config: str | BertConfig | None = setting(
        None,
        "model size (tiny, mini, small, medium, base, large), a config JSON or a BertConfig "
        "(default: --init-from's own, else tiny)",
    )
    objective: str | None = setting(
        None,
        "mlm+nsp (BERT), mlm (No NSP) or ltr (left-to-right LM): Table 5's rows (default: "
        "mlm+nsp; mlm for a model of the family after BERT, RoBERTa on, which has no "
        "next-sentence head)",
        choices=OBJECTIVES,
    )
    max_steps: int | None = setting(None, "optimiser steps", check="positive")
    budget_seconds: float | None = setting(
        None,
        "training time in seconds instead of (or as well as) a step count",
        check="positive",
        flags=("--budget",),  # (the command's --budget takes 15m, 2h: parse_budget)
    )
    batch_size: int = setting(256, "global sequences per optimiser step", check="positive")
    seq_len: int = setting(128, "tokens per sequence", check="positive")
    dropout: float | None = setting(
        None, "hidden and attention dropout (default: the config's, 0.1)", check="fraction"
    )
    layer_norm: str | None = setting(
        None,
        "where each layer's LayerNorms sit: post (the paper's, LN(x + F(x))) or pre "
        "(x + F(LN(x)) and one LayerNorm after the last layer; beyond the paper, a model "
        "transformers cannot run) (default: the config's, post)",
        choices=("post", "pre"),
    )
    feed_forward: str | None = setting(
        None,
        "the feed-forward: mlp (the paper's) or glu (GEGLU, Shazeer 2020, with the "
        "intermediate size cut to 2/3 so parameters and FLOPs stay the MLP's; beyond the paper, "
        "a model transformers cannot run) (default: the config's, mlp)",
        choices=("mlp", "glu"),
    )
    position_init: str = setting(
        "normal",
        "start of the learned position embeddings: normal (Google's) or sinusoidal (still learned)",
        choices=POSITION_INITS,
    )
    attention_init: str = setting(
        "normal",
        "start of the attention weights: normal (Google's), mimetic (Trockman & Kolter 2023), "
        "mimetic-qk (queries and keys only) or local (layer 1's heads on the neighbours)",
        choices=ATTENTION_INITS,
    )
    mlm_bias_init: str = setting(
        "zeros",
        "start of the MLM output bias: zeros (Google's) or unigram (log frequencies of the "
        "training tokens)",
        choices=("zeros", "unigram"),
    )
    eval_data: str | os.PathLike | None = setting(None, "held-out shards for MLM/NSP evaluation")
    eval_batches: int = setting(20, "held-out batches per evaluation", check="positive")
    eval_seq_len: int | None = setting(
        None, "length of the held-out sequences (default: seq_len)", check="positive"
    )
    init_from: str | os.PathLike | None = setting(
        None,
        "start from this checkpoint (a folder or a Hub name) with a fresh schedule: the paper's "
        "phase 2, or continued pre-training of a released BERT on your corpus (its own config, "
        "vocabulary and MLM head; a fresh head where it has none)",
    )
    short_seq_prob: float = setting(
        0.1, "instances made shorter than seq_len on purpose (Google's)", check="fraction"
    )
    optim: OptimConfig = nested(OptimConfig)
    accumulation: int = setting(
        1, "micro-batches per optimiser step", check="positive", flags=("--accumulate",)
    )
    log_every: int = setting(10, "steps between log lines", check="positive")
    eval_every: int = setting(0, "steps between evaluations (0: at the end)", check="non-negative")
    save_every: int = setting(1000, "steps between checkpoints", check="positive")
    seed: int = setting(0, "seed of weights, data and masks")
    resume: bool = setting(False, "continue from OUT/trainer_state.pt")
    compute: ComputeConfig = nested(ComputeConfig)
    data_workers: int | None = setting(
        None,
        "processes that make batches while the steps run (the same batches, in the same order); "
        "default: up to 4 with CUDA, 0 on CPUs, where the step uses every core",
        check="non-negative",
    )
    progress: bool = setting(True, "a progress bar")
    phases: str | list[tuple[int, float]] | None = setting(
        None,
        "the paper's schedule as SEQ_LEN:STEPS,...: phases each continuing from the last with "
        "a fresh schedule (replaces max_steps and seq_len); with a budget, SEQ_LEN:SHARE of it",
    )
    masking: MaskingConfig = nested(MaskingConfig)

    def phase_plan(self) -> list[PretrainConfig]:
        """The run as phases, each a PretrainConfig of one sequence length with its steps or
        its share of the budget, and the held-out length they all evaluate at (the longest).
        Without `phases`: one phase, this run."""
        if self.phases is None:
            if self.max_steps is None and self.budget_seconds is None:
                raise ValueError(
                    "give --max-steps N, --budget TIME (e.g. 15m) or --phases SEQ:STEPS,..."
                )
            plan = [(self.seq_len, self.max_steps, self.budget_seconds)]
        elif self.budget_seconds is not None:  # SEQ_LEN:SHARE of the budget
            shares = _phases(self.phases, shares=True)
            plan = [(length, None, share * self.budget_seconds) for length, share in shares]
        else:
            plan = [(length, int(steps), None) for length, steps in _phases(self.phases)]
        eval_seq_len = self.eval_seq_len or max(length for length, _, _ in plan)
        return [
            dataclasses.replace(
                self,
                seq_len=length,
                max_steps=steps,
                budget_seconds=budget,
                eval_seq_len=eval_seq_len,
                phases=None,
            )
            for length, steps, budget in plan
        ]


def run_pretraining(
    data: str | os.PathLike,
    out: str | os.PathLike,
    settings: PretrainConfig | None = None,
    *,
    model: torch.nn.Module | None = None,
    on_entry: Callable[[dict[str, Any]], None] | None = None,
    **overrides: Any,
) -> list[dict[str, Any]]:
    """Pre-train on the shards in `data`; `out` ends up a checkpoint directory (config.json,
    model.safetensors, vocab.txt) with `log.jsonl` and `trainer_state.pt` beside the weights.
    `settings` (a `PretrainConfig`), with any of its fields given as keywords on top, the
    optimiser's and the masking's included (`run_pretraining(data, out, config="mini",
    max_steps=1000, learning_rate=1e-3)`).

    `batch_size` is the global batch (sequences per optimiser step, as in the paper: 256), split
    over processes and `accumulation` micro-batches. `init_from` continues from a checkpoint with
    a fresh schedule. `model` replaces the one `config` would build (it must take
    `masked_positions` and give `mlm_logits`, and `nsp_logits` for NSP; the benchmarks pass
    transformers' model through an adapter).

    The run lasts `max_steps` optimiser steps, or `budget_seconds` of training time (evaluations
    and checkpoints not charged), or whichever ends first when both are given; the warm-up is
    the optimiser settings' (`OptimConfig`). `phases` runs the paper's schedule instead: phases
    of (sequence length, steps), each continuing from the previous phase's weights with a fresh
    optimiser and schedule; earlier phases are kept in `out/phase<N>-seq<L>`, the last one
    writes to `out`, and with `resume` finished phases are passed over and the current one
    continues. Held-out evaluation runs at `eval_seq_len` (default: the longest phase's
    `seq_len`) on the same batches every time. Returns the log entries (with "phase" when
    there are phases)."""
    c = replaced(settings or PretrainConfig(), **overrides)
    data = shards_of(data, c.init_from, Path(out), "shards", c.progress)
    if c.eval_data is not None:
        c = dataclasses.replace(
            c, eval_data=shards_of(c.eval_data, c.init_from, Path(out), "eval-shards", c.progress)
        )
    plan = c.phase_plan()
    if c.phases is None:
        return _run_phase(data, Path(out), plan[0], model=model, on_entry=on_entry)
    if model is not None:
        raise ValueError("a model= run has one phase: give max_steps and seq_len, not phases")
    out = Path(out)
    entries: list[dict[str, Any]] = []
    previous = c.init_from
    for number, phase in enumerate(plan, start=1):
        directory = out if number == len(plan) else out / f"phase{number}-seq{phase.seq_len}"
        # A finished phase is run too: the trainer sees it is done, makes sure its model file
        # holds the final weights, and the curves are drawn again (nothing is trained twice).
        resume = c.resume and any((directory / f).exists() for f in (STATE_FILE, RUN_FILE))
        phase = dataclasses.replace(phase, init_from=previous, resume=resume)
        phase_entries = _run_phase(data, directory, phase, on_entry=on_entry)
        entries.extend({**e, "phase": number} for e in phase_entries)
        previous = str(directory)
    return entries


def shards_of(
    data: str | os.PathLike, init_from: str | os.PathLike | None, out: Path, kind: str,
    progress: bool = True,
) -> str | os.PathLike:  # fmt: skip
    """`data` as a shards folder: shards as they are; raw text (a folder or a file), when the
    run starts from a checkpoint, tokenised with the checkpoint's vocabulary into OUT-`kind`
    (once: a resumed run finds them there)."""
    from bertkit.pretraining.corpus import expand_paths
    from bertkit.pretraining.shards import META, prepare_shards

    if (Path(data) / META).exists() or not Path(data).exists():
        return data  # shards (or a missing folder, which Shards reports)
    if init_from is None:
        raise ValueError(
            f"{data}: not a shards folder (no {META}): make one with bertkit vocab and bertkit "
            "prepare, or give --init-from CHECKPOINT to tokenise this text with its vocabulary"
        )
    if os.environ.get("WORLD_SIZE", "1") != "1":
        raise ValueError(
            f"{data}: raw text under torchrun: prepare its shards first (bertkit prepare {data} "
            f"--vocab {init_from} --out SHARDS), then pass --data SHARDS"
        )
    tokenizer = BertTokenizer.from_pretrained(model_dir(init_from))
    target = out.with_name(f"{out.name}-{kind}")
    sources = [str(f) for f in expand_paths([data])]
    if (target / META).exists():
        meta = json.loads((target / META).read_text())
        if meta.get("sources") == sources and meta.get("vocab_hash") == tokenizer.vocab_hash:
            return target
    print(f"tokenising {data} with the vocabulary of {init_from} into {target}", file=sys.stderr,
          flush=True)  # fmt: skip
    prepare_shards([data], tokenizer, target, overwrite=True, progress=progress)
    return target


def _run_phase(
    data: str | os.PathLike,
    out: Path,
    c: PretrainConfig,
    *,
    model: torch.nn.Module | None = None,
    on_entry: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """One run at one sequence length (`c`: a phase of `PretrainConfig.phase_plan`), in the
    process group torchrun describes, which it leaves only once this run's objects are gone:
    DDP's reducer (hooked on the model's parameters) holds the group, and a group destroyed
    under it made a rank abort at exit ('terminate called without an active exception')."""
    c.optim.warmup_steps_for(c.max_steps, c.budget_seconds)  # a bad warm-up fails before any work
    dist = distributed.setup(c.compute.device)
    try:
        return _train_phase(data, out, c, dist, model=model, on_entry=on_entry)
    finally:
        distributed.cleanup(dist)


# The widest model `--compile auto` runs with CUDA graphs. BERT-small (H 512) pre-training in the
# loop on an H200 at 256 x 128, bf16: 2.36M tokens/s with graphs against 1.44M compiled; BERT-base
# (H 768) was measured only without graphs, where its padded path ran 0.94x the unpadded one
# (docs/results/gpu).
GRAPHS_UP_TO_HIDDEN = 512


def resolve_compile(c: PretrainConfig, model: BertConfig, dist: distributed.Distributed) -> str:
    """`--compile` as this run takes it: "auto" is "graphs" for a model no wider than
    GRAPHS_UP_TO_HIDDEN trained by one process on a GPU without activation checkpointing
    (small models' steps are bound by kernel launches, and one CUDA graph is one launch; the
    same numbers as eager); otherwise the choice as given, which the loop resolves."""
    small = model.hidden_size <= GRAPHS_UP_TO_HIDDEN
    alone = dist.world_size == 1 and not c.compute.activation_checkpointing
    if c.compute.compile == "auto" and dist.device.type == "cuda" and small and alone:
        return "graphs"
    return c.compute.compile


# Settings that never change what a run computes: a resumed run may give them other values.
_NOT_IDENTITY = frozenset(("resume", "progress", "device", "log_every", "eval_every", "save_every",
                           "eval_data", "eval_batches", "eval_seq_len", "compile",
                           "data_workers"))  # fmt: skip


def run_identity(
    c: PretrainConfig, shards: Shards, model_config: BertConfig, model: torch.nn.Module | None
) -> dict[str, Any]:
    """What makes a pre-training run this run (run.json, `claim_folder`): its settings but the
    cadence of logs, evaluations and checkpoints, the model as resolved (a preset's name and its
    config.json are the same run), the starting checkpoint's full path and the shards' content
    (vocabulary, token and document counts: a moved folder is the same data)."""
    identity: dict[str, Any] = {
        name: value for name, (value, _) in flat(c).items() if name not in _NOT_IDENTITY
    }
    identity["config"] = (
        model_config.to_dict() if model is None else f"a given {type(model).__name__}"
    )
    if c.init_from is not None:
        identity["init_from"] = str(model_dir(c.init_from).resolve())
    identity["data"] = {
        k: shards.meta.get(k) for k in ("vocab_hash", "num_tokens", "num_documents")
    }
    return json.loads(json.dumps(identity, default=str))  # as run.json will read back


def _own_config(init_from: str | os.PathLike | None) -> str | BertConfig:
    """A run's model when no config is given: its starting checkpoint's, else tiny."""
    from bertkit.core.checkpoint import read_config

    return "tiny" if init_from is None else read_config(model_dir(init_from))


def _opened(shards: Shards) -> Shards:
    """`shards`, their files checked against their digests (a run reads them for days)."""
    if not shards.verify():
        print(f"{shards.directory}: prepared without digests, so not checked (bertkit prepare "
              "writes them now)", file=sys.stderr, flush=True)  # fmt: skip
    return shards


def _train_phase(
    data: str | os.PathLike,
    out: Path,
    c: PretrainConfig,
    dist: distributed.Distributed,
    *,
    model: torch.nn.Module | None,
    on_entry: Callable[[dict[str, Any]], None] | None,
) -> list[dict[str, Any]]:
    shards = _opened(Shards(data))
    tokenizer = shards.tokenizer()
    if c.init_from is not None:  # its ids must mean the checkpoint's words
        _check_vocabulary(data, tokenizer, c.init_from)
    base = BertConfig.resolve(
        c.config if c.config is not None else _own_config(c.init_from), tokenizer.vocab_size
    )
    c = dataclasses.replace(c, objective=objective_for(c.objective, base))
    assert c.objective is not None
    parts = dist.world_size * c.accumulation
    if c.batch_size % parts:
        raise ValueError(
            f"--batch-size {c.batch_size} is not divisible by processes x accumulation = {parts}"
        )
    assert c.eval_seq_len is not None  # phase_plan sets it
    model_config = resolve_config(
        base,
        tokenizer.vocab_size,
        max(c.seq_len, c.eval_seq_len),
        c.objective,
        c.dropout,
        c.layer_norm,
        c.feed_forward,
    )
    identity = run_identity(c, shards, model_config, model)
    # (an empty or new folder with --resume just starts: scripts pass it every time)
    claim_folder(out, identity, resume=c.resume, flags={k: f for k, (_, f) in flat(c).items()})
    model, compile_mode = _phase_model(model, c, model_config, shards, tokenizer.vocab_size, dist)
    batches = _batches(shards, tokenizer, c, dist, c.batch_size // parts, compile_mode)
    objective_fn = PretrainingObjective(c.objective)
    evaluate = None
    if c.eval_data is not None:
        fixed = compile_mode == "graphs"
        evaluate = _held_out_evaluation(
            _opened(Shards(c.eval_data)), tokenizer, objective_fn, batch_size=c.batch_size // parts,
            seq_len=c.eval_seq_len, objective=c.objective, masking=c.masking, seed=c.seed + 1,
            batches=c.eval_batches, dist=dist, fixed_shapes=fixed,
        )  # fmt: skip

    def save_model(model, directory: Path) -> None:
        model.save_pretrained(directory, tokenizer=tokenizer)

    training = _training_config(c, out, compile_mode, identity)
    trainer = Trainer(
        model,
        objective_fn,
        batches,
        training,
        dist_info=dist,
        evaluate=evaluate,
        save_model=save_model,
        on_entry=on_entry,
        flags={k: f for k, (_, f) in flat(c).items()},
    )
    try:
        entries = trainer.train()
    finally:
        if isinstance(batches, PrefetchedData):
            batches.close()
    if dist.is_main:
        from bertkit.viz import plot_log

        plot_log(out / LOG_FILE, out / "curves.png", title=f"pre-training: {out.name}")
    # every rank leaves the process group together: a rank that tore its connections down
    # while rank 0 still drew the curves was seen to abort at exit (gloo, 2 processes)
    distributed.barrier(dist)
    return entries


def _training_config(
    c: PretrainConfig, out: Path, compile_mode: str, identity: dict[str, Any]
) -> TrainingConfig:
    """How the loop runs this phase."""
    return TrainingConfig(
        out_dir=str(out),
        max_steps=c.max_steps,
        budget_seconds=c.budget_seconds,
        optim=c.optim,
        accumulation=c.accumulation,
        precision=c.compute.precision,
        compile=compile_mode,
        log_every=c.log_every,
        eval_every=c.eval_every,
        save_every=c.save_every,
        seed=c.seed,
        resume=c.resume,
        progress=c.progress,
        identity=identity,
    )


def _phase_model(
    model: torch.nn.Module | None,
    c: PretrainConfig,
    model_config: BertConfig,
    shards: Shards,
    vocab_size: int,
    dist: distributed.Distributed,
) -> tuple[torch.nn.Module, str]:
    """The phase's model (the previous phase's, the checkpoint `init_from` names, or a new one
    drawn from the seed) made ready as the settings say, and the compile mode it runs in."""
    model_class = BertForPreTraining if c.objective == "mlm+nsp" else BertForMaskedLM
    torch.manual_seed(c.seed)
    if model is None and c.init_from is not None:
        model = model_class.from_pretrained(c.init_from, config=model_config)
    elif model is None:
        model = _initialised(model_class(model_config), c, shards, vocab_size)
    set_dropout_parity(model, c.compute.parity)
    set_activation_checkpointing(model, c.compute.activation_checkpointing)
    compile_mode = resolve_compile(c, model_config, dist)
    set_static_shapes(model, compile_mode == "graphs")
    return model, compile_mode


def _check_vocabulary(
    data: str | os.PathLike, tokenizer: BertTokenizer, init_from: str | os.PathLike
) -> None:
    """Shards whose ids are the checkpoint's words, or a clear refusal."""
    own = BertTokenizer.from_pretrained(model_dir(init_from))
    if own.vocab_hash != tokenizer.vocab_hash:
        raise ValueError(
            f"{data} was prepared with another vocabulary ({tokenizer.vocab_size:,} tokens, "
            f"hash {tokenizer.vocab_hash[:12]}) than {init_from}'s ({own.vocab_size:,}, "
            f"{own.vocab_hash[:12]}): its ids would mean other words to the checkpoint. "
            f"Prepare the text with --vocab {init_from}, or give the raw text as --data"
        )


def _initialised(
    model: BertForPreTraining | BertForMaskedLM, c: PretrainConfig, shards: Shards, vocab_size: int
) -> BertForPreTraining | BertForMaskedLM:
    """A new model's weights drawn as the run's starting points say (`init_schemes`)."""
    init_schemes.apply(
        model,
        position_init=c.position_init,
        attention_init=c.attention_init,
        left_to_right=c.objective == "ltr",
    )
    if c.mlm_bias_init == "unigram":
        unigram_bias_(model.cls.predictions.bias, shards.token_counts(vocab_size))
    return model


def _batches(
    shards: Shards,
    tokenizer: BertTokenizer,
    c: PretrainConfig,
    dist: distributed.Distributed,
    batch_size: int,
    compile_mode: str,
) -> PretrainingData | PrefetchedData:
    """This rank's micro-batches, made in worker processes where there are any."""
    assert c.objective is not None  # (resolved: `objective_for`)
    stream = PretrainingData(
        shards,
        tokenizer,
        batch_size=batch_size,
        seq_len=c.seq_len,
        short_seq_prob=c.short_seq_prob,
        objective=c.objective,
        masking=c.masking,
        seed=c.seed,
        rank=dist.rank,
        world_size=dist.world_size,
        fixed_shapes=compile_mode == "graphs",
    )
    workers = default_workers(dist.device) if c.data_workers is None else c.data_workers
    if workers:
        return PrefetchedData(stream, workers, pin=dist.device.type == "cuda")
    return stream


def parse_budget(text: str) -> float:
    """A time budget in seconds: `90s`, `15m`, `2h`, `1h30m` or a plain number of seconds.

    >>> [parse_budget(t) for t in ("90s", "15m", "2h", "1h30m", "600", "0.5h")]
    [90.0, 900.0, 7200.0, 5400.0, 600.0, 1800.0]
    """
    import re

    text = text.strip().lower()
    try:
        seconds = float(text)
    except ValueError:
        parts = re.fullmatch(
            r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?", text
        )
        if not text or parts is None:
            raise ValueError(
                f"--budget {text!r}: expected a duration such as 90s, 15m, 2h or 1h30m"
            ) from None
        hours, minutes, secs = (float(p) if p else 0.0 for p in parts.groups())
        seconds = 3600 * hours + 60 * minutes + secs
    if seconds <= 0:
        raise ValueError(f"--budget {text!r} is not a positive duration")
    return seconds


def _phases(phases: str | list[tuple[int, float]], shares: bool = False) -> list[tuple[int, Any]]:
    """`PretrainConfig.phases` as pairs: parsed from the flag's text, or checked as given."""
    if isinstance(phases, str):
        return parse_phases(phases, shares=shares)
    text = ",".join(f"{length}:{amount}" for length, amount in phases)
    return parse_phases(text, shares=shares)


def parse_phases(text: str, shares: bool = False) -> list[tuple[int, Any]]:
    """`"128:900,512:100"` -> [(128, 900), (512, 100)]: (sequence length, steps) per phase; with
    `shares` (phases of a --budget), `"32:0.7,128:0.3"` -> [(32, 0.7), (128, 0.3)], shares that
    sum to 1.

    >>> parse_phases("128:900,512:100")
    [(128, 900), (512, 100)]
    >>> parse_phases("32:0.7,128:0.3", shares=True)
    [(32, 0.7), (128, 0.3)]
    """
    what, example = ("SHARE", "32:0.7,128:0.3") if shares else ("STEPS", "128:90000,512:10000")
    phases = []
    for part in text.split(","):
        try:
            length, amount = part.split(":")
            phases.append((int(length), float(amount) if shares else int(amount)))
        except ValueError:
            raise ValueError(f"--phases: {part!r} is not SEQ_LEN:{what} (e.g. {example})") from None
        if phases[-1][0] <= 0 or phases[-1][1] <= 0:
            raise ValueError(f"--phases: {part!r} needs a positive length and {what.lower()}")
    if shares and not math.isclose(sum(share for _, share in phases), 1.0, abs_tol=1e-6):
        raise ValueError(f"--phases {text!r}: the shares of the budget must sum to 1")
    return phases
