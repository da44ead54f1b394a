"""Pre-training on Wikipedia, bertkit against Hugging Face transformers, in one run.

    BERTKIT_DATA=../shared/data python benchmarks/pretrain_vs_hf.py --minutes 30 --out runs/pretrain_bench

1. Shards of ../shared/data/corpus/wikipedia_2015/AA (train) and AB (held out), with the
   bert-base-uncased vocabulary (made once, kept in OUT/data).
2. bertkit pre-trains BERT-mini (L4/H256/A4) with MLM + NSP for `--minutes` of training time on
   this machine's cores (the step count is calibrated from the first steps), through the same
   `run_pretraining` as `bertkit pretrain`: OUT/bertkit/log.jsonl, held-out evaluation every 10%.
3. transformers' BertForPreTraining, started from the *same* initial weights, trains for the same
   steps on the same batches with the same optimiser, schedule and loop (an adapter computes its
   logits at every position, as transformers does, and keeps those at the masked positions).
4. OUT/results.json: steps/s of each and their ratio, final MLM losses and their relative
   difference; OUT/curves.png: MLM/NSP accuracy and loss curves of both.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from _args import DATA, arguments
from _harness import transformers_copy

from bertkit import BertConfig, BertForPreTraining, BertTokenizer
from bertkit.pretraining.shards import prepare_shards
from bertkit.pretraining.train import run_pretraining


def shards(data_root: Path, out: Path) -> tuple[Path, Path]:
    vocab = data_root / "vocab" / "bert-base-uncased"
    tokenizer = BertTokenizer.from_pretrained(vocab)
    paths = []
    for split in ("AA", "AB"):
        target = out / "data" / split
        if not (target / "meta.json").exists():
            meta = prepare_shards(
                [data_root / "corpus" / "wikipedia_2015" / split], tokenizer, target, overwrite=True
            )
            print(f"prepared {split}: {meta['num_tokens']:,} tokens in {meta['seconds']:.0f} s")
        paths.append(target)
    return paths[0], paths[1]


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--out", default="runs/pretrain_bench")
    parser.add_argument("--minutes", type=float, default=30.0, help="bertkit's training time")
    parser.add_argument("--max-steps", type=int, help="instead of calibrating from --minutes")
    parser.add_argument("--config", default="mini")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup-fraction", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import transformers

    data_root = DATA
    out = Path(args.out)
    train, held_out = shards(data_root, out)
    tokenizer = BertTokenizer.from_pretrained(train)
    config = BertConfig.from_preset(args.config, vocab_size=tokenizer.vocab_size)

    def run(name: str, model, steps: int, evaluate: bool = True):
        directory = out / name
        for leftover in ("trainer_state.pt", "log.jsonl"):
            (directory / leftover).unlink(missing_ok=True)
        start = time.perf_counter()
        entries = run_pretraining(
            train,
            directory,
            config=config,
            max_steps=steps,
            batch_size=args.batch_size,
            seq_len=args.seq_len,
            eval_data=held_out if evaluate else None,
            eval_batches=20,
            learning_rate=args.lr,
            warmup_steps=max(1, int(steps * args.warmup_fraction)),
            log_every=max(1, steps // 200),
            eval_every=max(1, steps // 10),
            save_every=steps,
            seed=args.seed,
            precision="fp32",
            device="cpu",
            model=model,
        )
        return entries, time.perf_counter() - start

    torch.manual_seed(args.seed)
    initial = BertForPreTraining(config).state_dict()

    def ours():
        model = BertForPreTraining(config)
        model.load_state_dict(initial)
        return model

    def theirs():
        return transformers_copy(config, initial, tokenizer)

    steps = args.max_steps
    if steps is None:  # calibrate: time a few steps after a warm-up
        _, warm = run("calibrate", ours(), 5, evaluate=False)
        _, timed = run("calibrate", ours(), 35, evaluate=False)
        per_step = (timed - warm) / 30
        steps = max(10, int(args.minutes * 60 / per_step))
        print(f"calibrated: {per_step:.2f} s/step -> {steps} steps for {args.minutes} minutes")
    results = {
        "steps": steps,
        "config": args.config,
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "lr": args.lr,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    logs = {}
    for name, build in (("bertkit", ours), ("transformers", theirs)):
        entries, seconds = run(name, build(), steps)
        logs[name] = entries
        train_entries = [e for e in entries if e["split"] == "train"]
        evals = [e for e in entries if e["split"] == "eval"]
        tail = train_entries[-10:]
        rates = sorted(e["tokens_per_s"] for e in train_entries[1:] if "tokens_per_s" in e)
        results[name] = {
            "seconds": round(seconds, 1),
            "steps_per_s": round(steps / seconds, 4),
            # the median logging interval: robust to a burst of other work on the machine
            "median_tokens_per_s": rates[len(rates) // 2] if rates else None,
            "final_train_mlm_loss": round(sum(e["mlm_loss"] for e in tail) / len(tail), 4),
            "final_eval": evals[-1],
        }
        print(name, json.dumps(results[name]))
    ours_loss = results["bertkit"]["final_eval"]["mlm_loss"]
    their_loss = results["transformers"]["final_eval"]["mlm_loss"]
    results["eval_mlm_loss_relative_difference"] = round((ours_loss - their_loss) / their_loss, 4)
    results["steps_per_s_ratio"] = round(
        results["bertkit"]["steps_per_s"] / results["transformers"]["steps_per_s"], 3
    )
    if results["bertkit"]["median_tokens_per_s"] and results["transformers"]["median_tokens_per_s"]:
        results["median_tokens_per_s_ratio"] = round(
            results["bertkit"]["median_tokens_per_s"]
            / results["transformers"]["median_tokens_per_s"],
            3,
        )
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(
        json.dumps(
            {
                k: results[k]
                for k in (
                    "steps",
                    "eval_mlm_loss_relative_difference",
                    "steps_per_s_ratio",
                    "median_tokens_per_s_ratio",
                )
            }
        )
    )
    plot(logs, out / "curves.png", results)


def plot(logs: dict, path: Path, results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for name, entries in logs.items():
        train = [e for e in entries if e["split"] == "train"]
        evals = [e for e in entries if e["split"] == "eval"]
        axes[0].plot(
            [e["step"] for e in train],
            [e["mlm_loss"] for e in train],
            label=f"{name} train",
            alpha=0.7,
        )
        axes[0].plot(
            [e["step"] for e in evals],
            [e["mlm_loss"] for e in evals],
            "o-",
            label=f"{name} held-out",
        )
        axes[1].plot(
            [e["step"] for e in evals], [e["mlm_accuracy"] for e in evals], "o-", label=name
        )
        axes[2].plot(
            [e["step"] for e in evals], [e["nsp_accuracy"] for e in evals], "o-", label=name
        )
    axes[0].set(title="MLM loss", xlabel="step")
    axes[1].set(title="held-out MLM accuracy", xlabel="step")
    axes[2].set(title="held-out NSP accuracy", xlabel="step")
    axes[2].axhline(0.5, color="grey", linestyle=":", linewidth=1)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(
        f"BERT-{results['config']} on Wikipedia (AA), {results['steps']} steps x {results['batch_size']} "
        f"x {results['seq_len']}; bertkit {results['steps_per_s_ratio']:.2f}x transformers' steps/s"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
