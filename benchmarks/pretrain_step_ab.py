"""A/B of pre-training step variants, in one process, alternated so that the machine's drift hits
every variant alike; median step time of each and its ratio to the first (the loop's default).

    python benchmarks/pretrain_step_ab.py --data runs/data/AA --config tiny --batch-size 64
    python benchmarks/pretrain_step_ab.py --data runs/data/AA --variants default single-adamw compile

A step is what `Trainer` does: forward (MLM + NSP at the masked positions), backward, gradient
clipping, AdamW, on real batches of the shards (bert-base-uncased vocabulary: its decoder is
30,522 wide), with the loop's settings (oneDNN off for fp32 on CPU; freed memory kept in the
heap, `bertkit.training.host_memory`, as `Trainer.train` runs on CPUs). Variants:

- `default`: the loop's: the MLM softmax fused with its gradient (`fused_vocab_cross_entropy`),
  the loop's optimiser (`build_optimizer`: AdamW, fused since 2026-11-23);
- `single-adamw`, `foreach`: AdamW one tensor at a time (what the loop ran before: torch's
  choice on CPU) or `foreach=True` (this script's baseline before 2026-11-23; the loop never
  ran it);
- `logits`: the MLM logits materialised and `F.cross_entropy` + argmax on them (the path other
  implementations take; the loop's before `fused_mlm`);
- `fused-adamw`: AdamW(fused=True) (one kernel over all parameters);
- `compile`: `torch.compile(model, dynamic=True)` with the loop's AdamW (its compile time is
  reported apart: a short budget pays it too);
- `bf16`: the default under bf16 autocast with oneDNN on (`--precision bf16`: fp32 master
  weights and optimiser; bf16 matrix products where the CPU has them, e.g. AVX512-BF16 or AMX);
- `chunked-bf16`: `bf16` with the fused MLM softmax's weight gradient made one product per
  chunk of 64 rows, as before 2026-11-28 (each added into the fp32 gradient: a conversion of
  the whole vocabulary matrix per chunk);
- `transformers`, `transformers-bf16`: transformers' BertForPreTraining from the same initial
  weights behind the same objective and optimiser (pretrain_vs_hf.py's adapter: logits at every
  position, those at the masked positions kept), in fp32 / under bf16 autocast;
- `profile`, `profile-bf16`: no timing, a torch.profiler table of one step's top operators
  (`default` / `bf16`).
"""

from __future__ import annotations

import dataclasses
import time

import torch
from _args import arguments
from _harness import (
    add_timing_arguments,
    alternate,
    gemm_peak,
    medians,
    products_rate,
    start,
    transformers_copy,
)

from bertkit import BertConfig, BertForPreTraining
from bertkit.core import losses
from bertkit.core.tokenizer import BertTokenizer
from bertkit.pretraining.dataset import PretrainingData
from bertkit.pretraining.shards import Shards
from bertkit.pretraining.train import PretrainingObjective
from bertkit.training.host_memory import keep_heap
from bertkit.training.optim import OptimConfig, build_optimizer, parameter_groups


class _Opaque(torch.nn.Module):
    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, **kwargs):
        return self.model(**kwargs)


def build(args, variant: str):
    torch.manual_seed(0)
    tokenizer = BertTokenizer.from_pretrained(args.data)
    config = BertConfig.from_preset(args.config, vocab_size=tokenizer.vocab_size)
    if args.dropout is not None:  # the laptop recipe's 0.0
        config = dataclasses.replace(
            config, hidden_dropout_prob=args.dropout, attention_probs_dropout_prob=args.dropout
        )
    model = BertForPreTraining(config).train()
    if variant.startswith("transformers"):
        model = transformers_copy(config, model.state_dict(), tokenizer).train()
    kind = {"fused-adamw": {"fused": True}, "single-adamw": {"foreach": False}, "foreach": {
        "foreach": True}}  # fmt: skip
    if variant in kind:
        optimizer = torch.optim.AdamW(
            parameter_groups(model, 0.01), lr=1e-4, eps=1e-6, **kind[variant]
        )
    else:
        optimizer = build_optimizer(model, OptimConfig(learning_rate=1e-4))
    forward = model
    if variant == "compile":
        forward = torch.compile(model, dynamic=True)
    elif variant == "logits":  # not a bertkit head to the objective: it takes the logits path
        forward = _Opaque(model)
    stream = PretrainingData(
        Shards(args.data), tokenizer, batch_size=args.batch_size, seq_len=args.seq_len
    )
    batches = [stream.next_batch() for _ in range(args.steps)]
    objective = PretrainingObjective("mlm+nsp")
    totals = [objective.counts(b).double() for b in batches]

    bf16 = variant.endswith("bf16")
    # chunked-bf16: the fused MLM softmax's weight gradient one product per chunk of 64 rows,
    # as before 2026-11-28 (losses.GRADIENT_GROUP_ROWS)
    group = 64 if variant == "chunked-bf16" else losses.GRADIENT_GROUP_ROWS

    def step(i: int) -> None:
        torch.backends.mkldnn.enabled = bf16  # type: ignore[assignment]  # as the loop sets it
        keep_heap(True)  # as the loop keeps it (before 2026-11-28 this benchmark did not)
        kept, losses.GRADIENT_GROUP_ROWS = losses.GRADIENT_GROUP_ROWS, group
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss, _ = objective.loss(forward, batches[i], totals[i])
        losses.GRADIENT_GROUP_ROWS = kept
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step.batches, step.config = batches, config  # type: ignore[attr-defined]  # for --flops
    return step


def step_flops(config, batches) -> tuple[float, float]:
    """(model FLOPs, real tokens) of a step, averaged over `batches`: forward x3 (backward twice
    the forward) of the encoder on the real tokens (24 H^2 a token a layer for the dense layers,
    4 S H for attention over the batch's padded length S) and of the MLM head on the masked
    positions (the transform, 2 H^2, and the decoder, 2 V H)."""
    hidden, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    flops = tokens = 0.0
    for batch in batches:
        real = float(batch["attention_mask"].sum())
        length = batch["input_ids"].shape[1]
        masked = float((batch["labels"] != -100).sum())
        forward = real * layers * (24 * hidden**2 + 4 * length * hidden)
        forward += masked * (2 * hidden**2 + 2 * vocab * hidden)
        flops, tokens = flops + 3 * forward, tokens + real
    return flops / len(batches), tokens / len(batches)


def step_products_rate(config, batches, dtype: torch.dtype, repeats: int = 3) -> float:
    """GFLOP/s of this machine's matrix products at the step's own shapes and `dtype`: each
    dense layer's product over a batch's real tokens (query, key, value and output H x H, the
    feed-forward H x I and I x H, the MLM transform H x H and decoder H x V over the masked
    positions), forward and the backward's two (the input's and the weight's gradient), timed
    one by one (best of `repeats`) and weighted by how often a step runs each."""
    hidden, inner, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    layers = config.num_hidden_layers
    tokens = int(sum(float(b["attention_mask"].sum()) for b in batches) / len(batches))
    masked = int(sum(float((b["labels"] != -100).sum()) for b in batches) / len(batches))
    shapes = [(tokens, hidden, hidden, 4 * layers), (tokens, hidden, inner, layers),
              (tokens, inner, hidden, layers), (masked, hidden, hidden, 1),
              (masked, hidden, vocab, 1)]  # fmt: skip
    return products_rate(shapes, dtype, repeats, backward=True)


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--data", required=True, help="shards (bertkit prepare)")
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=4, help="steps per round")
    add_timing_arguments(parser, rounds=6, threads=2)
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["default", "logits", "single-adamw"],
        help="default logits single-adamw foreach fused-adamw compile bf16 chunked-bf16 "
        "transformers transformers-bf16 profile profile-bf16",
    )
    parser.add_argument("--dropout", type=float, help="default: the config's (0.1)")
    parser.add_argument(
        "--flops",
        action="store_true",
        help="tokens/s and model GFLOP/s of each variant against this machine's fp32 GEMM peak, "
        "and against its matrix products at the step's own shapes in the variant's precision",
    )
    args = parser.parse_args()
    print(start(args))
    torch.backends.mkldnn.enabled = False  # as the loop does for fp32 on CPU
    profiled = [v for v in args.variants if v.startswith("profile")]
    if profiled:  # profile: the default step; profile-bf16: under bf16 autocast
        step = build(args, "bf16" if profiled[0].endswith("bf16") else "default")
        step(0)
        with torch.profiler.profile() as prof:
            step(1)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
        return
    steps = {}
    for variant in args.variants:
        step = build(args, variant)
        started = time.perf_counter()
        step(0)  # warm-up (compilation for `compile`)
        print(f"{variant}: first step {time.perf_counter() - started:.1f} s", flush=True)
        steps[variant] = step

    def each_batch(step):  # the round's calls run the step on batches 0, 1, ... in turn
        calls = iter(range(1 << 62))
        return lambda: step(next(calls) % args.steps)

    runners = {variant: each_batch(step) for variant, step in steps.items()}
    times = alternate(runners, args.rounds, calls=args.steps)
    middle = medians(times)
    reference = middle[args.variants[0]]
    for variant, values in times.items():
        median = middle[variant]
        print(
            f"{args.config} batch {args.batch_size}: {variant:8s} {1000 * median:7.1f} ms a step "
            f"(min {1000 * min(values):.1f}), {reference / median:.3f}x {args.variants[0]}"
        )
    if args.flops:
        first = next(iter(steps.values()))
        flops, tokens = step_flops(first.config, first.batches)
        peak = gemm_peak()
        print(
            f"a step: {flops / 1e9:.1f} GFLOP on {tokens:.0f} real tokens; fp32 GEMM peak "
            f"{peak:.0f} GFLOP/s (2048^2 torch.mm)"
        )
        torch.backends.mkldnn.enabled = True  # (bf16 products run on oneDNN)
        products = {
            kind: step_products_rate(first.config, first.batches, dtype)
            for kind, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))
        }
        print(
            "matrix products at this step's shapes: "
            + ", ".join(f"{kind} {rate:.0f} GFLOP/s" for kind, rate in products.items())
        )
        for variant in steps:
            seconds = middle[variant]
            rate = flops / seconds / 1e9
            kind = "bf16" if variant.endswith("bf16") else "fp32"
            print(
                f"{variant:8s} {tokens / seconds:,.0f} tokens/s, {rate:.0f} GFLOP/s "
                f"({rate / peak:.0%} of peak; {rate / products[kind]:.0%} of its {kind} "
                "products' rate at the step's shapes)"
            )


if __name__ == "__main__":
    main()
