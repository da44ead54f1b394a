"""bertkit's fine-tuning loop against a transformers user's loop on the same run: bertkit's
seeded head copied into transformers' model, bertkit's batch plan (random batches) fed to both,
fp32, one epoch; with `--dropout 0` nothing random is left; with dropout, bertkit runs
`--parity` (torch's masks) and both loops seed torch with 1000 + step before each step's
forward, the user's batches padded to a multiple of 8 as bertkit's are. Prints each side's dev
figures.

    BERTKIT_DATA=../shared/data python benchmarks/loops_run_for_run.py --task stsb --seed 45 \\
        --dropout 0 [--head-init normal|truncated-normal] [--max-train-examples N] \\
        [--sides bertkit user]

What it separates: the loops' arithmetic (equal without dropout) from what their random draws
do (dropout masks, the head's initialisation, the batch order). GLUE sentence tasks.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
import transformers
from _args import arguments, minilm
from finetune_vs_user import _score, _sentences, user_training
from task_data import task_data

import bertkit.core.heads as heads
from bertkit.core.model import INITIALISATIONS
from bertkit.core.tokenizer import BertTokenizer
from bertkit.finetuning.train import FinetuneConfig, build_model, finetune
from bertkit.tasks import get_task
from bertkit.tasks.base import FinetuneData

FIRST_SEED = 1000  # torch's seed before step 0's forward, then + 1 a step


def main() -> None:
    parser = arguments(__doc__, data=True, model=True)
    parser.add_argument("--task", default="stsb")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--head-init", default="normal", choices=list(INITIALISATIONS))
    parser.add_argument("--max-train-examples", type=int)
    parser.add_argument("--sides", nargs="+", default=["bertkit", "user"])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = args.model
    if model_dir is None:
        model_dir = minilm()
    task = get_task(args.task)
    data = task_data(Path(args.data), args.task)
    reseed = args.dropout > 0
    config = FinetuneConfig(
        epochs=1, progress=False, overwrite=True, seed=args.seed, precision="fp32",
        bucket_batches=1, dropout=args.dropout, parity=reseed, head_init=args.head_init,
        max_train_examples=args.max_train_examples,
    ).resolved(task)  # fmt: skip
    sizes = config.sizes()
    train = task.read(data, "train")[: args.max_train_examples]
    dev = task.read(data, "dev")
    features = task.featurize(train, BertTokenizer.from_pretrained(model_dir), sizes.max_seq_length)
    plan = FinetuneData(features, sizes.batch_size, lambda f: f, seed=args.seed,
                        bucket_batches=1).plan(0)  # fmt: skip
    if "bertkit" in args.sides:
        forward, count = heads.BertForSequenceClassification.forward, [0]

        def seeded(self, *a, **k):  # torch's generator as the user's loop leaves it
            if self.training and reseed:
                torch.manual_seed(FIRST_SEED + count[0])
                count[0] += 1
            return forward(self, *a, **k)

        heads.BertForSequenceClassification.forward = seeded  # type: ignore[method-assign]
        try:
            with tempfile.TemporaryDirectory() as out:
                run = finetune(args.task, model_dir, data, Path(out), config)
        finally:
            heads.BertForSequenceClassification.forward = forward  # type: ignore[method-assign]
        print(f"bertkit: {run['epochs'][-1]}", flush=True)
    if "user" in args.sides:
        labels = task.labels()
        tokenizer = transformers.BertTokenizerFast.from_pretrained(model_dir)
        model = transformers.BertForSequenceClassification.from_pretrained(
            model_dir, num_labels=1 if task.regression else len(labels),
            hidden_dropout_prob=args.dropout, attention_probs_dropout_prob=args.dropout,
        )  # fmt: skip
        model.classifier.load_state_dict(
            build_model(
                task, model_dir, args.seed, head_init=args.head_init
            ).classifier.state_dict()
        )
        collator = transformers.DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8)
        rows = _sentences(tokenizer, train, labels, task.regression, sizes.max_seq_length)
        dev_rows = _sentences(tokenizer, dev, labels, task.regression, sizes.max_seq_length)
        figures = user_training(
            model, collator, rows, sizes, args.seed, False,
            lambda: _score(task, model, collator, dev, dev_rows, labels, False),
            plan=plan, reseed=FIRST_SEED if reseed else None,
        )  # fmt: skip
        print(f"user loop: {figures}", flush=True)


if __name__ == "__main__":
    main()
