"""The subcommands that make models: vocab, convert, prepare, pretrain, finetune, evaluate. Each
has a function adding its parser and a handler calling one library function."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bertkit.settings import add_flags, command, field_names, from_flags


# --------------------------------------------------------------------------- vocab, convert
def _vocab(args: argparse.Namespace) -> None:
    from bertkit.core.tokenizer import train_vocab
    from bertkit.pretraining.corpus import CorpusStats, raw_documents

    # read as `prepare` reads: WikiExtractor's <doc ...> lines, JSONL keys and Google's blank
    # lines are markup, not text to learn pieces from
    stats = CorpusStats()
    documents = raw_documents(_corpus(args), format=args.format, on_error=args.on_error,
                              stats=stats, text_column=args.text_column)  # fmt: skip
    texts = (unit for units, _ in documents for unit in units)
    tokenizer = train_vocab(
        texts=texts,
        vocab_size=args.size,
        lowercase=not args.cased,
        min_frequency=args.min_frequency,
        num_unused=args.num_unused,
        out_dir=args.out,
    )
    print(
        f"wrote {Path(args.out) / 'vocab.txt'} ({tokenizer.vocab_size} tokens) from {stats.documents:,} "
        f"documents; skipped {stats.empty_documents} empty documents, {stats.bad_lines} bad lines"
    )


def _corpus(args: argparse.Namespace) -> list[str]:
    """The corpus files given, or the cached split of --dataset."""
    if bool(args.corpus) == bool(args.dataset):
        raise ValueError("give the corpus (files or folders) or --dataset NAME, one of the two")
    if args.dataset:
        from bertkit.tasks.named import split_file

        return [str(split_file(args.dataset, args.split))]
    return list(args.corpus)


def _add_corpus(parser, help: str) -> None:
    from bertkit.pretraining.corpus import FORMATS

    parser.add_argument("corpus", nargs="*", help=help)
    parser.add_argument(
        "--format", default="auto", choices=FORMATS,
        help="corpus layout (default: detected; text, JSON Lines, CSV and TSV may be gzip, zstd, "
        "bz2 or xz compressed)",
    )  # fmt: skip
    parser.add_argument(
        "--text-column", help="tables (JSON Lines, CSV, TSV, Parquet, datasets folders): the "
        "column holding the text (default: text, else a Parquet table's only string column)",
    )  # fmt: skip
    parser.add_argument("--dataset", help="a dataset by name (NAME[:CONFIG]), from the local cache")
    parser.add_argument("--split", default="train", help="with --dataset: the split")


def _add_on_error(parser) -> None:
    parser.add_argument(
        "--on-error",
        choices=("fail", "skip"),
        default="fail",
        help="undecodable or malformed lines: stop there (naming file, line and byte), or skip "
        "them with a warning (default: fail)",
    )


def add_vocab(commands) -> None:

    vocab = commands.add_parser("vocab", help="train a WordPiece vocabulary from text files")
    _add_corpus(vocab, "corpus files or directories (as for prepare)")
    vocab.add_argument("--size", type=int, default=30522, help="vocabulary size (default 30522)")
    vocab.add_argument("--out", required=True, help="directory for vocab.txt")
    vocab.add_argument("--cased", action="store_true", help="keep case and accents")
    vocab.add_argument(
        "--min-frequency", type=int, default=2, help="rarest pair merged (default 2)"
    )
    vocab.add_argument("--num-unused", type=int, default=100, help="[unusedN] slots (default 100)")
    _add_on_error(vocab)
    vocab.set_defaults(func=_vocab)


def _convert(args: argparse.Namespace) -> None:
    from bertkit.core.checkpoint import convert

    out = convert(args.src, args.dst, to=args.to, overwrite=args.overwrite)
    print(f"wrote {out} ({args.to} layout)")


def add_convert(commands) -> None:
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


# --------------------------------------------------------------------------- prepare, pretrain
def _prepare(args: argparse.Namespace) -> None:
    from bertkit.core.tokenizer import BertTokenizer
    from bertkit.pretraining import parts
    from bertkit.pretraining.shards import prepare_shards

    if args.merge:
        if args.corpus or args.dataset or args.part or args.ray:
            raise ValueError(
                "--merge takes the parts' folders alone: not a corpus, --part or --ray"
            )
        meta = parts.merge_parts(args.merge, args.out, overwrite=args.overwrite)
        print(f"wrote {args.out}: {meta['num_documents']:,} documents, {meta['num_tokens']:,} "
              f"tokens in {len(meta['shards'])} shards from {len(args.merge)} parts")  # fmt: skip
        return
    if args.vocab is None:
        raise ValueError("--vocab: the vocabulary to tokenise with (a folder with vocab.txt)")
    settings = dict(format=args.format, on_error=args.on_error, text_column=args.text_column)
    if args.ray:
        meta = parts.prepare_on_ray(_corpus(args), args.vocab, args.out, address=args.ray,
                                    parts=args.parts, overwrite=args.overwrite, **settings)  # fmt: skip
    else:
        meta = prepare_shards(
            _corpus(args),
            BertTokenizer.from_pretrained(args.vocab),
            args.out,
            workers=args.workers,
            overwrite=args.overwrite,
            part=parts.parse_part(args.part) if args.part else None,
            **settings,
        )
    mb = meta["source_bytes"] / 1e6
    print(
        f"wrote {args.out}: {meta['num_documents']:,} documents, {meta['num_sentences']:,} "
        f"sentences, {meta['num_tokens']:,} tokens from {mb:.1f} MB in {meta['seconds']:.1f} s "
        f"({mb / max(meta['seconds'], 1e-9):.1f} MB/s, {meta['workers']} workers); skipped "
        f"{meta['skipped']['empty_documents']} empty documents, {meta['skipped']['bad_lines']} bad lines"
    )


def add_prepare(commands) -> None:

    prepare = commands.add_parser("prepare", help="tokenise a corpus into pre-training shards")
    _add_corpus(prepare, "corpus files or directories: text, WikiExtractor output, JSON Lines, "
                "CSV, TSV (compressed or not), Parquet, datasets folders")  # fmt: skip
    prepare.add_argument("--vocab", help="directory with vocab.txt (or the file)")
    prepare.add_argument("--out", required=True, help="output shards directory")
    prepare.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    _add_on_error(prepare)
    prepare.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    beyond = prepare.add_argument_group("beyond one machine")
    beyond.add_argument("--part", metavar="I/N",
                        help="only part I of N (0 <= I < N) of the corpus's files, to --merge")  # fmt: skip
    beyond.add_argument("--merge", nargs="+", metavar="PART",
                        help="merge the folders --part wrote (every digest checked) into --out")  # fmt: skip
    beyond.add_argument("--ray", nargs="?", const="auto", metavar="ADDRESS",
                        help="tokenise the parts on a Ray cluster, then merge (pip install "
                        "'bertkit[ray]')")  # fmt: skip
    beyond.add_argument("--parts", type=int, help="with --ray: parts (default: the cluster's CPUs)")
    prepare.set_defaults(func=_prepare)


def _pretrain(args: argparse.Namespace) -> None:
    from bertkit.pretraining.recipes import apply_recipe
    from bertkit.pretraining.train import PretrainConfig, parse_budget, run_pretraining
    from bertkit.training.run_folder import format_figures

    # the recipe (the paper's when none is named) under the flags given: a recipe's field has
    # no default on the command line, so None there means "not given"
    given = {k: v for k, v in vars(args).items() if k in field_names(PretrainConfig)}
    given["budget_seconds"] = parse_budget(args.budget) if args.budget else None
    entries = run_pretraining(args.data, args.out, apply_recipe(args.recipe, given))
    evaluations = [e for e in entries if e.get("split") == "eval"]
    last = f"; held out: {format_figures(evaluations[-1])}" if evaluations else ""
    print(f"wrote {args.out} (model.safetensors, log.jsonl, curves.png){last}")


def _recipe_line(name: str) -> str:
    from bertkit.pretraining.recipes import RECIPES

    line = ", ".join(f"{key} {value}" for key, value in RECIPES[name].items())
    return line + (" (× 256 / hidden size above 256)" if name == "laptop" else "")


# the optimiser's settings pre-training and fine-tuning leave at the paper's (no flag; Python
# takes them)
_PRETRAIN_FIXED = ("weight_decay", "max_grad_norm", "schedule")
_FINETUNE_FIXED = ("adam_beta2", "max_grad_norm", "schedule")


def add_pretrain(commands) -> None:
    from bertkit.pretraining.recipes import RECIPES
    from bertkit.pretraining.train import PretrainConfig

    pretrain = command(
        commands,
        "pretrain",
        "pre-train BERT (MLM + NSP) on prepared shards",
        description="Settings marked 'recipe' come from --recipe (default: the paper's; with "
        "--init-from, 'continue'); an explicit flag always wins. The laptop recipe: "
        + _recipe_line("laptop")
        + ". The continue recipe (continued pre-training of a released BERT on your domain: "
        "its own size and vocabulary): " + _recipe_line("continue"),
    )
    pretrain.add_argument(
        "--data",
        required=True,
        help="shards directory from bertkit prepare; with --init-from also a folder or file of "
        "raw text, tokenised with that checkpoint's vocabulary into OUT-shards",
    )
    pretrain.add_argument(
        "--out",
        required=True,
        help="checkpoint directory (config.json, model.safetensors, log.jsonl)",
    )
    pretrain.add_argument(
        "--recipe",
        choices=("paper", "laptop", "continue"),
        help="named settings (recipe 'paper' when not given, 'continue' with --init-from): "
        "'laptop' is the measured best per CPU-minute on 2 cores, see docs/results/recipe; "
        "'continue' continues a released checkpoint on your corpus",
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
    skip = ("budget_seconds", "progress", "phases", *_PRETRAIN_FIXED)
    add_flags(pretrain, PretrainConfig, skip=skip, recipes=RECIPES)
    pretrain.set_defaults(func=_pretrain)


# --------------------------------------------------------------------------- finetune, evaluate
def _finetune(args: argparse.Namespace) -> None:
    from bertkit.finetuning.runs import finetune_grid, finetune_seeds
    from bertkit.finetuning.train import FinetuneConfig, finetune, random_init_dir
    from bertkit.tasks import OWN_TASKS, check_data
    from bertkit.tasks.own import DataConfig

    files = from_flags(args, DataConfig)
    # your own tasks take the files, the paper's the folder; the other one given is refused
    given = (
        (args.data or files) if args.task in OWN_TASKS else (files.given() and files) or args.data
    )
    data: Any = check_data(args.task, given, required=True)
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
    config = from_flags(args, FinetuneConfig, random_init=args.config is not None)
    if args.grid:
        results = finetune_grid(args.task, args.model, data, args.out, config, args.seeds)
    elif args.seeds > 1:
        results = finetune_seeds(args.task, args.model, data, args.out, config, args.seeds)
    else:
        results = finetune(args.task, args.model, data, args.out, config)
    spread = ("dev_std", "dev_min", "dev_max", "selected")
    shown = {"task": args.task, "dev": results["dev"]} | {
        k: results[k] for k in spread if k in results
    }
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


def task_name(text: str) -> str:
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


def add_finetune(commands) -> None:
    from bertkit.finetuning.train import FinetuneConfig
    from bertkit.tasks import OWN_TASKS, PAPER_TASKS
    from bertkit.tasks.own import DataConfig

    finetune = command(
        commands,
        "finetune",
        "fine-tune on a task of the paper (GLUE, SQuAD, CoNLL-2003, SWAG) or your own files",
        description="The paper's tasks read their official files from --data DIR; "
        f"{', '.join(OWN_TASKS)} read your own files (--train, --validation, --test and the "
        "flags of 'your own data').",
    )
    finetune.add_argument(
        "task",
        type=task_name,
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
    add_flags(finetune, FinetuneConfig, skip=("progress", "random_init", *_FINETUNE_FIXED))
    own = finetune.add_argument_group(
        "your own data", f"files and columns for {', '.join(OWN_TASKS)} (see docs/usage.md)"
    )
    add_flags(own, DataConfig)
    finetune.set_defaults(func=_finetune)


def _evaluate(args: argparse.Namespace) -> None:
    from bertkit.finetuning.evaluation import EvaluateConfig, evaluate

    if args.retrieval:
        _evaluate_retrieval(args)
        return
    result = evaluate(args.model, args.data, from_flags(args, EvaluateConfig, progress=True))
    report = result.pop("report", None)
    print(json.dumps(result, indent=1))
    _print_reports({result.get("split", "dev"): report} if report else None)


def _evaluate_retrieval(args: argparse.Namespace) -> None:
    from bertkit.retrieval.beir import evaluate_retrieval

    split = args.split
    if split in ("dev", "validation") and not (Path(args.data) / "qrels" / "dev.tsv").exists():
        print("no qrels/dev.tsv: scoring qrels/test.tsv (--split test)", file=sys.stderr)
        split = "test"
    result = evaluate_retrieval(args.model, args.data, sparse_model=args.sparse_model,
                                maxsim_model=args.maxsim_model, full_text=args.full_text,
                                split=split, top=args.top, out=args.out,
                                batch_size=args.batch_size, device=args.device, progress=True)  # fmt: skip
    print(json.dumps(result, indent=1))


def add_evaluate(commands) -> None:
    from bertkit.finetuning.evaluation import EvaluateConfig

    evaluate = command(commands, "evaluate", "score a fine-tuned model on a split")
    evaluate.add_argument("--model", required=True, help="a directory `bertkit finetune` wrote")
    evaluate.add_argument(
        "--data",
        required=True,
        help="the paper's tasks: folder with the official files; your own data: a file, read "
        "as the training files were (its labels scored when it has them)",
    )
    evaluate.add_argument("--task", type=task_name, help="default: the model's own task")
    evaluate.add_argument(
        "--retrieval", action="store_true",
        help="score an embedding model's retrieval on a BEIR folder (corpus.jsonl, "
        "queries.jsonl, qrels/SPLIT.tsv): nDCG@10, MRR@10, recall@1/10/100",
    )  # fmt: skip
    evaluate.add_argument("--top", type=int, default=100, help="--retrieval: documents ranked")
    evaluate.add_argument(
        "--sparse-model",
        help="--retrieval: hybrid search, a sparse (SPLADE) model's ranking fused with the "
        "model's by reciprocal rank (each part's own scores reported too)",
    )
    evaluate.add_argument(
        "--full-text",
        action="store_true",
        help="--retrieval: hybrid search, BM25's ranking (LanceDB's full-text index) fused in",
    )
    evaluate.add_argument(
        "--maxsim-model",
        help="--retrieval: rerank each query's documents by late interaction (MaxSim) with a "
        "multi-vector (ColBERT) model",
    )
    add_flags(evaluate, EvaluateConfig, skip=("task", "progress"))
    evaluate.set_defaults(func=_evaluate)


ADDERS = (add_vocab, add_convert, add_prepare, add_pretrain, add_finetune, add_evaluate)
