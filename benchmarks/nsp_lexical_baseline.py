"""How much next-sentence signal a pre-training stream holds, without any model: the word
overlap of segments A and B, thresholded. A real continuation shares names and topic words with
A; a random B from another document rarely does. If this baseline is well above 50%, the NSP
labels are right and learnable, and an NSP accuracy at chance is the model's (too little
training), not the data's.

    BERTKIT_DATA=../shared/data python benchmarks/nsp_lexical_baseline.py \\
        --data runs/pretrain_bench/data/AB --batches 200

Reads the stream `bertkit pretrain` evaluates on (same class, same masking: only the tokens the
model sees count, [MASK] and special tokens excluded). The idf weights and the threshold are
fitted on the first half of the instances and scored on the second half.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
from _args import arguments

from bertkit import BertTokenizer
from bertkit.pretraining.dataset import PretrainingData
from bertkit.pretraining.shards import Shards


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--data", required=True, help="a shard directory (bertkit prepare)")
    parser.add_argument("--vocab", help="default: the vocab.txt prepare wrote beside the shards")
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    shards = Shards(args.data)
    tokenizer = BertTokenizer.from_pretrained(args.vocab or args.data)
    stream = PretrainingData(
        shards, tokenizer, batch_size=args.batch_size, seq_len=args.seq_len, seed=args.seed
    )
    special = {tokenizer.vocab[t] for t in ("[CLS]", "[SEP]", "[PAD]", "[MASK]")}
    pairs, labels = [], []
    for _ in range(args.batches):
        batch = stream.next_batch()
        for ids, segments, mask, label in zip(
            batch["input_ids"].tolist(),
            batch["token_type_ids"].tolist(),
            batch["attention_mask"].tolist(),
            batch["next_sentence_label"].tolist(),
            strict=True,
        ):
            seen = [(t, s) for t, s, m in zip(ids, segments, mask, strict=True) if m]
            a = {t for t, s in seen if s == 0 and t not in special}
            b = {t for t, s in seen if s == 1 and t not in special}
            pairs.append((a, b))
            labels.append(label)
    labels = np.asarray(labels)  # 0 = IsNext, 1 = NotNext (Google's and transformers' order)
    half = len(pairs) // 2
    documents = Counter(t for a, b in pairs[:half] for t in a | b)
    idf = {t: math.log(2 * half / (1 + n)) for t, n in documents.items()}
    unseen = math.log(2 * half)

    def score(a: set, b: set) -> float:  # idf-weighted overlap, as a fraction of B's weight
        weight = sum(idf.get(t, unseen) for t in b)
        return sum(idf.get(t, unseen) for t in a & b) / weight if weight else 0.0

    scores = np.asarray([score(a, b) for a, b in pairs])
    fit, test = slice(0, half), slice(half, None)
    candidates = np.unique(scores[fit])
    accuracy = [np.mean((scores[fit] < c) == labels[fit].astype(bool)) for c in candidates]
    threshold = candidates[int(np.argmax(accuracy))]
    held_out = np.mean((scores[test] < threshold) == labels[test].astype(bool))
    print(
        f"{len(pairs)} instances from {args.data}: {100 * labels.mean():.1f}% NotNext; "
        f"mean overlap IsNext {scores[labels == 0].mean():.3f}, NotNext "
        f"{scores[labels == 1].mean():.3f}; threshold {threshold:.3f} fitted on {half}, "
        f"NSP accuracy on the other {len(pairs) - half}: {100 * held_out:.1f}%"
    )


if __name__ == "__main__":
    main()
