"""The `bertkit` command. Each subcommand parses its arguments and calls one library function."""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bertkit._io import read_jsonl


def _vocab(args: argparse.Namespace) -> None:
    from bertkit.pretraining.corpus import raw_documents
    from bertkit.tokenizer import train_vocab

    # read as `prepare` reads: WikiExtractor's <doc ...> lines, JSONL keys and Google's blank
    # lines are markup, not text to learn pieces from
    texts = (unit for units, _ in raw_documents(args.corpus, format=args.format) for unit in units)
    tokenizer = train_vocab(
        texts=texts,
        vocab_size=args.size,
        lowercase=not args.cased,
        min_frequency=args.min_frequency,
        num_unused=args.num_unused,
        out_dir=args.out,
    )
    print(f"wrote {args.out}/vocab.txt ({tokenizer.vocab_size} tokens)")


def _convert(args: argparse.Namespace) -> None:
    from bertkit.checkpoint import convert

    out = convert(args.src, args.dst, to=args.to, overwrite=args.overwrite)
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
    from bertkit.pretraining.recipes import recipe
    from bertkit.pretraining.train import PretrainConfig, parse_budget, parse_phases, run_phases

    # the recipe (the paper's when none is named) under the flags given: a recipe's field has
    # no default on the command line, so None here means "not given"
    values = recipe(args.recipe or "paper", args.config)
    if args.warmup_steps is not None or args.warmup_fraction is not None:
        values.pop("warmup_steps", None)  # an explicit warm-up replaces the recipe's
        values.pop("warmup_fraction", None)
    budget = parse_budget(args.budget) if args.budget else None
    if budget is not None and args.warmup_fraction is None:
        values.pop("warmup_steps", None)  # a budget's warm-up is a fraction of it
        values.setdefault("warmup_fraction", 0.1)
    for key, value in values.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    budgets = None
    if args.phases and budget is not None:  # SEQ_LEN:SHARE of the budget
        shares = parse_phases(args.phases, shares=True)
        phases: list[tuple[int, int | None]] = [(length, None) for length, _ in shares]
        budgets = [share * budget for _, share in shares]
    elif args.phases:
        phases = parse_phases(args.phases)
    elif args.max_steps is not None or budget is not None:
        phases = [(args.seq_len, args.max_steps)]
    else:
        raise ValueError("give --max-steps N, --budget TIME (e.g. 15m) or --phases SEQ:STEPS,...")
    settings = _settings(
        args, PretrainConfig, masking=_settings(args, MaskingConfig), budget_seconds=budget
    )
    entries = run_phases(args.data, args.out, phases, settings, budgets=budgets)
    from bertkit.training.loop import format_figures

    evaluations = [e for e in entries if e.get("split") == "eval"]
    last = f"; held out: {format_figures(evaluations[-1])}" if evaluations else ""
    print(f"wrote {args.out} (model.safetensors, log.jsonl, curves.png){last}")


def _finetune(args: argparse.Namespace) -> None:
    import json

    from bertkit.finetune import (
        FinetuneConfig,
        finetune,
        finetune_grid,
        finetune_seeds,
        random_init_dir,
    )
    from bertkit.tasks import OWN_TASKS
    from bertkit.tasks.own import DataConfig

    data_config = _settings(args, DataConfig)
    if args.task in OWN_TASKS:
        if args.data is not None:
            raise ValueError(
                f"{args.task} reads your files: --train FILE --validation FILE [--test FILE], "
                "not --data DIR"
            )
        if data_config.train is None or data_config.validation is None:
            raise ValueError(f"{args.task} needs --train FILE and --validation FILE")
        data: Any = data_config
    else:
        given = data_config.given()
        if given:
            flags = ", ".join("--" + k.replace("_", "-") for k in given)
            raise ValueError(
                f"{flags}: for your own data ({', '.join(OWN_TASKS)}); {args.task} reads its "
                "official files from --data DIR"
            )
        if args.data is None:
            raise ValueError(f"{args.task} needs --data DIR (the folder of its official files)")
        data = args.data
    if (args.model is None) == (args.config is None):
        raise ValueError(
            "give --model DIR (a pre-trained checkpoint) or --config SIZE --vocab DIR (a "
            "randomly initialised model: the no-pre-training baseline), not both"
        )
    if args.config is not None:
        if args.vocab is None:
            raise ValueError("--config needs --vocab DIR (the vocabulary of the random model)")
        args.model = str(random_init_dir(args.config, args.vocab, Path(args.out) / "init"))
    elif args.vocab is not None:
        raise ValueError("--vocab goes with --config (a checkpoint brings its own vocab.txt)")
    config = _settings(args, FinetuneConfig, random_init=args.config is not None)
    if args.grid:
        results = finetune_grid(args.task, args.model, data, args.out, config, args.seeds)
    elif args.seeds > 1:
        results = finetune_seeds(args.task, args.model, data, args.out, config, args.seeds)
    else:
        results = finetune(args.task, args.model, data, args.out, config)
    shown = {"task": args.task, "dev": results["dev"]} | _spread(results)
    if "test" in results:
        shown["test"] = results["test"]
    print(json.dumps(shown, indent=1))
    _print_reports(results.get("report"))
    print(f"wrote {args.out}/results.json")


def _print_reports(reports: dict | None) -> None:
    """Each split's per-class table (the whole report stays in results.json)."""
    from bertkit.tasks.labels import report_table

    for split, report in (reports or {}).items():
        if isinstance(report, dict) and report.get("per_class"):
            print(f"\n{'validation' if split == 'dev' else split}:\n{report_table(report)}")


def _spread(results: dict) -> dict:
    return {k: results[k] for k in ("dev_std", "dev_min", "dev_max", "selected") if k in results}


def _evaluate(args: argparse.Namespace) -> None:
    import json

    from bertkit.finetune import evaluate

    result = evaluate(
        args.model,
        args.data,
        task=args.task,
        split=args.split,
        out=args.out,
        batch_size=args.batch_size,
        device=args.device,
        progress=True,
    )
    report = result.pop("report", None)
    print(json.dumps(result, indent=1))
    _print_reports({result.get("split", "dev"): report} if report else None)


def _predict(args: argparse.Namespace) -> None:
    import json

    from bertkit.predict import Predictor, predict_file
    from bertkit.tasks.files import FileOptions

    predictor = Predictor(args.model, device=args.device, batch_size=args.batch_size,
                          backend=args.backend, precision=args.precision)  # fmt: skip
    if args.input is not None:
        if args.text or args.question or args.context:
            raise ValueError("give texts on the command line or --input FILE, not both")
        columns = tuple(c.strip() for c in args.columns.split(",")) if args.columns else None
        options = FileOptions(args.format, columns, args.encoding, args.delimiter,
                              args.escape_char)  # fmt: skip
        count = predict_file(
            predictor,
            args.input,
            args.output,
            text_column=args.text_column,
            text_pair_column=args.text_pair_column,
            options=options,
            progress=not args.quiet,
        )
        if args.output not in (None, "-"):
            print(f"wrote {args.output} ({count:,} rows)", file=sys.stderr)
        return
    items = predictor.items_from(None, args.text, args.question, args.context)
    for result in predictor(items):
        print(json.dumps(result, ensure_ascii=False))


def _export(args: argparse.Namespace) -> None:
    from bertkit.serving import export_onnx

    path = export_onnx(
        args.model, args.out, quantize=args.quantize, opset=args.opset, overwrite=args.overwrite
    )
    print(f"wrote {path}" + (" (int8)" if args.quantize else ""))


def _serve(args: argparse.Namespace) -> None:
    from bertkit.serve import ServeConfig, serve

    serve(args.model, _settings(args, ServeConfig), access_log=args.verbose)


def _fill_mask(args: argparse.Namespace) -> None:
    import json

    from bertkit.fill_mask import FillMask

    items = read_jsonl(args.input) if args.input else list(args.text)
    if not items:
        raise ValueError('give texts with [MASK] ("The capital of France is [MASK].") or --input')
    fill = FillMask(args.model, device=args.device, batch_size=args.batch_size)
    for item, masks in zip(items, fill(items, top=args.top), strict=True):
        text = {"text": item} if isinstance(item, str) else {"text": item[0], "text_pair": item[1]}
        print(json.dumps({**text, "masks": masks}, ensure_ascii=False))


def _similarity(args: argparse.Namespace) -> None:
    import json

    from bertkit.insight import similarity

    layer = args.layer if args.layer in ("last", "all") else int(args.layer)
    result = similarity(args.model, args.text, layer=layer, pooling=args.pooling, word=args.word)
    result.save_png(args.out)
    print(json.dumps({**result.to_json(), "png": str(args.out)}, ensure_ascii=False))


def _attention(args: argparse.Namespace) -> None:
    from bertkit.insight import attention

    result = attention(args.model, args.text, args.pair)
    if str(args.out).lower().endswith((".html", ".htm")):
        result.save_html(args.out)
    else:
        result.save_png(args.out, layer=args.layer, head=args.head)
    print(args.out)


def _extract(args: argparse.Namespace) -> None:
    from bertkit.features import extract, read_items, save_features, token_ids
    from bertkit.model import BertModel
    from bertkit.tokenizer import BertTokenizer

    items = read_items(args.input, words=args.words, conll=args.conll)
    tokenizer = BertTokenizer.from_pretrained(args.model)
    model = BertModel.from_pretrained(args.model)
    selections = [s.strip() for s in args.layers.split(",") if s.strip()]
    features = extract(
        model,
        tokenizer,
        items,
        selections,
        max_seq_length=args.max_seq_length,
        batch_size=args.batch_size,
        device=args.device,
    )
    meta = {"model": args.model, "input": args.input, "per_word": bool(args.words or args.conll)}
    ids = token_ids(tokenizer, items, args.max_seq_length)
    path = save_features(features, args.out, meta, ids=ids)
    widths = {s: tuple(v[0].shape[1:]) for s, v in features.items()}
    print(f"wrote {path}: {len(items)} items, features {widths}")


def _viz(args: argparse.Namespace) -> None:
    from bertkit.viz import plot_log

    path = plot_log(args.log, args.out, title=args.title or "")
    if path is None:
        raise ValueError(f"{args.log}: no training entries to plot")
    print(f"wrote {path}")


def _demo(args: argparse.Namespace) -> None:
    from bertkit.demo import run_demo
    from bertkit.pretraining.train import parse_budget

    run_demo(
        args.out,
        corpus=args.corpus or None,
        budget_seconds=parse_budget(args.budget),
        max_steps=args.steps,
    )


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every default that is not None/False (recipe settings say theirs in the help)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.default == argparse.SUPPRESS:
            return action.help
        return super()._get_help_string(action)


def _recipe_line(name: str) -> str:
    from bertkit.pretraining.recipes import RECIPES

    line = ", ".join(f"{key} {value}" for key, value in RECIPES[name].items())
    return line + (" (× 256 / hidden size above 256)" if name == "laptop" else "")


# Numeric flags and the values they accept: checked at parse time, so `--save-every 0` or
# `--batch-size 0` get argparse's usage line and a reason instead of a traceback mid-run.
_POSITIVE = (
    "size workers max_steps batch_size seq_len lr accumulate max_predictions dupe_factor "
    "log_every eval_batches save_every epochs max_seq_length seeds eval_batch_size "
    "max_train_examples max_eval_examples top steps eval_seq_len"
).split()
_NON_NEGATIVE = "min_frequency num_unused warmup_steps eval_every".split()
_FRACTION = {  # name: (low, high, high included)
    "mask_prob": (0.0, 1.0, True),
    "mask_token_prob": (0.0, 1.0, True),
    "random_token_prob": (0.0, 1.0, True),
    "dropout": (0.0, 1.0, False),
    "warmup": (0.0, 1.0, False),
    "warmup_fraction": (0.0, 1.0, False),
    "adam_beta2": (0.0, 1.0, False),
}


def _checked(kind: type, name: str, check: str | None = None):
    """A parser of `kind` that refuses what the flag cannot take: by the tables above, or by
    a settings field's `check` (positive, non-negative, fraction)."""
    positive = name in _POSITIVE or check == "positive"
    non_negative = name in _NON_NEGATIVE or check == "non-negative"
    bounds = _FRACTION.get(name, (0.0, 1.0, False) if check == "fraction" else None)

    def parse(text: str):
        value = kind(text)
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if positive and value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        if non_negative and value < 0:
            raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
        if bounds is not None:
            low, high, closed = bounds
            if not (low <= value <= high if closed else low <= value < high):
                raise argparse.ArgumentTypeError(
                    f"must be in [{low:g}, {high:g}{']' if closed else ')'}, got {text}"
                )
        return value

    parse.__name__ = kind.__name__  # argparse names the type in "invalid int value"
    return parse


def _add_settings(
    parser: argparse.ArgumentParser,
    cls: type,
    skip: tuple[str, ...] = (),
    recipes: dict[str, dict[str, Any]] | None = None,
) -> None:
    """One flag per field of the settings dataclass `cls` (bertkit.settings): --field-name (and
    the field's other spellings), its type, default, choices and one-line help. A field some
    recipe sets has no default on the command line (the recipe's value fills it in, an
    explicit flag wins) and its help lists each recipe's value."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        meta = field.metadata
        flags = ["--" + field.name.replace("_", "-"), *meta.get("flags", ())]
        help, default = meta["help"], field.default
        if recipes and any(field.name in recipe for recipe in recipes.values()):
            values = "; ".join(
                f"{name} {recipe.get(field.name, default if default is not None else 'unset')}"
                for name, recipe in recipes.items()
            )
            help, default = f"{help} (recipe: {values})", None
        kind = hints[field.name]
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        base = args[0] if args else kind
        if base is bool:
            parser.add_argument(*flags, dest=field.name, action="store_true", help=help)
            continue
        parser.add_argument(
            *flags,
            dest=field.name,
            type=_checked(base, field.name, meta.get("check")) if base in (int, float) else base,
            default=default,
            choices=meta.get("choices"),
            help=help,
        )


def _settings(args: argparse.Namespace, cls: type, **values):
    """An instance of the settings dataclass `cls` from the parsed flags (and `values`)."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in vars(args).items() if k in names} | values)


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
    "--warmup-ratio": "--warmup",
    "--warmup_proportion": "--warmup",
    "--num-train-steps": "--max-steps",
    "--max_steps": "--max-steps",
    "--do-lower-case": None,
}


def _task_name(text: str) -> str:
    """MRPC, sst-2, STS-B, CoNLL2003 ... -> the task's name (case, '-' and '_' ignored)."""
    from bertkit.tasks import TASK_NAMES

    def key(name: str) -> str:
        return name.lower().replace("-", "").replace("_", "").replace(".", "")

    names = {key(name): name for name in TASK_NAMES}
    names.update({"classification": "text-classification", "tagging": "token-classification",
                  "qa": "question-answering", "choice": "multiple-choice"})  # fmt: skip
    names.update({"squad11": "squad1", "squad20": "squad2", "squadv1": "squad1",
                  "squadv2": "squad2", "conll": "conll2003", "ner": "conll2003"})  # fmt: skip
    if key(text) in names:
        return names[key(text)]
    raise argparse.ArgumentTypeError(f"unknown task {text!r}; one of {', '.join(TASK_NAMES)}")


def _split_name(text: str) -> str:
    """`validation`/`valid`/`eval` are the dev split (Hugging Face's and CoNLL's words for it)."""
    return {"validation": "dev", "valid": "dev", "eval": "dev", "development": "dev"}.get(
        text.lower(), text
    )


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
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _check_numbers(sub)
        elif action.type in (int, float):
            action.type = _checked(action.type, action.dest)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bertkit",
        description="BERT: tokenizer, model, checkpoints, pre-training, fine-tuning",
        allow_abbrev=False,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True)
    from bertkit.pretraining.corpus import FORMATS
    from bertkit.pretraining.dataset import MaskingConfig
    from bertkit.pretraining.recipes import RECIPES
    from bertkit.pretraining.train import PretrainConfig

    vocab = commands.add_parser("vocab", help="train a WordPiece vocabulary from text files")
    vocab.add_argument("corpus", nargs="+", help="corpus files or directories (as for prepare)")
    vocab.add_argument(
        "--format",
        default="auto",
        choices=FORMATS,
        help="corpus layout, as for prepare (default: detected)",
    )
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
    convert.add_argument(
        "--overwrite", action="store_true", help="replace the checkpoint DST holds (if any)"
    )
    convert.set_defaults(func=_convert)

    prepare = commands.add_parser("prepare", help="tokenise a corpus into pre-training shards")
    prepare.add_argument("corpus", nargs="+", help="corpus files or directories")
    prepare.add_argument("--vocab", required=True, help="directory with vocab.txt (or the file)")
    prepare.add_argument("--out", required=True, help="output shards directory")
    prepare.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    prepare.add_argument("--format", default="auto", choices=FORMATS)
    prepare.add_argument(
        "--on-error",
        choices=("fail", "skip"),
        default="fail",
        help="undecodable or malformed lines",
    )
    prepare.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    prepare.set_defaults(func=_prepare)

    pretrain = commands.add_parser(
        "pretrain",
        help="pre-train BERT (MLM + NSP) on prepared shards",
        formatter_class=_Formatter,
        description="Settings marked 'recipe' come from --recipe (default: the paper's); an "
        "explicit flag always wins. The laptop recipe: " + _recipe_line("laptop"),
    )
    pretrain.add_argument("--data", required=True, help="shards directory from bertkit prepare")
    pretrain.add_argument(
        "--out",
        required=True,
        help="checkpoint directory (config.json, model.safetensors, log.jsonl)",
    )
    pretrain.add_argument(
        "--recipe",
        choices=("paper", "laptop"),
        help="named settings (recipe 'paper' when not given): 'laptop' is the measured best per "
        "CPU-minute on 2 cores, see docs/results/recipe",
    )
    pretrain.add_argument(
        "--budget",
        help="train for this much wall-clock time instead of (or as well as) a step count: 90s, "
        "15m, 2h, 1h30m; the warm-up and decay follow elapsed time; evaluations are not charged",
    )
    pretrain.add_argument(
        "--phases",
        help="the paper's schedule as SEQ_LEN:STEPS,...; e.g. 128:90000,512:10000 (each phase "
        "continues from the last with a fresh schedule; replaces --max-steps/--seq-len); with "
        "--budget, SEQ_LEN:SHARE of the budget, e.g. 32:0.7,128:0.3",
    )
    _add_settings(
        pretrain, PretrainConfig, skip=("masking", "budget_seconds", "progress"), recipes=RECIPES
    )
    _add_settings(pretrain, MaskingConfig, recipes=RECIPES)
    pretrain.set_defaults(func=_pretrain)

    from bertkit.finetune import FinetuneConfig
    from bertkit.tasks import OWN_TASKS, PAPER_TASKS
    from bertkit.tasks.own import DataConfig

    finetune = commands.add_parser(
        "finetune",
        help="fine-tune on a task of the paper (GLUE, SQuAD, CoNLL-2003, SWAG) or your own files",
        formatter_class=_Formatter,
        description="The paper's tasks read their official files from --data DIR; "
        f"{', '.join(OWN_TASKS)} read your own files (--train, --validation, --test and the "
        "flags of 'your own data').",
    )
    finetune.add_argument(
        "task",
        type=_task_name,
        help=f"the paper's: {', '.join(PAPER_TASKS)}; your own data: {', '.join(OWN_TASKS)}",
    )
    finetune.add_argument("--model", help="checkpoint directory (ours, HF, Google)")
    finetune.add_argument(
        "--config",
        help="instead of --model: a randomly initialised model of this size (tiny ... large, or "
        "a config JSON), each seed its own init: the 'no pre-training' row",
    )
    finetune.add_argument("--vocab", help="with --config: directory with vocab.txt (or the file)")
    finetune.add_argument("--data", help="the paper's tasks: folder with the official files")
    finetune.add_argument("--out", required=True, help="output directory")
    finetune.add_argument("--seeds", type=int, default=1, help="repeat with K seeds: mean/std")
    finetune.add_argument(
        "--grid",
        action="store_true",
        help="the paper's grid: batch 16/32 x lr 5e-5/3e-5/2e-5 x 2/3/4 epochs",
    )
    _add_settings(finetune, FinetuneConfig, skip=("progress", "random_init"))
    own = finetune.add_argument_group(
        "your own data", f"files and columns for {', '.join(OWN_TASKS)} (see docs/usage.md)"
    )
    _add_settings(own, DataConfig)  # type: ignore[arg-type]
    finetune.set_defaults(func=_finetune)

    evaluate = commands.add_parser("evaluate", help="score a fine-tuned model on a split")
    evaluate.add_argument("--model", required=True, help="a directory `bertkit finetune` wrote")
    evaluate.add_argument(
        "--data",
        required=True,
        help="the paper's tasks: folder with the official files; your own data: a file, read "
        "as the training files were (its labels scored when it has them)",
    )
    evaluate.add_argument("--task", type=_task_name, help="default: the model's own task")
    evaluate.add_argument(
        "--split", default="dev", type=_split_name, help="dev (or validation), test, dev_mismatched"
    )
    evaluate.add_argument("--out", help="write predictions (test: GLUE submission files) here")
    evaluate.add_argument("--batch-size", type=int, default=64)
    evaluate.add_argument("--device")
    evaluate.set_defaults(func=_evaluate)

    predict = commands.add_parser("predict", help="labels, spans or tags for raw text")
    predict.add_argument("--model", required=True, help="a directory `bertkit finetune` wrote")
    predict.add_argument("text", nargs="*", help="sentences (a pair task: exactly two)")
    predict.add_argument("--question", help="SQuAD: the question")
    predict.add_argument("--context", help="SQuAD: the paragraph")
    predict.add_argument(
        "--input",
        help="a file to predict row by row, streaming: CSV, TSV, JSON Lines, JSON, Parquet, a "
        "datasets folder; - reads stdin, one text a line. JSON lines may be "
        '{"text": ..., "text_pair": ...}, {"question": ..., "context": ...}, a list of words '
        '(tagging) or {"context": ..., "choices": [...]}',
    )
    predict.add_argument(
        "--output",
        help="with --input: .jsonl or .csv/.tsv to write (input columns, then the answer); "
        "default: JSON lines on stdout",
    )
    predict.add_argument(
        "--text-column", help="with --input: the column the model reads (default: as trained)"
    )
    predict.add_argument("--text-pair-column", help="with --input: a second text column")
    from bertkit.tasks.files import FORMATS as FILE_FORMATS

    predict.add_argument("--format", default="auto", choices=FILE_FORMATS, help="of --input")
    predict.add_argument("--columns", help="names of a header-less --input file's columns")
    predict.add_argument("--encoding", default="utf-8", help="of --input")
    predict.add_argument("--delimiter", help="CSV field separator of --input")
    predict.add_argument("--escape-char", help="CSV: a character escaping quotes in --input")
    predict.add_argument("--quiet", action="store_true", help="no progress bar")
    predict.add_argument("--batch-size", type=int, default=32)
    predict.add_argument("--device")
    predict.add_argument(
        "--backend",
        default="torch",
        choices=("torch", "onnx"),
        help="onnx: run MODEL/model.onnx (bertkit export --onnx) with ONNX Runtime",
    )
    predict.add_argument(
        "--precision",
        default="auto",
        choices=("auto", "fp32", "bf16", "fp16"),
        help="auto: bf16 autocast where native (AMX-BF16, AVX512-BF16, a GPU with bf16), else fp32",
    )
    predict.set_defaults(func=_predict)

    export = commands.add_parser("export", help="export a checkpoint for serving (ONNX)")
    export.add_argument(
        "--onnx", action="store_true", required=True, help="to ONNX (the one format)"
    )
    export.add_argument("model", help="a checkpoint directory (a fine-tuned model or an encoder)")
    export.add_argument("out", help="output folder (model.onnx + what Predictor needs)")
    export.add_argument(
        "--quantize", choices=("int8",), help="int8 dynamic quantisation of the linear layers"
    )
    export.add_argument("--opset", type=int, default=17)
    export.add_argument("--overwrite", action="store_true", help="replace what OUT holds")
    export.set_defaults(func=_export)

    from bertkit.serve.config import ServeConfig

    serve = commands.add_parser(
        "serve", help="an HTTP API with dynamic batching (/predict, /embed, /fill-mask)"
    )
    serve.add_argument("model", help="a fine-tuned model, an encoder, or an ONNX export")
    _add_settings(serve, ServeConfig)
    serve.set_defaults(func=_serve)

    fill = commands.add_parser(
        "fill-mask", help="the most likely pieces for each [MASK] of a text (MLM head)"
    )
    fill.add_argument("--model", required=True, help="a checkpoint with its MLM head")
    fill.add_argument("text", nargs="*", help="texts with one or more [MASK]s")
    fill.add_argument("--input", help='JSON lines: "text" or {"text": ..., "text_pair": ...}')
    fill.add_argument("--top", type=int, default=5, help="candidates per [MASK] (default 5)")
    fill.add_argument("--batch-size", type=int, default=32)
    fill.add_argument("--device")
    fill.set_defaults(func=_fill_mask)

    similar = commands.add_parser(
        "similarity",
        help="cosine similarity of contextual embeddings: pieces, texts, a word across contexts",
    )
    similar.add_argument("--model", required=True, help="any checkpoint bertkit loads")
    similar.add_argument("text", nargs="+", help="texts to compare")
    similar.add_argument(
        "--layer", default="last", help="0 (embeddings) .. L, negative from the top, last, all"
    )
    similar.add_argument(
        "--pooling", default="mean", choices=("mean", "cls"), help="text vectors (default mean)"
    )
    similar.add_argument("--word", help='a word in two or more texts (e.g. "bank") to follow')
    similar.add_argument("--out", default="similarity.png", help="PNG to write")
    similar.set_defaults(func=_similarity)

    attend = commands.add_parser("attention", help="attention maps as a PNG or an HTML page")
    attend.add_argument("--model", required=True, help="any checkpoint bertkit loads")
    attend.add_argument("text", help="the text")
    attend.add_argument("--pair", help="a second segment ([CLS] text [SEP] pair [SEP])")
    attend.add_argument("--layer", type=int, help="one map: layer 1..L (with --head)")
    attend.add_argument("--head", type=int, help="one map: head 0..A-1 (with --layer)")
    attend.add_argument(
        "--out", default="attention.png", help="a .png (grid, or one map) or .html (interactive)"
    )
    attend.set_defaults(func=_attention)

    extract = commands.add_parser(
        "extract", help="frozen per-token features from chosen layers (feature-based approach)"
    )
    extract.add_argument("--model", required=True, help="checkpoint directory")
    extract.add_argument("--input", required=True, help="one text per line (or --conll FILE)")
    extract.add_argument("--out", required=True, help="output .safetensors file")
    extract.add_argument(
        "--layers",
        default="last",
        help="comma-separated: embeddings, last, second_to_last, sum_last_4, concat_last_4, all, "
        "layer:N (default last)",
    )
    extract.add_argument(
        "--words", action="store_true", help="lines are words: one row per word (first piece)"
    )
    extract.add_argument("--conll", action="store_true", help="input is a CoNLL file: per word")
    extract.add_argument("--max-seq-length", type=int, default=512)
    extract.add_argument("--batch-size", type=int, default=32)
    extract.add_argument("--device")
    extract.set_defaults(func=_extract)

    viz = commands.add_parser("viz", help="plot the curves of a run's log.jsonl as a PNG")
    viz.add_argument("log", help="a log.jsonl of bertkit pretrain or finetune")
    viz.add_argument("--out", default="curves.png")
    viz.add_argument("--title")
    viz.set_defaults(func=_viz)

    demo = commands.add_parser("demo", help="run the main job on the embedded default corpus")
    demo.add_argument("corpus", nargs="*", help="text files to use instead of the default corpus")
    demo.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    demo.add_argument(
        "--budget", default="2m", help="pre-training time (training only; default 2m)"
    )
    demo.add_argument("--steps", type=int, help="stop after this many steps if sooner")
    demo.set_defaults(func=_demo)
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
    from bertkit.errors import TrainingDiverged, TrainingInterrupted

    try:
        args.func(args)
    except TrainingInterrupted as err:
        _fatal(f"bertkit {args.command}: {err}")
        return err.exit_code
    except (ValueError, OSError, ImportError, TrainingDiverged) as err:
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


if __name__ == "__main__":
    sys.exit(main())
