"""ModernBERT on long inputs: bertkit against transformers' own ModernBERT (sdpa), time and memory.

    python benchmarks/modernbert_long.py --lengths 2048 8192 --rounds 3 \
        --out docs/results/family/modernbert_long.json

A ModernBERT of base size (22 layers, hidden 768, intermediate 1152, 12 heads, a 128-piece
window on two layers of three, 8,192 positions) with random weights, saved by transformers and
loaded by both. Each side runs in a process of its own (so each one's peak memory is its own):
an inference-mode forward of one input of each length, once to warm up, then `--rounds` timed;
bertkit at its default precision (`auto`), transformers in fp32 (and bf16 autocast where the
CPU runs it natively). Printed per length: seconds per forward (median) and the process's peak
resident memory, with the machine's line.

`--mixed N` makes each forward a batch: the input of that length and N of an eighth of it
(padded to the longest, as a batch of documents comes), and adds bertkit with its attention on
the padded grid (`attention_by_sequence` off: how it ran before attention went sequence by
sequence for ModernBERT):

    python benchmarks/modernbert_long.py --lengths 2048 --mixed 7 --rounds 3 \
        --out docs/results/family/modernbert_mixed.json

`--sides bertkit` runs bertkit alone; `--sdpa-from N` sets from how many keys a sequence
attends through SDPA's kernel rather than with its scores held (`core.unpad.SDPA_FROM`):

    python benchmarks/modernbert_long.py --lengths 8192 --mixed 1 --rounds 2 --sides bertkit \
        --sdpa-from 1000000 --out docs/results/family/modernbert_scores_held.json
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _args import arguments
from _harness import emit, start

CHILD = r"""
import json, resource, sys, time, torch
side, folder, length, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
mixed, sdpa_from = int(sys.argv[5]), int(sys.argv[6])
torch.manual_seed(0)
ids = torch.randint(5, 50000, (1 + mixed, length))
mask = torch.ones_like(ids)
mask[1:, length // 8 :] = 0
ids[mask == 0] = 50283
if side.startswith("bertkit"):
    from bertkit.core import unpad
    from bertkit.core.model import BertModel
    unpad.SDPA_FROM = sdpa_from or unpad.SDPA_FROM
    from bertkit.precision import cast_for_inference, resolve_precision
    model = BertModel.from_pretrained(folder).eval()
    model.attention_by_sequence = side == "bertkit"
    precision = resolve_precision("auto", torch.device("cpu"))
    cast_for_inference(model, precision)
    dtype = precision.dtype
    name = f"bertkit ({precision.name})" + (", attention on the grid" if side != "bertkit" else "")
    def run():
        with torch.inference_mode(), torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            model(ids, None, mask, unpad=True)
else:
    import transformers
    model = transformers.AutoModel.from_pretrained(folder, attn_implementation="sdpa").eval()
    bf16 = side == "transformers-bf16"
    name = "transformers (" + ("bf16 autocast" if bf16 else "fp32") + ")"
    def run():
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            model(input_ids=ids, attention_mask=mask)
run()
times = []
for _ in range(rounds):
    started = time.perf_counter()
    run()
    times.append(time.perf_counter() - started)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"side": name, "seconds": times, "peak_mib": peak}))
"""


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--mixed",
        type=int,
        default=0,
        help="N inputs of an eighth of the length beside each long one",
    )
    parser.add_argument(
        "--sides", nargs="+", help="only these (bertkit, transformers, bertkit-grid)"
    )
    parser.add_argument(
        "--sdpa-from", type=int, default=0, help="bertkit's unpad.SDPA_FROM (default: its own)"
    )
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    machine = start(args)
    import torch
    import transformers

    from bertkit.precision import resolve_precision

    config = transformers.ModernBertConfig(
        vocab_size=50368, hidden_size=768, intermediate_size=1152, num_hidden_layers=22,
        num_attention_heads=12, max_position_embeddings=8192, local_attention=128,
        pad_token_id=50283, bos_token_id=50281, eos_token_id=50282, cls_token_id=50281,
        sep_token_id=50282,
    )  # fmt: skip
    folder = Path(tempfile.mkdtemp(prefix="bertkit-modernbert-"))
    torch.manual_seed(0)
    transformers.ModernBertModel(config).eval().save_pretrained(folder)
    sides = ["bertkit", "transformers"] + (["bertkit-grid"] if args.mixed else [])
    sides = [side for side in sides if not args.sides or side in args.sides]
    if resolve_precision("auto", torch.device("cpu")).name == "bf16":
        sides.append("transformers-bf16")
    report: dict = {"machine": machine, "model": "ModernBERT base size, random weights",
                    "mixed": args.mixed, "sdpa_from": args.sdpa_from or None,
                    "lengths": {}}  # fmt: skip
    for length in args.lengths:
        figures = {}
        for side in sides:
            command = [
                sys.executable,
                "-c",
                CHILD,
                side,
                str(folder),
                str(length),
                str(args.rounds),
                str(args.mixed),
                str(args.sdpa_from),
            ]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            result = json.loads(done.stdout.strip().splitlines()[-1])
            figures[result["side"]] = {"seconds": statistics.median(result["seconds"]),
                                       "rounds": result["seconds"], "peak_mib": result["peak_mib"]}  # fmt: skip
            print(length, result["side"], f"{figures[result['side']]['seconds']:.2f} s",
                  f"{result['peak_mib']:.0f} MiB", flush=True)  # fmt: skip
        report["lengths"][str(length)] = figures
    emit(report, args.out)


if __name__ == "__main__":
    main()
