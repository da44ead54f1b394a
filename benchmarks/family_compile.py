"""`--compile on` for each family: the compiled encoder answers as the eager one, in one graph.

    BERTKIT_DATA=../shared/data python benchmarks/family_compile.py --rounds 5 \
        --out docs/results/family/compile.json

For every family bertkit reads, a small model (`family_forward.reference_models(small=True)`: 2
layers of H128 A4, ModernBERT 3 with a 16-piece window, random weights saved by transformers)
with a sequence classifier, compiled as `bertkit predict --compile on` and `bertkit serve
--compile on` compile it (`precision.compile_for_inference`: inductor, dynamic shapes, frozen
weights; the layouts computed on the host), run on batches of SST-2's lengths (mixed within a
batch, and a batch of one). Printed per family: the largest difference of its logits from the
eager model's, the graphs compiled and the graph breaks (each batch after the first two kinds
must compile nothing new), and milliseconds per batch compiled and eager (medians of alternated
rounds), with the machine's line. Compiling takes a minute or so a family on two cores.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from _args import arguments
from _harness import add_timing_arguments, alternate, emit, medians, start
from family_forward import batches, reference_models


def check(reference, args) -> dict:
    """One family's figures: its model compiled against eager."""
    from torch._dynamo.utils import counters

    from bertkit.core.heads import BertForSequenceClassification
    from bertkit.precision import compile_for_inference

    folder = Path(tempfile.mkdtemp(prefix="bertkit-compile-"))
    reference.eval().save_pretrained(folder)
    eager = BertForSequenceClassification.from_pretrained(folder, num_labels=3).eval()
    model = BertForSequenceClassification.from_pretrained(folder, num_labels=3).eval()
    model.load_state_dict(eager.state_dict())
    compiled = compile_for_inference(model)
    inputs = batches(args.batches, args.batch_size, reference.config.vocab_size)
    inputs.append((inputs[0][0][:1], inputs[0][1][:1]))  # a batch of one
    torch._dynamo.reset()
    counters.clear()

    def run(network, host: bool) -> list[torch.Tensor]:
        with torch.inference_mode():
            out = []
            for ids, mask in inputs:
                extra = {"layouts": model.host_layouts({"attention_mask": mask}, "cpu")}
                out.append(network(ids, attention_mask=mask, **(extra if host else {})).logits)
            return out

    got, want = run(compiled, True), run(eager, False)
    graphs = counters["stats"]["unique_graphs"]
    difference = max(float((a - b).abs().max()) for a, b in zip(got, want, strict=True))
    breaks = dict(counters["graph_break"])
    times = alternate({"compiled": lambda: run(compiled, True),
                       "eager": lambda: run(eager, False)}, args.rounds)  # fmt: skip
    per_batch = {name: 1000 * value / len(inputs) for name, value in medians(times).items()}
    return {"max_abs_difference": difference, "graphs": graphs, "graph_breaks": breaks,
            "graphs_after_warm": counters["stats"]["unique_graphs"] - graphs,
            "ms_per_batch": per_batch, "rounds_seconds": times}  # fmt: skip


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--families", nargs="+", help="only these (default: all)")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    add_timing_arguments(parser, rounds=5, threads=None)
    args = parser.parse_args()
    machine = start(args)
    report: dict = {"machine": machine, "batch_size": args.batch_size, "families": {}}
    for family, reference in reference_models(small=True):
        if args.families and family not in args.families:
            continue
        figures = report["families"][family] = check(reference, args)
        print(f"{family}: max |compiled - eager| {figures['max_abs_difference']:.1e}, "
              f"{figures['graphs']} graphs, breaks {figures['graph_breaks'] or 'none'}, "
              f"{figures['graphs_after_warm']} compiled after the first pass; "
              + ", ".join(f"{n} {v:.1f} ms" for n, v in figures["ms_per_batch"].items()),
              flush=True)  # fmt: skip
    emit(report, args.out)


if __name__ == "__main__":
    main()
