"""A job's output folder: Parquet shards of a fixed number of rows, each written atomically,
and `manifest.json`.

The manifest is written first (complete: false) with everything the shards depend on — the
job, the model's digest, its settings, the inputs' digests, rows per shard — and again when the
last shard is in (complete: true, each shard's rows and SHA-256, the rows with an issue). A
resumed job compares what it would write now with what the folder's manifest says and refuses
any difference by name; shards already there are kept.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bertkit._io import atomic_path, atomic_write_text, sha256_of
from bertkit.errors import JobFailed

MANIFEST = "manifest.json"
ISSUES = "issues.jsonl"
FORMAT = "bertkit-corpus-job/1"


def shard_name(number: int) -> str:
    """shard_name(7) -> 'part-00007.parquet'"""
    return f"part-{number:05d}.parquet"


def shard_number(path: str | os.PathLike) -> int | None:
    name = Path(path).name
    if name.startswith("part-") and name.endswith(".parquet"):
        try:
            return int(name[5:-8])
        except ValueError:
            return None
    return None


def write_shard(directory: Path, number: int, table: Any) -> Path:
    """`table` (a pyarrow Table) as shard `number`, atomically: a killed write leaves no
    shard (and a temporary file the next start removes)."""
    import pyarrow.parquet as pq

    path = directory / shard_name(number)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return path


def done_shards(directory: Path) -> set[int]:
    """The shards already written."""
    return {n for p in directory.glob("part-*.parquet") if (n := shard_number(p)) is not None}


def clean_partial(directory: Path) -> None:
    """Remove what killed writes left (temporary files of atomic writes)."""
    for leftover in directory.glob(".*.tmp"):
        leftover.unlink(missing_ok=True)


def finished_vectors(directory: Path) -> dict[str, Any]:
    """The manifest of the finished embedding job in `directory` — what an index and retrieval
    scoring read; a folder without one, an unfinished job or a job of answers refused by name."""
    manifest = read_manifest(directory)
    if manifest is None or not manifest.get("complete"):
        raise ValueError(f"{directory}: not a finished `bertkit embed` job (its manifest.json is "
                         "missing or says it is incomplete: --resume it first)")  # fmt: skip
    kind = manifest["plan"].get("kind")
    if kind != "embed":
        raise ValueError(f"{directory}: holds {kind} answers, not vectors")
    return manifest


def read_manifest(directory: Path) -> dict[str, Any] | None:
    path = directory / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not a manifest bertkit wrote ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: not a manifest of a bertkit corpus job")
    return manifest


def start(directory: Path, plan: dict[str, Any], *, resume: bool, overwrite: bool) -> set[int]:
    """Make `directory` ready for the job `plan` describes; the shards already done (resume)."""
    directory.mkdir(parents=True, exist_ok=True)
    found = read_manifest(directory)
    shards = done_shards(directory)
    if found is not None or shards:
        if overwrite:
            for path in directory.glob("part-*.parquet"):
                path.unlink()
            (directory / MANIFEST).unlink(missing_ok=True)
            (directory / ISSUES).unlink(missing_ok=True)
            found, shards = None, set()
        elif not resume:
            raise FileExistsError(
                f"{directory}: holds a job's output already; --resume to continue it, "
                "--overwrite to start again"
            )
    if found is not None:
        differences = differ(found.get("plan", {}), plan)
        if differences:
            raise ValueError(
                f"{directory}: cannot resume: {'; '.join(differences)} (--overwrite to start "
                "again, or another --out)"
            )
    elif shards:
        raise ValueError(f"{directory}: shards without a manifest: not this job's folder")
    clean_partial(directory)
    if found is None:
        atomic_write_text(directory / MANIFEST, _dumps({"format": FORMAT, "complete": False,
                                                        "plan": plan}))  # fmt: skip
    return shards


def differ(was: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between the plan a folder was started with and this one, by name.

    >>> differ({"model": {"sha256": "a"}, "rows_per_shard": 10},
    ...        {"model": {"sha256": "b"}, "rows_per_shard": 10})
    ['the model is another (sha256 a… then, b… now)']
    """
    said = []
    model_was, model_now = was.get("model", {}), now.get("model", {})
    if model_was.get("sha256") != model_now.get("sha256"):
        said.append(f"the model is another (sha256 {str(model_was.get('sha256'))[:12]}… then, "
                    f"{str(model_now.get('sha256'))[:12]}… now)")  # fmt: skip
    inputs_was = {i["path"]: i for i in was.get("inputs", [])}
    inputs_now = {i["path"]: i for i in now.get("inputs", [])}
    if list(inputs_was) != list(inputs_now):
        said.append(f"the inputs are other files ({', '.join(inputs_was)} then, "
                    f"{', '.join(inputs_now)} now)")  # fmt: skip
    else:
        changed = [p for p in inputs_now if inputs_now[p]["sha256"] != inputs_was[p]["sha256"]]
        if changed:
            said.append(f"{', '.join(changed)} changed since (another SHA-256)")
    for key in sorted(set(was) | set(now)):
        if key in ("model", "inputs"):
            continue
        if was.get(key) != now.get(key):
            said.append(f"{key} was {was.get(key)!r}, now {now.get(key)!r}")
    return said


def finish(directory: Path, plan: dict[str, Any], count: int) -> dict[str, Any]:
    """Write the complete manifest: every shard's rows and SHA-256, the count of each issue,
    and every row with an issue in `issues.jsonl` beside it ({"id", "source", "line",
    "issue"} a line). Reads only the shards' small columns and their footers, and streams the
    issues out: constant memory in the corpus."""
    import pyarrow.parquet as pq

    shards, rows = [], 0
    totals: dict[str, int] = {}
    with atomic_path(directory / ISSUES) as tmp, open(tmp, "w", encoding="utf-8") as listed:
        for number in range(count):
            path = directory / shard_name(number)
            if not path.exists():
                raise JobFailed(f"{path}: missing at the end of the job (no worker wrote it)")
            table = pq.ParquetFile(path).read(columns=["id", "issue", "source", "line"])
            shards.append({"file": path.name, "rows": table.num_rows, "first_row": rows,
                           "sha256": sha256_of(path)})  # fmt: skip
            rows += table.num_rows
            columns = [table.column(c).to_pylist() for c in ("id", "issue", "source", "line")]
            for key, issue, source, line in zip(*columns, strict=True):
                if issue is None:
                    continue
                kind = issue.split(":", 1)[0]
                totals[kind] = totals.get(kind, 0) + 1
                record = {"id": key, "source": source, "line": line, "issue": issue}
                listed.write(json.dumps(record, ensure_ascii=False) + "\n")
    manifest = {"format": FORMAT, "complete": True, "plan": plan, "rows": rows,
                "shards": shards, "issues": totals, "rows_with_issues": ISSUES}  # fmt: skip
    atomic_write_text(directory / MANIFEST, _dumps(manifest))
    return manifest


def issues(directory: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows with an issue a finished job listed (issues.jsonl)."""
    path = Path(directory) / ISSUES
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _dumps(value: Any) -> str:
    return json.dumps(value, indent=1, ensure_ascii=False) + "\n"


def vectors(directory: str | os.PathLike, columns: Sequence[str] = ("id", "vector")) -> Any:
    """A finished job's shards as one pyarrow Table (for tests and small corpora)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory = Path(directory)
    tables = [
        pq.read_table(p, columns=list(columns)) for p in sorted(directory.glob("part-*.parquet"))
    ]
    return pa.concat_tables(tables) if tables else None
