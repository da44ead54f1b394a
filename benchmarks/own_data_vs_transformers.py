"""Your own data, end to end, against the loop a transformers user writes for the same files:
`bertkit finetune text-classification` on a CSV and `bertkit finetune token-classification` on
CoNLL-style files, at bertkit's default settings (fp32 on a CPU, 3 epochs, lr 5e-5, batch 32, 128
pieces), against a user who reads the same files with pandas (and a few lines for the CoNLL
columns), tokenises with `BertTokenizerFast`, pads per batch and trains with AdamW and a linear
warm-up at the same epochs, rate and batch (`finetune_vs_user.user_training`). Wall clock from
the start (reading, tokenizer and model loading included) to the last validation score; both
sides scored on their last epoch with the same metric functions; seeds alternate which side
goes first.

    BERTKIT_DATA=../shared/data python benchmarks/own_data_vs_transformers.py --seeds 3 \\
        --out runs/own_vs_user [--sides bertkit-random] [--kinds conll --train-sentences 5000]

`--sides bertkit-random` adds bertkit with random batches (`--bucket-batches 1`). To measure an
AVX-512 machine as an AVX2 one, cap the libraries' instructions: ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 (results.json records them).

The files are made from the shared data and written under OUT/data (never into the
repository): the CSV holds SST-2 sentences with their labels as words ("negative",
"positive"), written with Python's csv module (quotes where a sentence has a comma or a quote);
the CoNLL-style files are CoNLL-2003's (`token POS chunk NER`, IOB2), the first
`--train-sentences` sentences for training and the whole validation file. OUT/results.json
(resumable: finished runs are kept) holds every run and the machine (CPU model, its vector
extensions, threads); stdout a markdown table with the Welch 95% interval of the validation
score's difference.
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from _args import arguments, minilm
from finetune_vs_user import _tagged, print_table, user_training
from machine import describe, line

from bertkit.finetuning.train import FinetuneConfig, finetune, main_score
from bertkit.tasks import get_task, metrics
from bertkit.tasks.labels import per_class
from bertkit.tasks.own import DataConfig

KINDS = {
    "csv": ("text-classification", {"text_column": "sentence", "label_column": "label"}),
    "conll": ("token-classification", {}),
}


def prepare(root: Path, out: Path, train_rows: int, train_sentences: int) -> dict[str, dict]:
    """The benchmark's files under OUT/data, from the shared data."""
    out.mkdir(parents=True, exist_ok=True)
    names = {"0": "negative", "1": "positive"}
    for split, source, limit in (
        ("train", "train.tsv", train_rows),
        ("validation", "dev.tsv", None),
    ):
        lines = (root / "glue" / "SST-2" / source).read_text(encoding="utf-8").splitlines()[1:]
        with open(out / f"{split}.csv", "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["sentence", "label"])
            for row in lines[:limit]:
                sentence, label = row.rsplit("\t", 1)
                writer.writerow([sentence.strip(), names[label]])
    for split, source, limit in (("train", "train.txt", train_sentences),
                                 ("validation", "valid.txt", None)):  # fmt: skip
        blocks = (root / "conll2003" / source).read_text(encoding="utf-8").split("\n\n")
        kept = [b for b in blocks if b.strip() and not b.startswith("-DOCSTART-")][:limit]
        (out / f"{split}.conll").write_text("\n\n".join(kept) + "\n", encoding="utf-8")
    return {
        "csv": {"train": str(out / "train.csv"), "validation": str(out / "validation.csv")},
        "conll": {"train": str(out / "train.conll"), "validation": str(out / "validation.conll")},
    }


def bertkit_side(kind: str, model: str, files: dict, out: Path, seed: int, random: bool) -> dict:
    """`bertkit finetune` with its defaults (`random`: `--bucket-batches 1`, random batches as
    the user draws them); the last epoch's validation figures."""
    task, columns = KINDS[kind]
    run = finetune(
        task, model, DataConfig(**files, **columns), out,
        FinetuneConfig(seed=seed, progress=False, overwrite=True,
                       **({"bucket_batches": 1} if random else {})),
    )  # fmt: skip
    return {k: run["epochs"][-1][k] for k in run["dev"]}


def user_side(kind: str, model_dir: str, files: dict, sizes, seed: int) -> dict:
    """What a transformers user writes for the same files."""
    import pandas as pd
    import torch
    import transformers

    torch.manual_seed(seed)
    tokenizer = transformers.BertTokenizerFast.from_pretrained(model_dir)
    if kind == "csv":
        train, dev = pd.read_csv(files["train"]), pd.read_csv(files["validation"])
        labels = sorted(train["label"].unique())
        ids = {name: i for i, name in enumerate(labels)}

        def rows(frame):
            encoded = tokenizer(
                list(frame["sentence"]), truncation=True, max_length=sizes.max_seq_length
            )
            return [{**{k: v[i] for k, v in encoded.items()}, "labels": ids[label]}
                    for i, label in enumerate(frame["label"])]  # fmt: skip

        model = transformers.BertForSequenceClassification.from_pretrained(
            model_dir, num_labels=len(labels), id2label=dict(enumerate(labels)), label2id=ids
        )
        collator = transformers.DataCollatorWithPadding(tokenizer)
        train_rows, dev_rows = rows(train), rows(dev)
        gold = np.array([ids[label] for label in dev["label"]])

        def evaluate():
            guessed = np.concatenate([
                model(**{k: v for k, v in collator(dev_rows[s : s + 64]).items() if k != "labels"})
                .logits.argmax(-1).numpy() for s in range(0, len(dev_rows), 64)
            ])  # fmt: skip
            return {"accuracy": float((guessed == gold).mean()),
                    "macro_f1": per_class(gold, guessed, labels)["macro_f1"]}  # fmt: skip

    else:
        train, dev = read_conll(files["train"]), read_conll(files["validation"])
        labels = sorted({t for s in train for t in s.tags})
        model = transformers.BertForTokenClassification.from_pretrained(
            model_dir, num_labels=len(labels), id2label=dict(enumerate(labels)),
            label2id={name: i for i, name in enumerate(labels)},
        )  # fmt: skip
        collator = transformers.DataCollatorForTokenClassification(tokenizer)
        train_rows = _tagged(tokenizer, train, labels, sizes.max_seq_length)
        dev_rows = _tagged(tokenizer, dev, labels, sizes.max_seq_length)

        def evaluate():
            predicted = []
            for start in range(0, len(dev_rows), 64):
                chunk = dev_rows[start : start + 64]
                batch = collator(chunk)
                best = model(**{k: v for k, v in batch.items() if k != "labels"}).logits.argmax(-1)
                for row, guess, sentence in zip(chunk, best, dev[start : start + 64], strict=True):
                    tags = [
                        labels[int(g)]
                        for g, lab in zip(guess, row["labels"], strict=False)
                        if lab != -100
                    ]
                    predicted.append(tags + ["O"] * (len(sentence.words) - len(tags)))
            return metrics.entity_scores(predicted, [s.tags for s in dev])

    return user_training(model, collator, train_rows, sizes, seed, False, evaluate)


def read_conll(path: str) -> list:
    """A CoNLL file as a user reads it: words in the first column, tags in the last."""
    sentences, words, tags = [], [], []
    for text in Path(path).read_text(encoding="utf-8").splitlines() + [""]:
        fields = text.split()
        if not fields or fields[0] == "-DOCSTART-":
            if words:
                sentences.append(SimpleNamespace(words=words, tags=tags))
            words, tags = [], []
            continue
        words.append(fields[0])
        tags.append(fields[-1])
    return sentences


def main() -> None:
    parser = arguments(__doc__, data=True, model=True, out="runs/own_vs_user")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--sides", nargs="+", default=["bertkit", "transformers"],
        choices=["bertkit", "bertkit-random", "transformers"],
        help="bertkit-random: bertkit with --bucket-batches 1",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--train-rows", type=int, default=4_000, help="SST-2 rows in the CSV")
    parser.add_argument(
        "--train-sentences",
        type=int,
        default=5_000,
        help="CoNLL sentences (2,000: F1 near 60, seeds 2-3 points apart)",
    )
    args = parser.parse_args()
    model = args.model
    if model is None:
        model = minilm()
    files = prepare(Path(args.data), args.out / "data", args.train_rows, args.train_sentences)
    results_file = args.out / "results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    machine = describe()
    results["machine"] = machine
    print(f"machine: {line(machine)}", flush=True)
    turn = 0
    for kind in args.kinds:
        task_name, columns = KINDS[kind]
        entry = results.setdefault(kind, {"runs": []})
        done = {(r["seed"], r["side"]) for r in entry["runs"]}
        fitted = get_task(task_name, DataConfig(**files[kind], **columns))
        fitted = fitted.fitted(fitted.read(None, "train"))
        sizes = FinetuneConfig().resolved(fitted).sizes()
        for seed in range(args.seed, args.seed + args.seeds):
            sides = args.sides[:: 1 if turn % 2 == 0 else -1]
            turn += 1
            for side in sides:
                if (seed, side) in done:
                    continue
                started = time.perf_counter()
                if side.startswith("bertkit"):
                    figures = bertkit_side(
                        kind, model, files[kind], args.out / kind / f"{side}_{seed}", seed,
                        random=side == "bertkit-random",
                    )  # fmt: skip
                else:
                    figures = user_side(kind, model, files[kind], sizes, seed)
                seconds = time.perf_counter() - started
                entry["runs"].append(
                    {"seed": seed, "side": side, "seconds": round(seconds, 1), "dev": figures,
                     "score": main_score(fitted, figures), "machine": line(machine)}
                )  # fmt: skip
                print(f"{kind} seed {seed} {side}: {seconds:.0f} s, main score "
                      f"{main_score(fitted, figures):.4f}", flush=True)  # fmt: skip
                results_file.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\n{line(machine)}\n")
    print_table({k: v for k, v in results.items() if k in KINDS}, "transformers")


if __name__ == "__main__":
    main()
