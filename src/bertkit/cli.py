"""The `bertkit` command. Each subcommand parses its arguments and calls one library function."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence


def _vocab(args: argparse.Namespace) -> None:
    from bertkit.tokenizer import train_vocab

    tokenizer = train_vocab(
        args.corpus,
        vocab_size=args.size,
        lowercase=not args.cased,
        min_frequency=args.min_frequency,
        num_unused=args.num_unused,
        out_dir=args.out,
    )
    print(f"wrote {args.out}/vocab.txt ({tokenizer.vocab_size} tokens)")


def _convert(args: argparse.Namespace) -> None:
    from bertkit.checkpoint import convert

    out = convert(args.src, args.dst, to=args.to)
    print(f"wrote {out} ({args.to} layout)")


def _prepare(args: argparse.Namespace) -> None:
    from bertkit.pretraining.shards import prepare_shards
    from bertkit.tokenizer import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(args.vocab)
    meta = prepare_shards(
        args.corpus,
        tokenizer,
        args.out,
        workers=args.workers,
        format=args.format,
        on_error=args.on_error,
        overwrite=args.overwrite,
    )
    mb = meta["source_bytes"] / 1e6
    print(
        f"wrote {args.out}: {meta['num_documents']:,} documents, {meta['num_sentences']:,} "
        f"sentences, {meta['num_tokens']:,} tokens from {mb:.1f} MB in {meta['seconds']:.1f} s "
        f"({mb / max(meta['seconds'], 1e-9):.1f} MB/s, {meta['workers']} workers); skipped "
        f"{meta['skipped']['empty_documents']} empty documents, {meta['skipped']['bad_lines']} bad lines"
    )


def _pretrain(args: argparse.Namespace) -> None:
    from bertkit.pretraining.dataset import MaskingConfig
    from bertkit.pretraining.train import parse_phases, run_phases

    if args.phases:
        phases = parse_phases(args.phases)
    elif args.max_steps is not None:
        phases = [(args.seq_len, args.max_steps)]
    else:
        raise ValueError("give --max-steps N (or --phases SEQ_LEN:STEPS,...)")
    run_phases(
        args.data,
        args.out,
        phases,
        config=args.config,
        batch_size=args.batch_size,
        objective=args.objective,
        eval_data=args.eval_data,
        eval_batches=args.eval_batches,
        init_from=args.init_from,
        masking=MaskingConfig(
            mask_prob=args.mask_prob,
            max_predictions=args.max_predictions,
            whole_word=args.whole_word_mask,
            static=args.static_masking,
            dupe_factor=args.dupe_factor,
        ),
        learning_rate=args.lr,
        warmup_steps=args.warmup_steps,
        accumulation=args.accumulate,
        log_every=args.log_every,
        eval_every=args.eval_every,
        save_every=args.save_every,
        seed=args.seed,
        resume=args.resume,
        precision=args.precision,
        device=args.device,
    )


def _demo(args: argparse.Namespace) -> None:
    from bertkit.demo import run_demo

    run_demo(args.out, corpus=args.corpus or None, max_steps=args.steps)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bertkit", description="BERT: tokenizer, model, checkpoints, pre-training, fine-tuning"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True)

    vocab = commands.add_parser("vocab", help="train a WordPiece vocabulary from text files")
    vocab.add_argument("corpus", nargs="+", help="plain-text files")
    vocab.add_argument("--size", type=int, default=30522, help="vocabulary size (default 30522)")
    vocab.add_argument("--out", required=True, help="directory for vocab.txt")
    vocab.add_argument("--cased", action="store_true", help="keep case and accents")
    vocab.add_argument(
        "--min-frequency", type=int, default=2, help="rarest pair merged (default 2)"
    )
    vocab.add_argument("--num-unused", type=int, default=100, help="[unusedN] slots (default 100)")
    vocab.set_defaults(func=_vocab)

    convert = commands.add_parser(
        "convert", help="convert a checkpoint between Hugging Face and Google TF layouts"
    )
    convert.add_argument("src", help="checkpoint directory (either layout, auto-detected)")
    convert.add_argument("dst", help="output directory")
    convert.add_argument(
        "--to", choices=("hf", "google"), default="hf", help="target layout (default hf)"
    )
    convert.set_defaults(func=_convert)

    prepare = commands.add_parser("prepare", help="tokenise a corpus into pre-training shards")
    prepare.add_argument("corpus", nargs="+", help="corpus files or directories")
    prepare.add_argument("--vocab", required=True, help="directory with vocab.txt (or the file)")
    prepare.add_argument("--out", required=True, help="output shards directory")
    prepare.add_argument(
        "--seq-len",
        type=int,
        default=128,
        help="accepted for compatibility: instances are cut at training time (--seq-len of pretrain)",
    )
    prepare.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    prepare.add_argument(
        "--format", default="auto", choices=("auto", "google", "wiki", "text", "text-file", "jsonl")
    )
    prepare.add_argument(
        "--on-error",
        choices=("fail", "skip"),
        default="fail",
        help="undecodable or malformed lines",
    )
    prepare.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    prepare.set_defaults(func=_prepare)

    pretrain = commands.add_parser("pretrain", help="pre-train BERT (MLM + NSP) on prepared shards")
    pretrain.add_argument("--data", required=True, help="shards directory from bertkit prepare")
    pretrain.add_argument("--eval-data", help="held-out shards for MLM/NSP evaluation")
    pretrain.add_argument(
        "--config", default="tiny", help="tiny|mini|small|medium|base|large or a config JSON"
    )
    pretrain.add_argument(
        "--out",
        required=True,
        help="checkpoint directory (config.json, model.safetensors, log.jsonl)",
    )
    pretrain.add_argument("--max-steps", type=int, help="optimiser steps (one phase at --seq-len)")
    pretrain.add_argument(
        "--phases",
        help="the paper's schedule as SEQ_LEN:STEPS,...; e.g. 128:90000,512:10000 (each phase "
        "continues from the last with a fresh schedule; replaces --max-steps/--seq-len)",
    )
    pretrain.add_argument(
        "--batch-size", type=int, default=256, help="global sequences per step (default 256)"
    )
    pretrain.add_argument("--seq-len", type=int, default=128)
    pretrain.add_argument("--objective", choices=("mlm+nsp", "mlm", "ltr"), default="mlm+nsp")
    pretrain.add_argument(
        "--resume", action="store_true", help="continue from OUT/trainer_state.pt"
    )
    pretrain.add_argument(
        "--init-from", help="start from this checkpoint with a fresh schedule (phase 2)"
    )
    pretrain.add_argument("--lr", type=float, default=1e-4)
    pretrain.add_argument("--warmup-steps", type=int, default=10_000)
    pretrain.add_argument("--accumulate", type=int, default=1, help="micro-batches per step")
    pretrain.add_argument("--mask-prob", type=float, default=0.15)
    pretrain.add_argument(
        "--max-predictions", type=int, default=20, help="masked tokens per sequence at most"
    )
    pretrain.add_argument("--whole-word-mask", action="store_true")
    pretrain.add_argument(
        "--static-masking", action="store_true", help="fixed masks, --dupe-factor versions"
    )
    pretrain.add_argument("--dupe-factor", type=int, default=10)
    pretrain.add_argument("--log-every", type=int, default=10)
    pretrain.add_argument("--eval-every", type=int, default=0, help="0: at the end only")
    pretrain.add_argument("--eval-batches", type=int, default=20)
    pretrain.add_argument("--save-every", type=int, default=1000)
    pretrain.add_argument("--seed", type=int, default=0)
    pretrain.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto")
    pretrain.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    pretrain.set_defaults(func=_pretrain)

    demo = commands.add_parser("demo", help="run the main job on the embedded default corpus")
    demo.add_argument("corpus", nargs="*", help="text files to use instead of the default corpus")
    demo.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    demo.add_argument("--steps", type=int, default=600, help="pre-training steps (default 600)")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        print(f"bertkit {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
