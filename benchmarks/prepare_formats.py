"""`bertkit prepare` on one corpus as it is published in each format: the same shards, its speed
and its memory.

    BERTKIT_DATA=../shared/data python benchmarks/prepare_formats.py --files 30 \
        --out docs/results/corpus/prepare_formats.json

The first N files of the shared Wikipedia (2015) corpus, each document a record (its
paragraphs, one a line), written as JSON Lines, JSON Lines compressed with gzip, zstd, bz2 and
xz, and Parquet; each prepared by `bertkit prepare` as a command (the bert-base-uncased
vocabulary, the usable cores as workers, the run's peak resident memory read from its own
/proc/self/status). Printed: MB of text a second, documents a second, peak memory, and whether
every shard file equals the plain JSON Lines run's.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _args import DATA, arguments
from _harness import emit
from machine import line as machine_line

PEAK = (
    "import sys; from bertkit.cli import main; rc = main(sys.argv[1:]); "
    "peak = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0]; "
    "print('peak', peak.split()[1], file=sys.stderr); sys.exit(rc)"
)


def write_formats(files: int, scratch: Path) -> tuple[dict[str, Path], int, int]:
    """The corpus in each format; its bytes of text and documents."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    from bertkit.pretraining.corpus import raw_documents

    data = DATA / "corpus" / "wikipedia_2015"
    texts = ["\n".join(paragraphs) for paragraphs, _ in
             raw_documents(sorted((data / "AA").glob("wiki_*"))[:files], format="wiki")]  # fmt: skip
    plain = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    paths = {name: scratch / f"corpus{suffix}" for name, suffix in (
        ("jsonl", ".jsonl"), ("gzip", ".jsonl.gz"), ("zstd", ".jsonl.zst"),
        ("bz2", ".jsonl.bz2"), ("xz", ".jsonl.xz"), ("parquet", ".parquet"))}  # fmt: skip
    paths["jsonl"].write_bytes(plain)
    paths["gzip"].write_bytes(gzip.compress(plain))
    paths["zstd"].write_bytes(zstandard.ZstdCompressor().compress(plain))
    paths["bz2"].write_bytes(bz2.compress(plain))
    paths["xz"].write_bytes(lzma.compress(plain))
    pq.write_table(pa.table({"text": texts}), paths["parquet"], row_group_size=1000)
    return paths, sum(len(t.encode()) for t in texts), len(texts)


def prepare(argv: list[str]) -> tuple[float, int]:
    """Seconds and peak resident KB of `bertkit` with `argv`."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PEAK, *argv], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    return time.perf_counter() - started, int(done.stderr.split("peak")[-1].split()[0])


def shard_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix != ".json"}


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--files", type=int, default=30)
    parser.add_argument("--scratch", type=Path, default=Path(tempfile.gettempdir()) / "prep_fmt")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    shutil.rmtree(args.scratch, ignore_errors=True)
    args.scratch.mkdir(parents=True)
    vocab = DATA / "vocab" / "bert-base-uncased"
    paths, text_bytes, documents = write_formats(args.files, args.scratch)
    cores = len(os.sched_getaffinity(0))
    print(machine_line(), f"| {cores} workers | {text_bytes / 1e6:.1f} MB of text, "
          f"{documents:,} documents", flush=True)  # fmt: skip
    report: dict = {"machine": machine_line(), "workers": cores, "text_mb": round(text_bytes / 1e6, 1),
                    "documents": documents, "formats": {}}  # fmt: skip
    expected = None
    for name, path in paths.items():
        out = args.scratch / f"shards-{name}"
        seconds, peak = prepare(["prepare", str(path), "--vocab", str(vocab), "--out", str(out),
                                 "--workers", str(cores)])  # fmt: skip
        found = shard_bytes(out)
        expected = expected or found
        report["formats"][name] = {
            "file_mb": round(path.stat().st_size / 1e6, 1),
            "seconds": round(seconds, 1),
            "text_mb_per_s": round(text_bytes / 1e6 / seconds, 2),
            "documents_per_s": round(documents / seconds, 1),
            "peak_rss_mb": round(peak / 1024, 1),
            "same_shards_as_jsonl": found == expected,
        }
        print(name, report["formats"][name], flush=True)
    emit(report, args.out)


if __name__ == "__main__":
    main()
