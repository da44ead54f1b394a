"""One sequence's attention on its own rows (no padding), three ways, by length: bertkit's
by-sequence body (`TokenLayout.attend`: scores and softmax in fp32 from bf16 queries and keys,
the weighted sum in bf16), SDPA's flash kernel on the bf16 inputs, and SDPA on them cast to fp32.
12 heads of 32 (all-MiniLM-L6-v2's); microseconds a sequence, alternated round by round,
medians; each way's largest difference from an fp64 reference. What kernel the rows' attention
could take under bf16.

    python benchmarks/attention_kernels.py [--lengths 32 64 128 180 256] [--rounds 7]
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from _args import arguments
from _harness import add_timing_arguments, alternate, emit, medians, start

HEADS, SIZE = 12, 32


def by_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """`TokenLayout.attend`'s body for one sequence: (A, n, D) in, (A, n, D) out."""
    with torch.autocast("cpu", enabled=False):
        probs = torch.bmm(q.float() * scale, k.float().transpose(1, 2)).softmax(dim=-1)
        return torch.bmm(probs.to(v.dtype), v)


def sdpa_bf16(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    return F.scaled_dot_product_attention(q[None], k[None], v[None], scale=scale)[0]


def sdpa_fp32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    q, k, v = (t.float()[None] for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, scale=scale)[0].to(torch.bfloat16)


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 64, 128, 180, 256])
    parser.add_argument("--calls", type=int, default=50, help="calls a round")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    add_timing_arguments(parser, rounds=7, threads=2)
    args = parser.parse_args()
    machine = start(args)
    print(machine)
    ways = {"bertkit by sequence": by_sequence, "SDPA bf16": sdpa_bf16, "SDPA fp32": sdpa_fp32}
    report: dict = {"machine": machine, "heads": HEADS, "head_size": SIZE, "lengths": {}}
    print("| pieces | " + " | ".join(f"{name} (us)" for name in ways) + " | largest difference |")
    print("|---:|" + "---:|" * len(ways) + "---|")
    generator = torch.Generator().manual_seed(0)
    scale = SIZE**-0.5
    for n in args.lengths:
        q, k, v = (torch.randn(HEADS, n, SIZE, generator=generator).bfloat16() for _ in range(3))
        probs = (q.double() @ k.double().transpose(1, 2) * scale).softmax(-1)
        reference = probs @ v.double()
        errors = {name: float((way(q, k, v, scale).double() - reference).abs().max())
                  for name, way in ways.items()}  # fmt: skip
        inputs = (q, k, v, scale)
        runners = {
            name: (lambda way=way, inputs=inputs: way(*inputs)) for name, way in ways.items()
        }
        times = medians(alternate(runners, args.rounds, args.calls))
        report["lengths"][n] = {"us": {k_: t * 1e6 for k_, t in times.items()}, "error": errors}
        cells = " | ".join(f"{times[name] * 1e6:.0f}" for name in ways)
        spread = ", ".join(f"{e:.1e}" for e in errors.values())
        print(f"| {n} | {cells} | {spread} |", flush=True)
    emit(report, args.out)


if __name__ == "__main__":
    main()
