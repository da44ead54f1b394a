"""The subcommands that use models: predict, export, serve, fill-mask, similarity, attention,
extract, viz, demo. Each has a function adding its parser and a handler calling one library
function."""

from __future__ import annotations

import argparse
import json
import sys

from bertkit.settings import QUANTIZATIONS, add_flags, command, from_flags


# --------------------------------------------------------------------------- predict, export, serve
def _predict(args: argparse.Namespace) -> None:
    from bertkit.inference.predict import PredictConfig, Predictor, predict_file

    if args.input is not None and (args.text or args.question or args.context):
        raise ValueError("give texts on the command line or --input FILE, not both")
    if not _fine_tuned(args.model):
        _predict_by_embedding(args)
        return
    if args.input is not None and _folder(args.output):
        _predict_corpus(args)
        return
    if args.input is not None and len(args.input) > 1:
        raise ValueError("several --input files are predicted into a folder: --out FOLDER")
    predictor = Predictor(args.model, from_flags(args, PredictConfig, progress=not args.quiet))
    if args.input is not None:
        args.input = args.input[0]
        count = predict_file(predictor, args.input, args.output)
        if count == 0:  # (a header alone: its columns were never checked against the model's)
            print(f"warning: {args.input}: no rows to predict", file=sys.stderr)
        if args.output not in (None, "-"):
            print(f"wrote {args.output} ({count:,} rows)", file=sys.stderr)
        return
    items = predictor.items_from(None, args.text, args.question, args.context)
    for result in predictor(items):
        print(json.dumps(result, ensure_ascii=False))


def _fine_tuned(model: str) -> bool:
    """Whether `model` is a fine-tuned folder (its task record, or the task head a folder
    transformers or sentence-transformers saved names); an embedding model (a
    sentence-transformers folder) is not, and anything else is refused here by name."""
    from bertkit._io import TASK_FILE
    from bertkit.core.hub import model_dir
    from bertkit.tasks.saved import has_task

    path = model_dir(model)
    if not path.is_dir() or has_task(path):
        return True  # (a missing folder: the loader names what is missing)
    if (path / "modules.json").exists():
        return False
    raise ValueError(
        f"{model}: neither a fine-tuned model (no {TASK_FILE}, and its config.json names no "
        "classifier, tagger or reader) nor a sentence-embedding model (no modules.json): "
        f"fine-tune it first (bertkit finetune TASK --model {model} "
        f"...), or embed texts with it: bertkit embed --model {model} --pooling mean ..."
    )


def _folder(output: str | None) -> bool:
    """An --output that names a folder: one that exists, ends in /, or has no extension."""
    from pathlib import Path

    if output in (None, "-"):
        return False
    path = Path(output)
    return path.is_dir() or str(output).endswith("/") or path.suffix == ""


def _job_config(args: argparse.Namespace, cls: type):
    """A corpus job's settings from predict's flags: the job's own and predict's (its reading
    of --input where a flag sets it, batch, device, precision), a text column of "text" unless
    one is named."""
    from bertkit.rows import FileConfig
    from bertkit.settings import field_names, from_values

    reading, names = field_names(FileConfig), field_names(cls)
    given = {k: v for k, v in vars(args).items()
             if k in names and not (k in reading and v is None)}  # fmt: skip
    return from_values(cls, given | {"progress": not args.quiet,
                                     "text_column": args.text_column or "text"})  # fmt: skip


def _predict_corpus(args: argparse.Namespace) -> None:
    from bertkit.jobs.config import PredictJobConfig
    from bertkit.jobs.predict import predict_corpus

    config = _job_config(args, PredictJobConfig)
    manifest = predict_corpus(args.model, args.input, args.output, config, ray=args.ray)
    print(f"wrote {args.output}: {manifest['rows']:,} rows in {len(manifest['shards'])} shards",
          file=sys.stderr)  # fmt: skip


def _predict_by_embedding(args: argparse.Namespace) -> None:
    """A sentence-embedding model's answer is its vector: a folder of shards (`embed`), JSON
    lines of each row with its vector, or each text given with its vector."""
    from bertkit.jobs.config import EmbedConfig
    from bertkit.jobs.embed import EmbeddingMapper, embed, embed_to_file

    config = _job_config(args, EmbedConfig)
    if args.input is not None and _folder(args.output):
        manifest = embed(args.model, args.input, args.output, config, ray=args.ray)
        print(f"wrote {args.output}: {manifest['rows']:,} vectors", file=sys.stderr)
    elif args.input is not None:
        count = embed_to_file(args.model, args.input, args.output, config)
        if args.output not in (None, "-"):
            print(f"wrote {args.output} ({count:,} rows)", file=sys.stderr)
    else:
        if not args.text:
            raise ValueError("give texts to embed, or --input FILE")
        answers = EmbeddingMapper(args.model, config).answers(list(args.text))
        for text, answer in zip(args.text, answers, strict=True):
            print(json.dumps({"text": text, **answer}, ensure_ascii=False))


def add_predict(commands) -> None:
    from bertkit.inference.predict import PredictConfig
    from bertkit.jobs.config import PREDICT_OWN, JobConfig

    predict = command(commands, "predict", "labels, spans or tags for raw text")
    predict.add_argument("--model", required=True, help="a directory `bertkit finetune` wrote")
    predict.add_argument("text", nargs="*", help="sentences (a pair task: exactly two)")
    predict.add_argument("--question", help="SQuAD: the question")
    predict.add_argument("--context", help="SQuAD: the paragraph")
    predict.add_argument(
        "--input",
        nargs="+",
        help="a file to predict row by row, streaming: CSV, TSV, JSON Lines, JSON, Parquet, a "
        "datasets folder; the task's own files (GLUE's TSV, SQuAD's JSON, SWAG's CSV, a "
        "tagger's CoNLL columns); - reads stdin, one text a line. JSON lines may be "
        '{"text": ..., "text_pair": ...}, {"question": ..., "context": ...}, a list of words '
        '(tagging) or {"context": ..., "choices": [...]}',
    )
    predict.add_argument(
        "--out",
        "--output",
        dest="output",
        metavar="OUT",
        help="with --input: .jsonl or .csv/.tsv to write (input columns, then the answer), or a "
        "tagger's .conll (a word a line, the file's tag, the predicted one); a FOLDER (no "
        "extension): Parquet shards and a manifest, resumable, for corpora of any size (several "
        "--input files or globs); default: JSON lines on stdout",
    )
    corpus = predict.add_argument_group("with --out FOLDER (a corpus job, as bertkit embed)")
    add_flags(corpus, JobConfig, skip=PREDICT_OWN)
    corpus.add_argument(
        "--ray",
        nargs="?",
        const="auto",
        metavar="ADDRESS",
        help="run on a Ray cluster (pip install 'bertkit[ray]')",
    )
    predict.add_argument("--quiet", action="store_true", help="no progress bar")
    add_flags(predict, PredictConfig, skip=("progress",))
    predict.set_defaults(func=_predict)


def _export(args: argparse.Namespace) -> None:
    from bertkit.inference.export import export_onnx

    model = model_of(args, "export")
    outs = {o for o in (args.out, args.out_positional) if o is not None}
    if len(outs) != 1:
        raise ValueError("give one output folder: bertkit export --model MODEL --out FOLDER")
    path = export_onnx(
        model, outs.pop(), quantize=args.quantize, opset=args.opset, overwrite=args.overwrite
    )
    print(f"wrote {path}" + (" (int8)" if args.quantize else ""))


def model_argument(parser: argparse.ArgumentParser, help: str) -> None:
    """The model as every command takes it, `--model M`, and, for the commands that took it so
    first, as the first word (`bertkit serve M`); `model_of` reads either."""
    parser.add_argument("--model", dest="model_flag", metavar="MODEL", help=help)
    parser.add_argument("model", nargs="?", help="the same as --model (the older spelling)")


def model_of(args: argparse.Namespace, parser_name: str) -> str:
    given = {m for m in (args.model_flag, args.model) if m is not None}
    if not given:
        raise ValueError(f"give the model: bertkit {parser_name} --model MODEL")
    if len(given) > 1:
        raise ValueError(f"two models given ({args.model_flag} and {args.model}): give one")
    return given.pop()


def add_export(commands) -> None:
    export = commands.add_parser("export", help="export a checkpoint for serving (ONNX)")
    export.add_argument(
        "--onnx", action="store_true", help="to ONNX (the one format, and the default)"
    )
    model_argument(export, "a checkpoint directory (a fine-tuned model or an encoder)")
    export.add_argument("out_positional", nargs="?", metavar="OUT", help="the same as --out")
    export.add_argument("--out", help="output folder (model.onnx + what Predictor needs)")
    export.add_argument(
        "--quantize", choices=QUANTIZATIONS, help="int8 dynamic quantisation of the linear layers"
    )
    export.add_argument("--opset", type=int, default=17)
    export.add_argument("--overwrite", action="store_true", help="replace what OUT holds")
    export.set_defaults(func=_export)


def _serve(args: argparse.Namespace) -> None:
    from bertkit.serve import ServeConfig, serve

    serve(model_of(args, "serve"), from_flags(args, ServeConfig), access_log=args.verbose)


def add_serve(commands) -> None:
    from bertkit.serve.config import ServeConfig
    from bertkit.serve.routes import ENDPOINTS

    routes = ", ".join(f"/{e}" for e in ENDPOINTS)
    serve = command(commands, "serve", f"an HTTP API with dynamic batching ({routes}, and / as "
                    "the model's own route; each as the model allows)")  # fmt: skip
    model_argument(serve, "a fine-tuned model, an encoder, or an ONNX export (folder or Hub name)")
    add_flags(serve, ServeConfig)
    serve.set_defaults(func=_serve)


# --------------------------------------------------------------------------- insight
def _fill_mask(args: argparse.Namespace) -> None:
    from bertkit.inference.fill_mask import FillMask, FillMaskConfig
    from bertkit.rows import read_jsonl

    items = read_jsonl(args.input) if args.input else list(args.text)
    if not items:
        raise ValueError('give texts with [MASK] ("The capital of France is [MASK].") or --input')
    fill = FillMask(args.model, from_flags(args, FillMaskConfig))
    for item, masks in zip(items, fill(items), strict=True):
        text = {"text": item} if isinstance(item, str) else {"text": item[0], "text_pair": item[1]}
        print(json.dumps({**text, "masks": masks}, ensure_ascii=False))


def add_fill_mask(commands) -> None:
    from bertkit.inference.fill_mask import FillMaskConfig

    fill = command(
        commands, "fill-mask", "the most likely pieces for each [MASK] of a text (MLM head)"
    )
    fill.add_argument("--model", required=True, help="a checkpoint with its MLM head")
    fill.add_argument("text", nargs="*", help="texts with one or more [MASK]s")
    fill.add_argument("--input", help='JSON lines: "text" or {"text": ..., "text_pair": ...}')
    add_flags(fill, FillMaskConfig)
    fill.set_defaults(func=_fill_mask)


def _similarity(args: argparse.Namespace) -> None:
    from bertkit.inference.insight import similarity

    layer = args.layer if args.layer in ("last", "all") else int(args.layer)
    result = similarity(args.model, args.text, layer=layer, pooling=args.pooling, word=args.word)
    result.save_png(args.out)
    print(json.dumps({**result.to_json(), "png": str(args.out)}, ensure_ascii=False))


def add_similarity(commands) -> None:
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


def _attention(args: argparse.Namespace) -> None:
    from bertkit.inference.insight import attention

    result = attention(args.model, args.text, args.pair)
    if str(args.out).lower().endswith((".html", ".htm")):
        result.save_html(args.out)
    else:
        result.save_png(args.out, layer=args.layer, head=args.head)
    print(args.out)


def add_attention(commands) -> None:
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


def _extract(args: argparse.Namespace) -> None:
    from bertkit.inference.features import ExtractConfig, extract_file

    path, features = extract_file(args.model, args.input, args.out,
                                  from_flags(args, ExtractConfig))  # fmt: skip
    widths = {s: tuple(v[0].shape[1:]) for s, v in features.items()}
    items = len(next(iter(features.values())))
    print(f"wrote {path}: {items} items, features {widths}")


def add_extract(commands) -> None:
    from bertkit.inference.features import ExtractConfig

    extract = command(
        commands, "extract", "frozen per-token features from chosen layers (feature-based approach)"
    )
    extract.add_argument("--model", required=True, help="checkpoint directory")
    extract.add_argument("--input", required=True, help="one text per line (or --conll FILE)")
    extract.add_argument("--out", required=True, help="output .safetensors file")
    add_flags(extract, ExtractConfig)
    extract.set_defaults(func=_extract)


# --------------------------------------------------------------------------- viz, demo
def _viz(args: argparse.Namespace) -> None:
    from pathlib import Path

    from bertkit.viz import plot_log

    if not Path(args.log).is_file():
        raise FileNotFoundError(f"{args.log}: no such file (a log.jsonl of a run)")
    path = plot_log(args.log, args.out, title=args.title or "")
    if path is None:
        raise ValueError(f"{args.log}: no training entries to plot")
    print(f"wrote {path}")


def add_viz(commands) -> None:
    viz = commands.add_parser("viz", help="plot the curves of a run's log.jsonl as a PNG")
    viz.add_argument("log", help="a log.jsonl of bertkit pretrain or finetune")
    viz.add_argument("--out", default="curves.png")
    viz.add_argument("--title")
    viz.set_defaults(func=_viz)


def _demo(args: argparse.Namespace) -> None:
    from bertkit.cli.demo import run_demo
    from bertkit.pretraining.train import parse_budget

    run_demo(
        args.out,
        corpus=args.corpus or None,
        budget_seconds=parse_budget(args.budget),
        max_steps=args.steps,
    )


def add_demo(commands) -> None:
    demo = commands.add_parser("demo", help="run the main job on the embedded default corpus")
    demo.add_argument("corpus", nargs="*", help="text files to use instead of the default corpus")
    demo.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    demo.add_argument(
        "--budget", default="2m", help="pre-training time (training only; default 2m)"
    )
    demo.add_argument("--steps", type=int, help="stop after this many steps if sooner")
    demo.set_defaults(func=_demo)


ADDERS = (add_predict, add_export, add_serve, add_fill_mask, add_similarity, add_attention,
          add_extract, add_viz, add_demo)  # fmt: skip
