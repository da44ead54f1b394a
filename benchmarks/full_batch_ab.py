"""A batch without padding (SQuAD's full windows): bertkit's unpadded path keeps the grid and
gives attention no mask, against what it did before (every cell gathered as a row, an all-True
mask to SDPA). A QA training step (forward and backward) of a MiniLM-size model (L6, H384, 12
heads) on a full 8 x 384 batch, both alternated round by round; the old path is the layout
with an index of every cell, which `TokenLayout.unpadded` gave before.

    python benchmarks/full_batch_ab.py [--rounds 6] [--threads 2]
"""

from __future__ import annotations

import torch
from _args import arguments
from _harness import add_timing_arguments, alternate, medians, ratios, start

import bertkit.core.model as model_module
from bertkit import BertConfig, BertForQuestionAnswering
from bertkit.core.unpad import TokenLayout

NOW = TokenLayout.unpadded


def every_cell(attention_mask, multiple=1, parity=False):  # the layout before the change
    index = attention_mask.reshape(-1).nonzero().squeeze(1)
    return TokenLayout(attention_mask.shape[0], attention_mask.shape[1], index, None, parity)


def main() -> None:
    parser = arguments(__doc__)
    add_timing_arguments(parser, rounds=6, threads=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=384)
    args = parser.parse_args()
    machine = start(args)
    config = BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6,
                        num_attention_heads=12, intermediate_size=1536).with_labels(2)  # fmt: skip
    torch.manual_seed(0)
    model = BertForQuestionAnswering(config).train()
    ids = torch.randint(1000, 30000, (args.batch, args.length))
    start_at = torch.randint(24, args.length - 8, (args.batch,))
    batch = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids),
             "attention_mask": torch.ones_like(ids), "start_positions": start_at,
             "end_positions": start_at + 3}  # fmt: skip

    def step(layout, bf16: bool):
        def run() -> None:
            model_module.TokenLayout.unpadded = layout
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = model(**batch).loss
            loss.backward()
            model.zero_grad(set_to_none=True)

        return run

    for bf16 in (False, True):
        runners = {
            "every cell, masked": step(every_cell, bf16),
            "the grid, no mask": step(NOW, bf16),
        }
        for run in runners.values():  # warm-up
            run()
        times = alternate(runners, args.rounds)
        seconds, speed = medians(times), ratios(times, "every cell, masked")
        print(f"{'bf16' if bf16 else 'fp32'}, QA step {args.batch} x {args.length}, {machine}")
        for name in runners:
            print(f"  {name:20s} {1000 * seconds[name]:8.1f} ms  {speed[name]:.2f}x")
    model_module.TokenLayout.unpadded = NOW


if __name__ == "__main__":
    main()
