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


def _demo(args: argparse.Namespace) -> None:
    from bertkit.demo import run_demo

    run_demo(args.out, corpus=args.corpus or None)


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

    demo = commands.add_parser("demo", help="run the main job on the embedded default corpus")
    demo.add_argument("corpus", nargs="*", help="text files to use instead of the default corpus")
    demo.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
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
    except (ValueError, FileNotFoundError) as err:
        print(f"bertkit {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
