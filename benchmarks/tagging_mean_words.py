"""Is it the per-word weighting? Bucketed (length-sorted) batches for token tagging, with every
batch's summed word loss divided by the *mean* labelled-word count of a batch instead of its own
count, so that every word weighs alike whatever the length of its batch.

    python benchmarks/tagging_mean_words.py runs/own_vs_user_conll5k   # after
    own_data_vs_transformers.py made RUN/data/{train,validation}.conll

Prints each seed's last-epoch entity F1 (seeds 42-44, bertkit's other defaults, MiniLM-L6);
compare with the bucketed and random rows of docs/results/own_data. The divisor is patched into
`TaskObjective.counts` for this process only: an experiment, not a setting.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import torch
from _args import arguments, minilm

from bertkit.core.tokenizer import BertTokenizer
from bertkit.finetuning.train import FinetuneConfig, TaskObjective, finetune
from bertkit.tasks import get_task
from bertkit.tasks.own import DataConfig


def main() -> None:
    parser = arguments(__doc__, model=True, out="runs/tagging_mean_words")
    parser.add_argument("run", type=Path, help="an own_data_vs_transformers.py --out folder")
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    args = parser.parse_args()
    model = args.model
    if model is None:
        model = minilm()
    data = DataConfig(train=str(args.run / "data" / "train.conll"),
                      validation=str(args.run / "data" / "validation.conll"))  # fmt: skip
    task = get_task("token-classification", data)
    examples = task.read(None, "train")
    task = task.fitted(examples)
    features = task.featurize(examples, BertTokenizer.from_pretrained(model), 128)
    words = sum(sum(1 for label in f["labels"] if label != -100) for f in features)
    mean = words / math.ceil(len(features) / 32)
    print(f"{words:,} labelled words, {mean:.1f} a batch of 32", flush=True)
    TaskObjective.counts = lambda self, batch: torch.tensor([mean], dtype=torch.float64)
    scores = []
    for seed in args.seeds:
        run = finetune(
            "token-classification", model, data, args.out / f"seed_{seed}",
            FinetuneConfig(seed=seed, progress=False, overwrite=True, bucket_batches=50),
        )  # fmt: skip
        scores.append(100 * run["epochs"][-1]["f1"])
        print(f"seed {seed}: F1 {scores[-1]:.2f}", flush=True)
    if len(scores) > 1:
        print(f"mean-word divisor, bucketed: {statistics.mean(scores):.2f} "
              f"± {statistics.stdev(scores):.2f} ({len(scores)} seeds)")  # fmt: skip


if __name__ == "__main__":
    main()
