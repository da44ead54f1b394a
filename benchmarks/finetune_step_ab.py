"""A/B of fine-tuning step variants (the step's levers), in one process, alternated round by
round; median step time of each and its ratio to the first (the loop's default). And the
optimiser update alone, since that is what the optimiser variants change.

    BERTKIT_DATA=../shared/data python benchmarks/finetune_step_ab.py --threads 1

A step is what `bertkit finetune` does for a sequence-pair classifier: forward on the unpadded
path, backward, gradient clipping at 1, AdamW over the paper's decay groups; all-MiniLM-L6-v2 on
MRPC's first training pairs, batches of 32 padded to their longest. Variants: `default` (the
loop's optimiser, `build_optimizer`), `single-adamw` (torch's AdamW one tensor at a time: its
choice on CPU, what the loop ran before 2026-11-23), `foreach` (`AdamW(foreach=True)`), `parity`
(the default's optimiser, dropout masks drawn as transformers draws them: `--parity`),
`compiled` (the default, the model `torch.compile`d with every size symbolic and one token
layout structure, `BertModel.one_layout_structure`; the first steps compile), `index-add` (the
default with the unpadded rows' gradient as `index_select` gives it, an `index_add`: what
`TokenLayout.to_rows` did before 42ead9e), `heap-released` (the default with glibc's malloc
settings, which give large freed blocks back to the OS: every variant else runs with the heap
kept, as `Trainer.train` runs on CPUs, `bertkit.training.host_memory`).
`--precision bf16` runs the step under bf16 autocast, as `finetune --precision bf16` does;
`--implementation transformers` times transformers' class of the same name on the same batches
(oneDNN left on, as in a user's loop); `--profile N` then runs one more round under
`torch.profiler` and prints the N operators with the most self CPU time for each variant:

    python benchmarks/finetune_step_ab.py --threads 2 --precision bf16 --variants default \\
        --steps 8 --rounds 3 --profile 10
"""

from __future__ import annotations

import copy
import resource
import time
from pathlib import Path

import torch
from _args import arguments, minilm
from _harness import add_timing_arguments, alternate, gemm_peak, medians, ratios, start
from task_data import task_data

from bertkit.core.heads import BertForSequenceClassification
from bertkit.core.model import set_dropout_parity
from bertkit.core.tokenizer import BertTokenizer
from bertkit.core.unpad import TokenLayout
from bertkit.tasks import get_task
from bertkit.training.host_memory import keep_heap
from bertkit.training.optim import OptimConfig, build_optimizer, parameter_groups

VARIANTS = {"single-adamw": {"foreach": False}, "foreach": {"foreach": True}}
ROWS = TokenLayout.to_rows


def index_add_rows(self: TokenLayout, grid: torch.Tensor) -> torch.Tensor:
    """`TokenLayout.to_rows` before 42ead9e: index_select, whose gradient is an index_add."""
    if self.index is None:
        return ROWS(self, grid)
    return grid.reshape(self.batch * self.seq_len, -1).index_select(0, self._sources())


def optimizer_for(model, variant: str) -> torch.optim.Optimizer:
    if variant in ("default", "parity", "compiled", "index-add", "heap-released"):
        return build_optimizer(model, OptimConfig(learning_rate=2e-5))
    return torch.optim.AdamW(parameter_groups(model, 0.01), lr=2e-5, eps=1e-6, **VARIANTS[variant])


def main() -> None:
    parser = arguments(__doc__, data=True)
    parser.add_argument("--variants", nargs="+", default=["default", "single-adamw", "foreach"])
    parser.add_argument("--steps", type=int, default=2, help="steps per round")
    add_timing_arguments(parser, rounds=7, threads=1)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--implementation", choices=["bertkit", "transformers"], default="bertkit")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="top N operators")
    parser.add_argument(
        "--flops",
        action="store_true",
        help="the step's dense-layer GFLOP/s against this machine's fp32 GEMM peak",
    )
    args = parser.parse_args()
    machine = start(args)
    if args.implementation == "bertkit" and args.precision == "fp32":
        torch.backends.mkldnn.enabled = False  # as the loop does for fp32 on CPU
    bf16 = args.precision == "bf16"

    path = minilm()
    tokenizer = BertTokenizer.from_pretrained(path)
    task = get_task("mrpc")
    examples = task.read(task_data(Path(args.data), "mrpc"), "train")[: 32 * args.steps]
    labels = task.labels()
    batches = []
    for offset in range(0, len(examples), 32):
        chunk = examples[offset : offset + 32]
        encoded = tokenizer(
            [e.text_a for e in chunk], [e.text_b for e in chunk], max_length=128,
            truncation=True, padding=True, return_tensors="pt",
        )  # fmt: skip
        encoded["labels"] = torch.tensor([labels.index(e.label) for e in chunk])
        batches.append(encoded)
    torch.manual_seed(0)
    if args.implementation == "transformers":
        import transformers

        model_class = transformers.BertForSequenceClassification
    else:
        model_class = BertForSequenceClassification
    base = model_class.from_pretrained(path, num_labels=2).train()
    setups = {}
    for variant in args.variants:
        model = copy.deepcopy(base)
        set_dropout_parity(model, variant == "parity")
        if variant == "compiled":  # every size symbolic, one layout structure (see --help)
            model.bert.one_layout_structure = True
            model.compile(dynamic=True)
        setups[variant] = (model, optimizer_for(model, variant))

    def step(model, optimizer, batch) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            plan = getattr(model, "host_layouts", None)
            extra = {"layouts": plan(batch, "cpu")} if plan is not None else {}
            loss = model(**batch, **extra).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    for model, optimizer in setups.values():  # warm-up; leaves gradients for the update timing
        step(model, optimizer, batches[0])
    updates: dict[str, list[float]] = {v: [] for v in setups}
    page_faults: dict[str, list[float]] = {v: [] for v in setups}

    def round_of(variant: str):
        model, optimizer = setups[variant]

        def run() -> float:
            started = time.perf_counter()
            optimizer.step()  # the update alone, on the last step's gradients
            updates[variant].append(time.perf_counter() - started)
            optimizer.zero_grad(set_to_none=True)
            TokenLayout.to_rows = index_add_rows if variant == "index-add" else ROWS
            keep_heap(variant != "heap-released")
            started = time.perf_counter()
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for batch in batches:
                step(model, optimizer, batch)
            seconds = (time.perf_counter() - started) / len(batches)  # a step: what is timed
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
            page_faults[variant].append(faults / len(batches))
            TokenLayout.to_rows = ROWS
            return seconds

        return run

    steps = alternate({variant: round_of(variant) for variant in setups}, args.rounds)
    first = args.variants[0]
    print(
        f"all-MiniLM-L6-v2 ({args.implementation}, {args.precision}), MRPC batches of 32, "
        f"{args.rounds} rounds; {machine}"
    )
    step_ratio, update_ratio = ratios(steps, first), ratios(updates, first)
    for variant in setups:
        s, u = medians(steps)[variant], medians(updates)[variant]
        print(
            f"{variant:13s} step {1000 * s:7.1f} ms ({step_ratio[variant]:.3f}x "
            f"{first}); update alone {1000 * u:6.1f} ms ({update_ratio[variant]:.2f}x); "
            f"{medians(page_faults)[variant]:,.0f} page faults a step"
        )
    if args.flops:
        # the encoder's dense layers (QKV, output, feed-forward: 12 H^2 multiply-adds a token a
        # layer), forward and backward (x3), on the real tokens (bertkit's unpadded path) and on
        # every padded one (what a padded implementation computes)
        config = base.config
        per_token = 6 * 12 * config.hidden_size**2 * config.num_hidden_layers
        real = sum(int(b["attention_mask"].sum()) for b in batches) / len(batches)
        padded = sum(b["attention_mask"].numel() for b in batches) / len(batches)
        peak = gemm_peak()
        print(
            f"dense layers: {per_token * real / 1e9:.1f} GFLOP a step on {real:.0f} real tokens "
            f"({per_token * padded / 1e9:.1f} on {padded:.0f} padded); fp32 GEMM peak "
            f"{peak:.0f} GFLOP/s (2048^2 torch.mm)"
        )
        for variant in setups:
            rate = per_token * real / medians(steps)[variant] / 1e9
            print(
                f"{variant:13s} {rate:.0f} GFLOP/s of real-token dense work ({rate / peak:.0%} of peak)"
            )
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        for variant, (model, optimizer) in setups.items():
            with profile(activities=[ProfilerActivity.CPU]) as profiled:
                for batch in batches:
                    step(model, optimizer, batch)
            averages = profiled.key_averages()
            total = sum(event.self_cpu_time_total for event in averages)
            print(f"\n{variant}: self CPU time per step, {len(batches)} steps profiled")
            for event in sorted(averages, key=lambda e: -e.self_cpu_time_total)[: args.profile]:
                per_step = event.self_cpu_time_total / 1000 / len(batches)
                share = event.self_cpu_time_total / total
                print(
                    f"  {event.key:40s} {per_step:8.1f} ms {share:6.1%} "
                    f"({event.count // len(batches)} calls)"
                )


if __name__ == "__main__":
    main()
