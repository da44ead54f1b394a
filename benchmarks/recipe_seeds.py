"""The 10-minute laptop recipe with several pre-training seeds, scored on a held-out set that no
recipe choice ever saw: the recipe was tuned on Wikipedia AB, so the final figure
comes from the last files of AA, kept out of training here.

    BERTKIT_DATA=../shared/data nice python benchmarks/recipe_seeds.py --out runs/recipe_seeds \
        --seeds 0 1 2 --budget 10m

Shards (bert-base-uncased vocabulary, prepared once into OUT/data): `train` = AA/wiki_00..94,
`tuning` = AB (what the recipe was tuned on, and what docs/results/recipe reports), `final` =
AA/wiki_95..99. Each seed pre-trains `bertkit pretrain --recipe laptop --budget B --precision
fp32 --seed S` (resumable: a killed seed continues, a finished one is kept), then its model is
scored on both held-out sets by the evaluation pre-training runs (the same 20 batches of 32 × 128
every time, every chosen piece [MASK]). OUT/results.json: per seed and set, and the mean with a
95% t interval over seeds (what one pre-training run cannot show: its spread).

Table 6 at equal tokens: `--config mini --max-steps 3567 --out runs/sizes/mini`
pre-trains another size for the 10-minute tiny seeds' mean step count instead of a budget (the
recipe lowers the peak rate above width 256), on the same shards.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch
from _args import arguments
from machine import line as machine_line

from bertkit import BertForMaskedLM, BertForPreTraining, BertTokenizer
from bertkit.pretraining.dataset import MaskingConfig
from bertkit.pretraining.shards import Shards, prepare_shards
from bertkit.pretraining.train import PretrainingObjective, _held_out_evaluation
from bertkit.stats import t_ppf
from bertkit.training import distributed

SPLITS = {
    "train": ("AA", range(0, 95)),
    "tuning": ("AB", range(0, 5)),
    "final": ("AA", range(95, 100)),
}


def shards(
    data: Path, out: Path, vocab: Path | None = None, folder: str = "data"
) -> dict[str, Path]:
    """The three splits prepared into OUT/FOLDER with `vocab` (default bert-base-uncased's)."""
    tokenizer = BertTokenizer.from_pretrained(vocab or data / "vocab" / "bert-base-uncased")
    paths = {}
    for name, (corpus, numbers) in SPLITS.items():
        target = out / folder / name
        if not (target / "meta.json").exists():
            files = [data / "corpus" / "wikipedia_2015" / corpus / f"wiki_{n:02d}" for n in numbers]
            meta = prepare_shards(files, tokenizer, target, overwrite=True, progress=False)
            print(f"prepared {name}: {meta['num_tokens']:,} tokens", flush=True)
        paths[name] = target
    return paths


def held_out(
    model_dir: Path, data: Path, batches: int, instances: str = "pairs"
) -> dict[str, float]:
    """The held-out figures pre-training logs, for a finished model on another set: on sentence
    pairs as BERT trains (`pairs`, half with a random second segment; MLM and NSP) or on
    contiguous text as No NSP trains (`text`; MLM). A model trained without segment B reads the
    pairs' B as A (its type-1 embedding, never trained, is set to its type-0 one)."""
    objective = {"pairs": "mlm+nsp", "text": "mlm"}[instances]
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    model_class = BertForPreTraining if instances == "pairs" else BertForMaskedLM
    model = model_class.from_pretrained(model_dir).eval()
    trained_pairs = "BertForPreTraining" in json.loads((model_dir / "config.json").read_text()).get(
        "architectures", []
    )
    if not trained_pairs:
        with torch.no_grad():
            types = model.bert.embeddings.token_type_embeddings.weight
            types[1:] = types[0]
    evaluate = _held_out_evaluation(
        Shards(data), tokenizer, PretrainingObjective(objective), batch_size=32, seq_len=128,
        objective=objective, masking=MaskingConfig(), seed=1, batches=batches,
        dist=distributed.Distributed(),
    )  # fmt: skip
    with torch.no_grad():
        entry = evaluate(model, 0)
    return {k: v for k, v in entry.items() if k in ("mlm_accuracy", "mlm_loss", "nsp_accuracy")}


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data", default=os.environ.get("BERTKIT_DATA"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budget", default="10m")
    parser.add_argument("--max-steps", type=int, help="train this many steps, not for --budget")
    parser.add_argument("--config", default="tiny", help="model size (Table 6's rows)")
    parser.add_argument("--eval-batches", type=int, default=20)
    parser.add_argument(
        "--objective", default="mlm+nsp", choices=("mlm+nsp", "mlm"),
        help="mlm+nsp: the recipe (the committed figures); mlm: its objective on 2026-11-25 only",
    )  # fmt: skip
    args = parser.parse_args()
    if not args.data:
        raise SystemExit("give --data or set BERTKIT_DATA (../shared/data)")
    paths = shards(Path(args.data), args.out)
    length = {"max_steps": args.max_steps} if args.max_steps else {"budget": args.budget}
    results: dict = {"machine": machine_line(), "config": args.config, **length, "seeds": {}}
    for seed in args.seeds:
        run = args.out / f"seed{seed}"
        command = [
            sys.executable, "-m", "bertkit.cli", "pretrain", "--recipe", "laptop",
            *(f"--{k.replace('_', '-')}={v}" for k, v in length.items()),
            "--config", args.config, "--precision", "fp32", "--seed", str(seed),
            "--objective", args.objective,
            "--data", str(paths["train"]), "--eval-data", str(paths["tuning"]),
            "--eval-batches", str(args.eval_batches), "--out", str(run), "--resume",
        ]  # fmt: skip
        subprocess.run(command, check=True)
        log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
        train = [e for e in log if e.get("split") == "train"][-1]
        results["seeds"][seed] = {
            "tokens": train["tokens"],
            "steps": train["step"],
            **{name: held_out(run, paths[name], args.eval_batches) for name in ("tuning", "final")},
        }
        print(json.dumps({seed: results["seeds"][seed]}), flush=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    for name in ("tuning", "final"):
        values = [r[name]["mlm_accuracy"] for r in results["seeds"].values()]
        half = (
            t_ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
            if len(values) > 1
            else 0.0
        )
        results[name] = {"mlm_accuracy_mean": statistics.fmean(values), "interval": half}
        print(f"{name}: MLM accuracy {100 * statistics.fmean(values):.2f}% ± {100 * half:.2f}")
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
