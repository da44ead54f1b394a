"""How fast gradient descent learns to predict a piece from its two neighbours on Wikipedia:
a floor for what masked LM needs, without attention having to find the neighbours.

    python benchmarks/neighbour_model.py --train runs/data/AA --held-out runs/data/AB

The model: h = LayerNorm(GELU(W [E[left]; E[right]] + b)), logits = h E^T + bias, the pieces'
embeddings E (V x 128) tied as in BERT, the bias started at the log unigram; Adam (lr 2e-3 after
10% warm-up, linear decay, beta2 0.98), 640 targets a step (BERT-tiny's 32 sequences x 20 masked
pieces), neighbours unmasked. Held-out accuracy and cross-entropy on 20,000 AB positions.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from _args import arguments
from torch import nn

from bertkit.pretraining.shards import Shards


class Neighbours(nn.Module):
    def __init__(self, vocab: int, width: int, unigram: torch.Tensor) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        nn.init.trunc_normal_(self.embed.weight, std=0.02, a=-0.04, b=0.04)
        self.mix = nn.Linear(2 * width, width)
        nn.init.trunc_normal_(self.mix.weight, std=0.02, a=-0.04, b=0.04)
        nn.init.zeros_(self.mix.bias)
        self.norm = nn.LayerNorm(width)
        self.bias = nn.Parameter(unigram.clone())

    def forward(self, left, right):
        h = self.norm(F.gelu(self.mix(torch.cat([self.embed(left), self.embed(right)], -1))))
        return h @ self.embed.weight.T + self.bias


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--train", required=True)
    parser.add_argument("--held-out", required=True)
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--batch", type=int, default=640)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--eval-every", type=int, default=200)
    args = parser.parse_args()
    torch.manual_seed(0)
    train = np.concatenate([np.asarray(t) for t in Shards(args.train).tokens]).astype(np.int64)
    held = np.concatenate([np.asarray(t) for t in Shards(args.held_out).tokens]).astype(np.int64)
    vocab = 30522
    counts = np.bincount(train, minlength=vocab) + 0.5
    unigram = torch.tensor(np.log(counts / counts.sum()), dtype=torch.float32)
    model = Neighbours(vocab, 128, unigram)
    opt = torch.optim.AdamW(
        model.parameters(), lr=args.lr, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01
    )
    warm = args.steps // 10
    rng = np.random.default_rng(0)
    where = torch.from_numpy(rng.choice(np.arange(1, len(held) - 1), 20_000, replace=False))
    held_t = torch.from_numpy(held)
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        scale = step / warm if step <= warm else (args.steps - step) / (args.steps - warm)
        for group in opt.param_groups:
            group["lr"] = args.lr * max(scale, 1e-3)
        at = torch.from_numpy(rng.integers(1, len(train) - 1, args.batch))
        left, mid, right = (torch.from_numpy(train)[at + d] for d in (-1, 0, 1))
        loss = F.cross_entropy(model(left, right), mid)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % args.eval_every == 0 or step == args.steps:
            with torch.no_grad():
                logits = model(held_t[where - 1], held_t[where + 1])
                ce = F.cross_entropy(logits, held_t[where]).item()
                acc = (logits.argmax(-1) == held_t[where]).float().mean().item()
            print(
                f"step {step:5d} ({step * args.batch / 1e6:.2f}M targets, "
                f"{time.perf_counter() - started:.0f} s): held-out accuracy {acc:.2%}, "
                f"cross-entropy {ce:.3f} (ppl {math.exp(ce):.0f})",
                flush=True,
            )


if __name__ == "__main__":
    main()
