"""The subcommands over a corpus: embed (vectors of every row, in shards), index (a LanceDB
table of them) and search (a query's nearest rows)."""

from __future__ import annotations

import argparse
import json
import sys

from bertkit.settings import add_flags, command, from_flags


def _add_inputs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--input", nargs="+", metavar="FILE",
        help="files or globs ('docs/*.jsonl'), read in order: CSV, TSV, JSON Lines, JSON, "
        "Parquet, datasets folders",
    )  # fmt: skip
    parser.add_argument("--dataset", help="a dataset by name (NAME[:CONFIG]) from the local cache")
    parser.add_argument("--split", default="train", help="with --dataset: the split")
    parser.add_argument(
        "--ray", nargs="?", const="auto", metavar="ADDRESS",
        help="run on a Ray cluster (pip install 'bertkit[ray]'): its address, or none to join "
        "the cluster this machine is in (else start one here)",
    )  # fmt: skip


def _embed(args: argparse.Namespace) -> None:
    from bertkit.jobs.config import EmbedConfig
    from bertkit.jobs.embed import embed

    config = from_flags(args, EmbedConfig, progress=not args.quiet)
    manifest = embed(args.model, args.input, args.out, config, dataset=args.dataset,
                     split=args.split, ray=args.ray)  # fmt: skip
    issues = ", ".join(f"{n:,} {k}" for k, n in manifest["issues"].items()) or "none"
    print(f"wrote {args.out}: {manifest['rows']:,} rows in {len(manifest['shards'])} shards "
          f"(issues: {issues}; each listed in manifest.json)", file=sys.stderr)  # fmt: skip
    if args.index:
        from bertkit.retrieval.index import build_index

        table = build_index(args.out, args.index, overwrite=config.overwrite)
        print(f"wrote {args.index} ({table} rows)", file=sys.stderr)


def add_embed(commands) -> None:
    from bertkit.jobs.config import EmbedConfig

    embed = command(commands, "embed", "a vector for every row of a corpus, in Parquet shards")
    embed.add_argument(
        "--model", required=True,
        help="a sentence-transformers folder or Hub name, a bertkit embedding model, or any BERT "
        "(with --pooling)",
    )  # fmt: skip
    _add_inputs(embed)
    embed.add_argument("--out", required=True, help="the output folder (shards, manifest.json)")
    embed.add_argument("--index", metavar="TABLE", help="then index the vectors (a .lance path)")
    embed.add_argument("--quiet", action="store_true", help="no progress bar")
    add_flags(embed, EmbedConfig, skip=("progress",))
    embed.set_defaults(func=_embed)


def _index(args: argparse.Namespace) -> None:
    from bertkit.retrieval.index import build_index

    rows = build_index(args.vectors, args.out, overwrite=args.overwrite, ann=args.ann,
                       partitions=args.partitions, full_text=args.full_text)  # fmt: skip
    print(f"wrote {args.out} ({rows:,} rows)", file=sys.stderr)


def add_index(commands) -> None:
    index = commands.add_parser("index", help="a LanceDB table of the vectors `embed` wrote")
    index.add_argument("vectors", help="a folder `bertkit embed` wrote")
    index.add_argument("--out", required=True, help="the table to write (a .lance path)")
    index.add_argument(
        "--ann", choices=("auto", "yes", "no"), default="auto",
        help="an approximate-nearest-neighbour index (IVF-PQ); auto: for tables of 10,000 "
        "rows or more (smaller ones are searched exactly)",
    )  # fmt: skip
    index.add_argument("--partitions", type=int, help="IVF partitions (default: about √rows)")
    index.add_argument("--overwrite", action="store_true", help="replace the table")
    index.add_argument(
        "--full-text", action="store_true",
        help="a full-text (BM25) index of the kept text column too, for hybrid search",
    )  # fmt: skip
    index.set_defaults(func=_index)


def _search(args: argparse.Namespace) -> None:
    from bertkit.retrieval.index import Searcher

    searcher = Searcher(args.index, args.model, rerank=args.rerank, sparse=args.sparse_index,
                        full_text=args.full_text, maxsim=args.maxsim)  # fmt: skip
    for query in args.query:
        for hit in searcher(query, top=args.top, exact=args.exact):
            print(json.dumps({"query": query, **hit}, ensure_ascii=False))


def add_search(commands) -> None:
    search = commands.add_parser("search", help="the rows of an index nearest to a query")
    search.add_argument("query", nargs="+", help="one or more queries")
    search.add_argument("--index", required=True, help="a table `bertkit index` wrote")
    search.add_argument(
        "--model", help="the embedding model (default: the one the vectors were made with)"
    )
    search.add_argument("--top", type=int, default=10, help="rows to return")
    search.add_argument("--rerank", help="a cross-encoder to reorder the hits with")
    search.add_argument("--exact", action="store_true", help="exact search, not the ANN index")
    search.add_argument(
        "--sparse-index", metavar="TABLE",
        help="hybrid: a table of sparse (SPLADE) vectors of the same rows, its ranking fused "
        "with the index's by reciprocal rank",
    )  # fmt: skip
    search.add_argument(
        "--full-text", action="store_true",
        help="hybrid: the index's full-text (BM25) ranking fused in (index --full-text)",
    )  # fmt: skip
    search.add_argument(
        "--maxsim", metavar="TABLE",
        help="rerank the hits by late interaction (MaxSim) with a table of per-token vectors "
        "of the same rows (embed --multi-vector, then index)",
    )  # fmt: skip
    search.set_defaults(func=_search)


ADDERS = (add_embed, add_index, add_search)
