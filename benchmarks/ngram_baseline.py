"""How well counting neighbours predicts a masked piece: the reference for held-out MLM accuracy.

    python benchmarks/ngram_baseline.py --train runs/data/AA --held-out runs/data/AB

From the first N tokens of the training shards, count (left, right) -> middle, left -> next and
right -> previous; predict a held-out piece from both neighbours, backing off to the left one,
then the right one, then the most frequent piece. 50,000 held-out positions drawn at random
(neighbours unmasked: an upper bound for 15% masking). Also the unigram cross-entropy (nats) and
accuracy: what a model that ignores context scores on the all-[MASK] measure.
"""

from __future__ import annotations

import numpy as np
from _args import arguments

from bertkit.pretraining.shards import Shards


def best_by_context(keys: np.ndarray, targets: np.ndarray, vocab: int) -> dict[int, int]:
    """context key -> its most frequent target."""
    pairs, counts = np.unique(keys * vocab + targets, return_counts=True)
    context, target = pairs // vocab, pairs % vocab
    order = np.lexsort((-counts, context))
    context, target = context[order], target[order]
    first = np.r_[True, context[1:] != context[:-1]]
    return dict(zip(context[first].tolist(), target[first].tolist(), strict=True))


def tokens_of(shards: Shards) -> np.ndarray:
    return np.concatenate([np.asarray(t) for t in shards.tokens]).astype(np.int64)


def neighbour_accuracy(
    every: np.ndarray, held_tokens: np.ndarray, vocab: int, n: int, positions: int = 50_000
) -> float:
    """Held-out accuracy of the count table built from the first `n` training tokens (0: all),
    at `positions` held-out positions drawn with seed 0 (the same ones for every n)."""
    rng = np.random.default_rng(0)
    where = rng.choice(np.arange(1, len(held_tokens) - 1), positions, replace=False)
    t = every[:n] if n else every
    left = best_by_context(t[:-1], t[1:], vocab)
    right = best_by_context(t[1:], t[:-1], vocab)
    both = best_by_context(t[:-2] * vocab + t[2:], t[1:-1], vocab)
    top = int(np.bincount(t, minlength=vocab).argmax())
    hits = 0
    for i in where.tolist():
        a, b, y = int(held_tokens[i - 1]), int(held_tokens[i + 1]), int(held_tokens[i])
        guess = both.get(a * vocab + b)
        if guess is None:
            guess = left.get(a, right.get(b, top))
        hits += guess == y
    return hits / len(where)


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--train", required=True)
    parser.add_argument("--held-out", required=True)
    parser.add_argument("--tokens", type=int, nargs="+", default=[2_000_000, 8_000_000, 0])
    parser.add_argument("--positions", type=int, default=50_000)
    args = parser.parse_args()
    train, held = Shards(args.train), Shards(args.held_out)
    vocab = int(train.meta.get("vocab_size", 0)) or 30522
    every, held_tokens = tokens_of(train), tokens_of(held)
    counts = np.bincount(every, minlength=vocab) + 0.5
    logp = np.log(counts / counts.sum())
    held_counts = np.bincount(held_tokens, minlength=vocab)
    print(
        f"unigram: cross-entropy {-(held_counts * logp).sum() / held_counts.sum():.3f} nats, "
        f"accuracy {held_counts[counts.argmax()] / held_counts.sum():.2%}"
    )
    for n in args.tokens:
        accuracy = neighbour_accuracy(every, held_tokens, vocab, n, args.positions)
        print(f"counts from {n or len(every):,} tokens: neighbour model accuracy {accuracy:.2%}")


if __name__ == "__main__":
    main()
