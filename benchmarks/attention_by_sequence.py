"""Inference attention on the CPU, two ways, by grid width: SDPA on the padded (B, S) grid (the
rows scattered into it, the context gathered back: `BertLayer._grid_attention`), and sequence by
sequence on the unpadded rows (`TokenLayout.attend`). One layer's attention alone; 32 sequences of
S/2 to S tokens (one of S), 12 heads of 32 (all-MiniLM-L6-v2's); in bf16 (what autocast's linear
layers give it) and fp32; alternated round by round, medians. What `unpad.by_sequence_from`'s
widths come from. `--training`: forward and backward, attention dropout 0.1 (the grid then takes
the explicit product with bertkit's dropout masks, as the training loop does on the CPU), bf16
under autocast.

    python benchmarks/attention_by_sequence.py [--widths 16 32 64 128 256] [--rounds 7]
        [--training]
"""

from __future__ import annotations

import torch
from _args import arguments
from _harness import add_timing_arguments, alternate, medians, start

from bertkit.core.config import BertConfig
from bertkit.core.model import BertLayer
from bertkit.core.unpad import TokenLayout


def timed(layer: BertLayer, lengths: torch.Tensor, dtype: torch.dtype, rounds: int,
          generator: torch.Generator, training: bool = False) -> tuple[float, float]:  # fmt: skip
    """Median seconds of one attention on the grid and by sequence (`training`: forward and
    backward, with dropout)."""
    width = int(lengths.max())
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    by_sequence = TokenLayout.unpadded(mask, by_sequence=True)
    grid = TokenLayout.unpadded(mask)
    q, k, v = (torch.randn(by_sequence.rows, 384, generator=generator).to(dtype)
               .requires_grad_(training) for _ in range(3))  # fmt: skip
    bool_mask = mask.bool()[:, None, None, :]
    p = 0.1 if training else 0.0
    bf16 = dtype == torch.bfloat16
    layer.train(training)

    def run(attention) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16 and training):
            out = attention()
        if training:
            out.float().sum().backward()

    with torch.inference_mode(not training):
        times = alternate({
            "grid": lambda: run(lambda: layer._grid_attention(q, k, v, bool_mask, grid, p,
                                                              False)[0]),
            "by sequence": lambda: run(lambda: by_sequence.attend(q, k, v, 12, 32**-0.5, p)),
        }, rounds + 1)  # fmt: skip
    middle = medians({name: t[1:] for name, t in times.items()})  # round 1 warms up
    return middle["grid"], middle["by sequence"]


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--widths", type=int, nargs="+", default=[16, 32, 48, 64, 96, 128, 256])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--training", action="store_true", help="forward and backward")
    add_timing_arguments(parser, rounds=7, threads=2)
    args = parser.parse_args()
    machine = start(args)
    config = BertConfig.from_preset("tiny", vocab_size=100)
    config.hidden_size, config.num_attention_heads = 384, 12
    layer = BertLayer(config).eval()
    generator = torch.Generator().manual_seed(0)
    what = "forward and backward, dropout 0.1" if args.training else "inference"
    print(f"one layer's attention ({what}), {args.batch} sequences, 12 heads of 32, medians of "
          f"{args.rounds} alternated rounds; {machine}")  # fmt: skip
    print(f"{'dtype':9s} {'S':>4s} {'grid ms':>8s} {'by seq ms':>9s} {'grid / by seq':>13s}")
    for dtype in (torch.bfloat16, torch.float32):
        for width in args.widths:
            lengths = torch.randint(max(1, width // 2), width + 1, (args.batch,),
                                    generator=generator)  # fmt: skip
            lengths[0] = width
            a, b = timed(layer, lengths, dtype, args.rounds, generator, args.training)
            name = str(dtype).removeprefix("torch.")
            print(f"{name:9s} {width:4d} {a * 1e3:8.2f} {b * 1e3:9.2f} {a / b:13.2f}", flush=True)


if __name__ == "__main__":
    main()
