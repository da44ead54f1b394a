"""Training-step throughput on a GPU, with model FLOPs utilisation: bertkit against transformers
on the same batches, variants alternated round by round in one process (the CPU runs it too,
for a dry run: `--device cpu`).

    python benchmarks/gpu_throughput.py --data SHARDS --case base:128:256 \\
        --variants bertkit bertkit-compiled transformers --out OUT/base-128.jsonl

A case is MODEL:SEQ_LEN:BATCH. Pre-training cases take real batches of the shards (MLM + NSP,
the paper's masking; the bert-base-uncased vocabulary: a 30,522-wide decoder); `squad-MODEL`
cases time SQuAD fine-tuning (span QA at SEQ_LEN, every position a real token, as SQuAD's
384-piece windows nearly are). A step: forward, backward, clipping at 1, AdamW (fused), under
bf16 autocast (`--precision fp32` for none). Variants:

- `bertkit`: the loop's model and objective (unpadded dense layers, the MLM head at the masked
  positions only, the fused vocabulary softmax where it applies, the token layouts worked out
  on the host as the loop does: `_Head.host_layouts`), eager;
- `bertkit-compiled`: the same after `model.compile()` (what `--compile on` does; the warm-up,
  every batch once, compilation included, is timed apart as `warmup_s`);
- `bertkit-synced-compiled`: compiled, the layouts worked out by the forward on the card (what
  the loop did before: the host waits at each `nonzero` for the card to count real tokens);
- `bertkit-padded`: eager on the padded path (every grid cell a row);
- `bertkit-padded-compiled`: the padded path compiled (static row counts: one graph);
- `bertkit-graphs`: the padded path compiled with `mode="reduce-overhead"` (CUDA graphs: one
  launch a step instead of hundreds, the lever for small models);
- `bertkit-graphs-unpadded`: the unpadded path (host layouts) with CUDA graphs, its row counts
  rounded up to `--graph-rows` (padding cells computed as rows; `BertModel.rows_rounded_to`):
  a graph for each of the few row counts, for a step whose host cannot launch its kernels as
  fast as the card runs them;
- `bertkit-tuned`: `bertkit-compiled` with inductor's coordinate-descent tuning of its
  pointwise and reduction kernels; `bertkit-autotuned`: compiled in `max-autotune-no-cudagraphs`
  mode (the matrix products autotuned against Triton's templates too); `bertkit-eager-rng`:
  compiled with inductor's `fallback_random`, the dropout masks drawn by torch's own kernels
  (Philox, four numbers a call) instead of Triton's `tl.rand` in the fused kernels (one number
  of four a call);
- `transformers`, `transformers-compiled`: transformers' class of the same name (SDPA
  attention, logits at every position) from the same initial weights, fused AdamW.

Model FLOPs of a step = 3 x the forward's (the backward is twice the forward): per real token
and layer 24 H^2 (the dense layers: 6 x the non-embedding parameters per token over the three
passes) + 4 S H (attention's two S x S products), plus at each masked position the MLM head's
2 H^2 + 2 V H (a QA head: 4 H a token). MFU = those FLOPs / the step's seconds / the card's dense
bf16 peak (H100 and H200 SXM: 989 TFLOP/s; A100: 312; `--peak` for another card or the CPU).
Padding counts for nothing: a padded implementation's extra work is not useful work. That is
the strict count (`mfu`). Beside it, `mfu_common`: the count of NVIDIA's and Megatron's
formulas, every position of the batch (padding included) through every layer, and the MLM head
with the vocabulary projection at every position, (24 L H^2 + 4 L S H + 2 H^2 + 2 V H) a
position, times 3; both are printed, named, side by side.

A variant that fails to build or to run its warm-up prints its error and is left out; the
others are still timed. `--profile VARIANT...` profiles 3 steps of each named variant after the
timed rounds: the 12 operators and the 30 kernels with the most device time, the device ms a step
of each kind of kernel (matrix products, attention, inductor's pointwise and reduction kernels,
the optimiser, copies), and `gpu_busy`, the kernels' summed time over the steps' wall time (well
under 1: the card waits on the host, launches or syncs).

`data_ms`: the host time `PretrainingData.next_batch` takes a step (the loop makes batches
between steps, so this is the time the card waits per step unless it is hidden).
"""

from __future__ import annotations

import json
import re
import statistics
import time
from pathlib import Path

import torch
from _args import arguments
from _harness import TransformersHead, transformers_copy
from machine import describe

from bertkit import BertConfig, BertForPreTraining, BertForQuestionAnswering
from bertkit.core.tokenizer import BertTokenizer
from bertkit.pretraining.dataset import PretrainingData
from bertkit.pretraining.shards import Shards
from bertkit.pretraining.train import PretrainingObjective
from bertkit.training.optim import ADAM_EPSILON, OptimConfig, build_optimizer, parameter_groups

PEAKS = {"H100": 989e12, "H200": 989e12, "GH200": 989e12, "A100": 312e12, "L40S": 362e12}


def card_peak(device: torch.device, given: float | None) -> float | None:
    """The dense bf16 peak in FLOP/s: `given` (TFLOP/s), else the card's by its name."""
    if given:
        return given * 1e12
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, peak in PEAKS.items():
            if key in name:
                return peak
    return None


def pretraining_batches(args, tokenizer, seq_len: int, batch: int) -> tuple[list, list[float]]:
    stream = PretrainingData(Shards(args.data), tokenizer, batch_size=batch, seq_len=seq_len)
    stream.next_batch()  # (the first opens the shards: not a step's cost)
    batches, seconds = [], []
    for _ in range(args.steps):
        started = time.perf_counter()
        batches.append(stream.next_batch())
        seconds.append(time.perf_counter() - started)
    return batches, seconds


def squad_batches(args, vocab: int, seq_len: int, batch: int) -> list:
    generator = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(args.steps):
        ids = torch.randint(1000, vocab, (batch, seq_len), generator=generator)
        types = torch.zeros_like(ids)
        types[:, 24:] = 1  # a question of 24 pieces, then the paragraph
        start = torch.randint(24, seq_len - 8, (batch,), generator=generator)
        batches.append(
            {"input_ids": ids, "token_type_ids": types, "attention_mask": torch.ones_like(ids),
             "start_positions": start, "end_positions": start + 3}
        )  # fmt: skip
    return batches


def step_flops(config: BertConfig, batches: list, squad: bool) -> float:
    """Model FLOPs of a step, averaged over `batches` (the module doc's formula)."""
    hidden, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    total = 0.0
    for batch in batches:
        real = float(batch["attention_mask"].sum())
        length = batch["input_ids"].shape[1]
        forward = real * layers * (24 * hidden**2 + 4 * length * hidden)
        if squad:
            forward += real * 4 * hidden
        else:
            masked = float((batch["labels"] != -100).sum())
            forward += masked * (2 * hidden**2 + 2 * vocab * hidden)
        total += 3 * forward
    return total / len(batches)


def step_flops_common(config: BertConfig, batches: list, squad: bool) -> float:
    """Model FLOPs of a step as NVIDIA's and Megatron's formulas count them: every position of
    the batch (padding too), the MLM head and the vocabulary projection at every position."""
    hidden, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    total = 0.0
    for batch in batches:
        rows, length = batch["input_ids"].shape
        head = 4 * hidden if squad else 2 * hidden**2 + 2 * vocab * hidden
        total += 3 * rows * length * (layers * (24 * hidden**2 + 4 * length * hidden) + head)
    return total / len(batches)


def build(variant: str, config: BertConfig, squad: bool, tokenizer, device, graph_rows: int):
    """(the model the step calls, the optimiser) of a variant, from the same initial weights."""
    torch.manual_seed(0)
    ours = (BertForQuestionAnswering if squad else BertForPreTraining)(config).train()
    if variant.startswith("transformers"):
        model = TransformersHead(ours) if squad else transformers_copy(config, ours.state_dict(),
                                                                       tokenizer)  # fmt: skip
        model = model.to(device).train()
        hf_config = model.hf.config
        print(f"{variant}: attention {getattr(hf_config, '_attn_implementation', '?')}", flush=True)
        groups = parameter_groups(model, 0.01)
        optimizer = torch.optim.AdamW(groups, lr=1e-4, eps=ADAM_EPSILON, fused=True)
    else:
        model = ours.to(device)
        if variant.startswith("bertkit-padded") or variant == "bertkit-graphs":
            encode = model.bert.forward
            model.bert.forward = lambda *a, **k: encode(*a, **{**k, "unpad": False})
        optimizer = build_optimizer(model, OptimConfig(learning_rate=1e-4))
    # the loop's unpadded variants take their layouts from the host (`step`)
    model.host_planned = variant in ("bertkit", "bertkit-compiled", "bertkit-graphs-unpadded",
                                     *TUNED)  # fmt: skip
    if variant.endswith("compiled"):
        model.compile()
    elif variant == "bertkit-graphs":
        model.compile(mode="reduce-overhead")
    elif variant == "bertkit-graphs-unpadded":
        model.bert.rows_rounded_to = graph_rows
        model.compile(mode="reduce-overhead")
    elif variant in TUNED:
        model.compile(**TUNED[variant])
    return model, optimizer


# inductor's own searches, each a variant of `bertkit-compiled` (longer compiles, timed apart):
# pointwise and reduction kernels' launch settings searched (on the H200 the fused dropout +
# residual + LayerNorm kernels took 175 us each for 28.7k x 768 rows, where one pass over them
# in bf16 takes about 9 us), and the matrix products autotuned against Triton's templates too
TUNED: dict[str, dict] = {
    "bertkit-tuned": {"options": {"coordinate_descent_tuning": True,
                                  "max_autotune_pointwise": True}},
    "bertkit-autotuned": {"mode": "max-autotune-no-cudagraphs"},
    # (the H200's fused dropout + residual + LayerNorm forward: 173 us for 28.7k x 768 rows at
    # base, where eager's dropout kernel alone took 30 us for 16.8M elements at large/512)
    "bertkit-eager-rng": {"options": {"fallback_random": True}},
}  # fmt: skip


def compiled_graphs() -> tuple[int, int]:
    """(graph breaks, graphs compiled) so far in this process, by dynamo's counters: a break or
    a recompile in the timed rounds makes a compiled variant's figure a compiler's (a 2-step
    dry run of a broken graph took 4.1 s a step against 40 ms)."""
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values()), counters["stats"]["unique_graphs"]


# a kernel's kind by its name (cuBLAS' nvjet/cutlass/gemm, cuDNN's and flash's attention,
# inductor's Triton kernels by their template: pointwise, persistent and looped reductions)
# (Triton's names first: a fused kernel's name lists the operators it fused, `addmm` among them)
KERNEL_KINDS = (
    ("matmul", re.compile(r"^triton_tem|nvjet|gemm|cutlass|xmma|cublas", re.I)),
    ("triton_pointwise", re.compile(r"^triton_poi")),
    ("triton_reduction", re.compile(r"^triton_(per|red)")),
    ("attention", re.compile(r"sdpa|flash|fmha|attention|attn", re.I)),
    ("optimizer", re.compile(r"multi_tensor|adam|foreach", re.I)),
    ("copy_fill", re.compile(r"memcpy|memset|copy|fill", re.I)),
)


def kernel_kind(name: str) -> str:
    return next((kind for kind, pattern in KERNEL_KINDS if pattern.search(name)), "other")


def kernel_breakdown(kernels: list, steps: int, top: int = 30) -> dict[str, float]:
    """Device ms a step by kernel kind (printed with the `top` kernels by time): where the step
    goes beyond the matrix products."""
    by_name: dict[str, list[float]] = {}
    for event in kernels:
        by_name.setdefault(event.name, []).append(event.time_range.elapsed_us() / 1000 / steps)
    kinds: dict[str, float] = {}
    for name, times in by_name.items():
        kind = kernel_kind(name)
        kinds[kind] = kinds.get(kind, 0.0) + sum(times)
    ranked = sorted(by_name.items(), key=lambda item: -sum(item[1]))
    print(f"{'kernel (device ms a step, launches a step, kind)':>60}", flush=True)
    for name, times in ranked[:top]:
        print(f"{name[:100]:100s} {sum(times):8.3f} {len(times) / steps:6.1f}  "
              f"{kernel_kind(name)}", flush=True)  # fmt: skip
    print("by kind (ms a step): " + ", ".join(f"{kind} {ms:.2f}" for kind, ms in
                                               sorted(kinds.items(), key=lambda k: -k[1])))  # fmt: skip
    return {kind: round(ms, 3) for kind, ms in kinds.items()}


def profile(step, setup, steps: int, device: torch.device) -> dict:
    """Kernels of `steps` steps: the top 12 operators by device time and the top kernels by kind
    (printed), the busy share and the device ms a step of each kind."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=activities) as prof:
        started = time.perf_counter()
        for i in range(steps):
            step(*setup, i)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - started
    events = prof.key_averages()
    # device time: the kernels' and copies' own events (an operator's device time repeats its
    # kernels'), on one stream: their sum over the wall time is the share the card is busy
    # (not the ranges user annotations draw on the device's timeline, `Optimizer.step#AdamW.step`
    # among them: they span kernels already counted; the 2026-11-27 21:38 profiles counted them)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and not getattr(e, "is_user_annotation", False)]  # fmt: skip
    busy = sum(e.time_range.elapsed_us() for e in kernels) / 1e6
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(events.table(sort_by=key, row_limit=12), flush=True)
    kinds = kernel_breakdown(kernels, steps) if kernels else None
    return {"gpu_busy": round(busy / wall, 3) if device.type == "cuda" else None,
            "profiled_step_ms": round(1000 * wall / steps, 2), "kernel_ms_by_kind": kinds}  # fmt: skip


def run_case(args, case: str, device: torch.device) -> list[dict]:
    name, seq_len, batch = case.split(":")
    seq_len, batch = int(seq_len), int(batch)
    squad = name.startswith("squad-")
    tokenizer = BertTokenizer.from_pretrained(args.data)
    config = BertConfig.from_preset(name.removeprefix("squad-"), vocab_size=tokenizer.vocab_size)
    config = config.with_labels(2) if squad else config
    data_seconds: list[float] = []
    if squad:
        batches = squad_batches(args, tokenizer.vocab_size, seq_len, batch)
    else:
        batches, data_seconds = pretraining_batches(args, tokenizer, seq_len, batch)
    batches = [{k: v.pin_memory() if device.type == "cuda" else v for k, v in b.items()}
               for b in batches]  # fmt: skip
    flops = step_flops(config, batches, squad)
    common = step_flops_common(config, batches, squad)
    tokens = sum(float(b["attention_mask"].sum()) for b in batches) / len(batches)
    objective = PretrainingObjective("mlm+nsp")
    totals = [None if squad else objective.counts(b).double() for b in batches]
    bf16 = args.precision == "bf16"

    def step(model, optimizer, i: int) -> None:
        batch = {k: v.to(device, non_blocking=True) for k, v in batches[i].items()}
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            if getattr(model, "host_planned", False):  # as the loop does (Trainer)
                batch["layouts"] = model.host_layouts(batches[i], device)
            if squad:
                loss = model(**batch).loss
            else:
                total = totals[i]
                assert total is not None
                loss, _ = objective.loss(model, batch, total.to(device))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    setups, first, breaks = {}, {}, {}
    for variant in args.variants:
        started = time.perf_counter()
        before = compiled_graphs()
        try:
            model, optimizer = build(variant, config, squad, tokenizer, device, args.graph_rows)
            started = time.perf_counter()
            # every batch once: compilation of each shape (and the dynamic-shape graph that a
            # second shape brings), cuBLAS's and cuDNN's choices, the caching allocator's pools
            for i in range(len(batches)):
                step(model, optimizer, i)
            sync()
        except Exception as err:  # one variant's failure leaves the others' figures
            print(f"{case} {variant}: FAILED after {time.perf_counter() - started:.1f} s: "
                  f"{type(err).__name__}: {str(err)[:2000]}", flush=True)  # fmt: skip
            continue
        first[variant] = time.perf_counter() - started
        setups[variant] = (model, optimizer)
        breaks[variant] = compiled_graphs()[0] - before[0]
        print(f"{case} {variant}: warm-up ({len(batches)} steps) {first[variant]:.1f} s"
              + (f", {breaks[variant]} graph breaks" if breaks[variant] else ""), flush=True)  # fmt: skip
    times: dict[str, list[float]] = {v: [] for v in setups}
    late = dict.fromkeys(setups, 0)  # graphs compiled during the timed rounds
    for _ in range(args.rounds):  # alternated: a card's clock drift hits every variant alike
        for variant, (model, optimizer) in setups.items():
            sync()
            graphs = compiled_graphs()[1]
            started = time.perf_counter()
            for i in range(len(batches)):
                step(model, optimizer, i)
            sync()
            times[variant].append((time.perf_counter() - started) / len(batches))
            late[variant] += compiled_graphs()[1] - graphs
    for variant in (v for v in late if late[v]):  # its time is not a step's
        print(f"{case} {variant}: COMPILED {late[variant]} graphs during the timed rounds: "
              "its time includes compiling", flush=True)  # fmt: skip
    peak = card_peak(device, args.peak)
    memory = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    rows = []
    reference = statistics.median(next(iter(times.values())))
    first_variant = next(iter(times))
    profiles = {}
    for variant in (v for v in args.profile if v in setups):
        try:
            profiles[variant] = profile(step, setups[variant], min(3, len(batches)), device)
        except Exception as err:  # the timings stand without it
            print(f"{case} {variant}: profile failed: {type(err).__name__}: {err}", flush=True)
    for variant, values in times.items():
        seconds = statistics.median(values)
        row = {
            "case": case, "variant": variant, "precision": args.precision,
            "step_ms": round(1000 * seconds, 2), "steps_ms": [round(1000 * v, 2) for v in values],
            "seq_per_s": round(batch / seconds, 1), "tokens_per_s": round(tokens / seconds),
            "real_tokens_per_step": round(tokens), "model_tflop_per_step": round(flops / 1e12, 4),
            "model_tflops": round(flops / seconds / 1e12, 2),
            "mfu": round(flops / seconds / peak, 4) if peak else None,
            "mfu_common": round(common / seconds / peak, 4) if peak else None,
            "peak_tflops": peak / 1e12 if peak else None,
            "speed_vs_first": round(reference / seconds, 3), "warmup_s": round(first[variant], 2),
            "data_ms": round(1000 * statistics.median(data_seconds), 2) if data_seconds else None,
            "max_memory_gib": round(memory, 2) if memory else None,
            "graph_breaks": breaks[variant], "graphs_compiled_while_timed": late[variant],
            **profiles.get(variant, {}),
        }  # fmt: skip
        rows.append(row)
        mfu = (f", MFU {row['mfu']:.1%} strict, {row['mfu_common']:.1%} common" if row["mfu"]
               else "")  # fmt: skip
        print(f"{case} {variant:22s} {row['step_ms']:9.2f} ms a step, {row['seq_per_s']:9.1f} "
              f"seq/s, {row['tokens_per_s']:>11,} tokens/s{mfu}, {row['speed_vs_first']:.2f}x "
              f"{first_variant}", flush=True)  # fmt: skip
    for model, optimizer in setups.values():
        del model, optimizer
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return rows


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--data", required=True, help="shards (bertkit prepare) with their vocab")
    parser.add_argument("--case", nargs="+", required=True, help="MODEL:SEQ_LEN:BATCH ...")
    parser.add_argument("--variants", nargs="+", default=["bertkit", "transformers"])
    parser.add_argument("--steps", type=int, default=8, help="batches, each step of a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--peak", type=float, help="dense bf16 TFLOP/s of the device")
    parser.add_argument("--profile", nargs="*", default=[], help="variants to profile")
    parser.add_argument("--graph-rows", type=int, default=512,
                        help="bertkit-graphs-unpadded: row counts rounded up to this")  # fmt: skip
    parser.add_argument("--out", help="append the rows to this JSON-lines file")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 runs: what a GPU user gets
        torch.backends.cudnn.allow_tf32 = True
    machine = describe()
    print(json.dumps(machine), flush=True)
    for case in args.case:
        rows = run_case(args, case, device)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            with open(args.out, "a") as out:
                for row in rows:
                    out.write(json.dumps({**row, "machine": machine}) + "\n")


if __name__ == "__main__":
    main()
