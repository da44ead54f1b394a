"""The `bertkit` command. Each subcommand parses its arguments and calls one library function:
`cli.training` holds those that make models (vocab ... evaluate), `cli.use` those that use them
(predict ... demo). Flags of settings come from the settings dataclasses (`bertkit.settings`)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from bertkit.settings import number_type

# Plain numeric flags (not settings fields) and the values they accept: checked at parse time,
# so `--top 0` or `--batch-size 0` get argparse's usage line and a reason, not a traceback.
_PLAIN_CHECKS = {
    "size": "positive",
    "workers": "positive",
    "top": "positive",
    "rows_per_shard": "positive",
    "partitions": "positive",
    "parts": "positive",
    "seeds": "positive",
    "steps": "positive",
    "min_frequency": "non-negative",
    "num_unused": "non-negative",
}

# What users of other tools type, and bertkit's flag for it (offered in "did you mean").
_FLAG_ALIASES = {
    "--learning_rate": "--lr",
    "--num-train-epochs": "--epochs",
    "--num_train_epochs": "--epochs",
    "--per-device-train-batch-size": "--batch-size",
    "--per_device_train_batch_size": "--batch-size",
    "--train-batch-size": "--batch-size",
    "--train_batch_size": "--batch-size",
    "--output-dir": "--out",
    "--output_dir": "--out",
    "--model-name-or-path": "--model",
    "--model_name_or_path": "--model",
    "--max-seq-len": "--max-seq-length",
    "--max_seq_length": "--max-seq-length",
    "--warmup-ratio": "--warmup-fraction",
    "--warmup_proportion": "--warmup-fraction",
    "--num-train-steps": "--max-steps",
    "--max_steps": "--max-steps",
    "--do-lower-case": None,
}


def _did_you_mean(parser: argparse.ArgumentParser, unknown: list[str]) -> str:
    import difflib

    flags = [o for a in parser._actions for o in a.option_strings]
    hints = []
    for word in unknown:
        flag = word.split("=", 1)[0]
        if not flag.startswith("-"):
            continue
        if flag in _FLAG_ALIASES:
            target = _FLAG_ALIASES[flag]
            hints.append(
                f"{flag} → {target}" if target else f"{flag}: not needed (the vocabulary says)"
            )
            continue
        close = difflib.get_close_matches(flag, flags, n=1, cutoff=0.6)
        if close:
            hints.append(f"{flag} → {close[0]}")
    return f" (did you mean: {'; '.join(hints)})" if hints else ""


def _check_numbers(parser: argparse.ArgumentParser) -> None:
    """Every plain int/float flag refuses what is not finite, and what its `_PLAIN_CHECKS`
    entry refuses (settings' flags carry their own check)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _check_numbers(sub)
        elif action.type in (int, float):
            action.type = number_type(action.type, _PLAIN_CHECKS.get(action.dest))


def build_parser() -> argparse.ArgumentParser:
    from bertkit.cli import corpus, training, use

    parser = argparse.ArgumentParser(
        prog="bertkit",
        description="BERT: tokenizer, model, checkpoints, pre-training, fine-tuning",
        allow_abbrev=False,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True)
    for add in (*training.ADDERS, *use.ADDERS, *corpus.ADDERS):
        add(commands)
    _check_numbers(parser)
    for sub_parser in commands.choices.values():
        sub_parser.allow_abbrev = False  # --epoch must not silently mean --epochs
        # -v after the subcommand too (SUPPRESS: absent, it leaves the top-level value alone)
        sub_parser.add_argument(
            "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log at INFO"
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the subcommand's usage and a hint, not the top level's "unrecognized"
        subcommands = parser._subparsers._group_actions[0]  # type: ignore[union-attr]
        command = subcommands.choices[args.command]  # type: ignore[index]
        command.error(
            f"unrecognized arguments: {' '.join(unknown)}{_did_you_mean(command, unknown)}"
        )
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    from bertkit._device import fit_threads
    from bertkit.errors import JobFailed, TrainingDiverged, TrainingInterrupted

    try:
        fit_threads()
        args.func(args)
    except TrainingInterrupted as err:
        _fatal(f"bertkit {args.command}: {err}")
        return err.exit_code
    except (ValueError, OSError, ImportError, TrainingDiverged, JobFailed) as err:
        # OSError: missing files, full disk; ImportError: an optional extra not installed
        _fatal(f"bertkit {args.command}: error: {err}")
        return 2
    return 0


def _fatal(message: str) -> None:
    """The last word on a line of its own: a progress bar an error cut short is closed first
    (it ends its line), so the message does not start after its figures."""
    from tqdm import tqdm

    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()
    print(message, file=sys.stderr)
