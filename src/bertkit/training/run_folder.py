"""A run's folder, apart from the loop that fills it: who may write it (`claim_folder`), what the
run is (`run.json`), its state (`trainer_state.pt`) saved and loaded with its checksums
(`trainer_state.sha256`), and its log (`log.jsonl`).

A state is one file written to a temporary name and renamed; the checksum file lists the
previous state's SHA-256 and the new one's and is written before the rename, so a kill at any
moment leaves a state whose checksum is listed. The model file's SHA-256 is recorded beside it:
a resumed run finds a model file that is not its state's and writes it again.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertkit._io import (
    DIGEST_FILE,
    MODEL_FILE,
    STATE_FILE,
    atomic_path,
    atomic_write_text,
    read_digests,
    sha256_of,
)

logger = logging.getLogger("bertkit")
LOG_FILE = "log.jsonl"
RUN_FILE = "run.json"  # what the run is (TrainingConfig.identity), written before its first step

# What fixes a run's learning-rate schedule: a resumed run must bring the same values.
SCHEDULE_FIELDS = (
    "max_steps",
    "budget_seconds",
    "learning_rate",
    "warmup_steps",
    "warmup_fraction",
    "schedule",
)


def claim_folder(
    out: Path, identity: dict[str, Any], *, resume: bool, flags: dict[str, str] | None = None
) -> None:
    """Refuse, before any work, an output folder that a run (`identity`: TrainingConfig's)
    must not write to. Without `resume`, a folder holding a run in progress. With it: a folder
    whose run.json records other settings (another run's: the differences are named, with
    their `flags`), and a model without a trainer state unless run.json says it is this run's
    and that no checkpoint was written yet. That is a run killed during its first save: it
    starts again from step 0, which reaches the uninterrupted run's result. A model with no
    record is someone's, and a recorded checkpoint that is gone was deleted: never overwritten."""
    state = (out / STATE_FILE).exists()
    if not resume:
        if state:
            raise FileExistsError(
                f"{out}: holds a run in progress; pass --resume to continue it or pick another "
                "--out"
            )
        return
    record = read_run_record(out)
    recorded = record["identity"] if record is not None else None
    if recorded is not None and recorded != identity:
        flags, before, now = flags or {}, _leaves(recorded), _leaves(identity)
        changed = [
            f"{key} = {before.get(key)}, not {now.get(key)}"
            + (f" ({flags[key]})" if key in flags else "")
            for key in sorted(set(before) | set(now))
            if before.get(key) != now.get(key)
        ]
        raise ValueError(
            f"{out}: holds a run started with other settings ({'; '.join(changed)}), so this "
            f"would not continue it (a changed step count, rate or warm-up would also bend its "
            f"learning-rate schedule mid-run). Resume with the settings it was started with, "
            f"start a new run from its weights with a fresh schedule (bertkit pretrain "
            f"--init-from {out} --out NEW), or pick another --out"
        )
    if not state and (out / MODEL_FILE).exists():
        if record is None:
            why = f"no {RUN_FILE} says this run wrote it"
        elif record.get("checkpoint_step") is not None:
            why = f"its checkpoint of step {record['checkpoint_step']} is gone (deleted?)"
        else:  # this run's own, killed during its first save
            return
        raise FileExistsError(
            f"{out}: holds a model but no {STATE_FILE} ({why}), so there is nothing to resume, "
            f"and starting afresh would overwrite the model. Continue from its weights with a "
            f"fresh schedule (--init-from {out} --out NEW), or pick another --out"
        )


def _leaves(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested values by dotted name: _leaves({"a": 1, "b": {"c": 2}}) -> {"a": 1, "b.c": 2}"""
    leaves: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            leaves.update(_leaves(value, f"{prefix}{key}."))
        else:
            leaves[prefix + key] = value
    return leaves


def read_run_record(out: Path) -> dict[str, Any] | None:
    """OUT/run.json: the run's `identity` and `checkpoint_step`, the step of the last state
    written (None: none yet); None where there is no record. A record that cannot be read
    names the file (it is written atomically: only a hand edit breaks it)."""
    path = out / RUN_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a run record ({err}); delete it to resume anyway") from None
    if not isinstance(record, dict) or not isinstance(record.get("identity"), dict):
        raise ValueError(f'{path}: not a run record (expected {{"identity": {{...}}}})')
    return record


def write_run_record(out: Path, identity: dict[str, Any] | None, step: int | None) -> None:
    """run.json: the run's identity and the step of its last state (claim_folder)."""
    if identity is not None:
        atomic_write_text(
            out / RUN_FILE, json.dumps({"identity": identity, "checkpoint_step": step})
        )


def clear_leftovers(out: Path) -> None:
    """The temporary files of writes a kill cut short."""
    for leftover in out.glob(".*.tmp"):
        leftover.unlink(missing_ok=True)


def write_state(out: Path, state: dict[str, Any], model_digest: str | None) -> None:
    """`state` to OUT/trainer_state.pt atomically, its checksum (and the model file's) listed
    in trainer_state.sha256 before it is renamed into place."""
    with atomic_path(out / STATE_FILE) as tmp:
        torch.save(state, tmp)
        digests = _read_digests(out / DIGEST_FILE)[-1:] + [sha256_of(tmp)]
        record: dict[str, Any] = {"sha256": digests}
        if model_digest is not None:
            record[MODEL_FILE] = model_digest
        atomic_write_text(out / DIGEST_FILE, json.dumps(record))


def read_state(
    out: Path, schedule_values: dict[str, Any], flag: Callable[[str], str]
) -> dict[str, Any] | None:
    """OUT's trainer state (None: none), refused when its checksum is not the recorded one, when
    it cannot be read, or when it was started with another schedule (`schedule_values`; `flag`
    names the setting that would have to match)."""
    path = out / STATE_FILE
    if not path.exists():
        return None
    digests = _read_digests(out / DIGEST_FILE)
    if digests and sha256_of(path) not in digests:  # (runs from before digests have none)
        raise ValueError(
            f"{path}: the file is corrupt (its SHA-256 is not the one recorded in "
            f"{DIGEST_FILE} when it was written); restore it from a copy, or delete it and "
            f"{DIGEST_FILE} to start the run afresh"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise ValueError(f"{path}: cannot read the trainer state ({err})") from None
    # (states written before OptimConfig keep these values flat in their "config")
    saved = state.get("schedule_values", state.get("config", {}))
    for key in SCHEDULE_FIELDS:
        before, now = saved.get(key), schedule_values[key]
        if key in saved and before != now:
            raise ValueError(
                f"{path}: the run was started with {key} = {before}, not {now}: resuming with "
                f"another value would change its learning-rate schedule mid-run (with more "
                f"steps the rate would jump back up). Resume with the same {flag(key)}, or start "
                f"a new run from these weights with a fresh schedule (bertkit pretrain "
                f"--init-from {out})"
            )
    return state


def stale_model(out: Path, step: int) -> bool:
    """Whether OUT's model file is not its state's: the model is written before the state, so a
    kill between the two, a state from before that order or a file changed since leaves one.
    Its recorded SHA-256 tells (none recorded: not known to be stale)."""
    path = out / MODEL_FILE
    recorded = read_digests(out / DIGEST_FILE).get(MODEL_FILE)
    stale = path.exists() and isinstance(recorded, str) and sha256_of(path) != recorded
    if stale:
        logger.warning(
            "%s: not the model of step %d (its SHA-256 differs from the one recorded in %s); "
            "written again from %s",
            path,
            step,
            DIGEST_FILE,
            STATE_FILE,
        )
    return stale


def rng_state() -> dict[str, Any]:
    """Python's, NumPy's, torch's (and CUDA's) generators, as plain values (the state file
    loads with torch.load(weights_only=True))."""
    kind, keys, position, has_gauss, gauss = np.random.get_state(legacy=True)
    assert isinstance(keys, np.ndarray)  # the legacy tuple form
    state = {
        "python": random.getstate(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, gauss],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(rng: dict[str, Any]) -> None:
    version, internal, gauss_next = rng["python"]
    random.setstate((version, tuple(internal), gauss_next))
    kind, keys, position, has_gauss, gauss = rng["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, gauss))
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def _read_digests(path: Path) -> list[str]:
    return read_digests(path).get("sha256", [])


def format_figures(entry: dict[str, Any]) -> str:
    """An evaluation's numbers in one line: "mlm_accuracy 0.2270, nsp_accuracy 0.6730, ..."."""
    skip = {"step", "split", "tokens", "seconds", "epoch", "score"}
    return ", ".join(
        f"{k} {v:.4f}"
        for k, v in entry.items()
        # per-type figures (f1_PER, precision_NP, ...) stay in log.jsonl: one short line here
        if k not in skip and isinstance(v, float) and not re.search(r"_[A-Z]", k)
    )


class RunLog:
    """log.jsonl: one JSON object per line. On resume, lines past the checkpoint's step go, so
    the file reads as if the run had never stopped. With TensorBoard installed, the same numbers
    also go to `tensorboard/` beside it (as `train/loss`, `eval/mlm_accuracy`, ...)."""

    def __init__(self, path: Path, enabled: bool, keep_until: int) -> None:
        self.path, self.enabled = path, enabled
        self.board = None
        if not enabled:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is optional
            pass
        else:
            self.board = SummaryWriter(str(path.parent / "tensorboard"), purge_step=keep_until + 1)
        kept = []
        if keep_until and path.exists():
            lines = path.read_bytes().split(b"\n")
            for number, raw in enumerate(lines, start=1):
                if not raw.strip():
                    continue
                try:
                    line = raw.decode("utf-8")
                    if json.loads(line)["step"] <= keep_until:
                        kept.append(line)
                except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
                    if number < len(lines) - 1:  # not the last line, which a kill can cut short
                        logger.warning("%s:%d: not a log entry, dropped on resume", path, number)
        with atomic_path(path) as tmp:
            tmp.write_text("".join(line + "\n" for line in kept))

    def write(self, entry: dict[str, Any]) -> None:
        if self.enabled:
            clean = {
                k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in entry.items()
            }
            # opened for each entry (one every log_every steps): nothing is left open when the
            # loop ends by an exception, and each line is on disk when write returns
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(clean) + "\n")
            if self.board is not None:
                split = entry.get("split", "train")
                for key, value in clean.items():
                    if isinstance(value, (int, float)) and key != "step":
                        self.board.add_scalar(f"{split}/{key}", value, entry["step"])
                self.board.flush()
