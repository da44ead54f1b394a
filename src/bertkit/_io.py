"""Atomic file writes: write to a temporary name beside the target, fsync, rename into place.

A killed process leaves either the old file or the new one, never a torn one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it is fsynced and renamed onto `path`.

    >>> with atomic_path("out/model.safetensors") as tmp:   # doctest: +SKIP
    ...     save_file(tensors, tmp)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as handle:
            # the mode a plain open() gives (0666 minus the umask, typically 0644), so that a
            # colleague or a serving container can read models and shards: mkstemp makes the
            # file 0600, and a writer may set its own mode (safetensors' save_file: 0600)
            os.fchmod(handle.fileno(), 0o666 & ~_umask())
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if _disk_full(err, path.parent):
            raise OSError(
                errno.ENOSPC,
                f"no space left on device writing {path} (the previous file, if any, is intact)",
            ) from err
        raise
    _fsync_dir(path.parent)


def _disk_full(err: BaseException, directory: Path) -> bool:
    """A full disk, however the writer reported it: OSError ENOSPC, or torch.save's
    "[enforce fail at inline_container.cc] unexpected pos" when its zip writer ran out."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if isinstance(err, RuntimeError) and "unexpected pos" in str(err):
        try:
            return shutil.disk_usage(directory).free < 64 * 2**20
        except OSError:
            return False
    return False


def _umask() -> int:
    current = os.umask(0)  # reading the umask means setting it; put it straight back
    os.umask(current)
    return current


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def read_json(path: str | os.PathLike, *, object_only: bool = False) -> Any:
    """A JSON file's value (UTF-8); malformed JSON refused naming the file, line and column,
    and with `object_only` anything but an object.

    >>> read_json(__file__)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: ..._io.py:1:3: invalid JSON: Extra data
    """
    path = Path(path)
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{err.lineno}:{err.colno}: invalid JSON: {err.msg}") from None
    if object_only and not isinstance(value, dict):
        raise ValueError(f"{path}: not a JSON object")
    return value


def write_json(path: str | os.PathLike, value: Any) -> None:
    """`value` as indented JSON, written atomically (results.json and its kin)."""
    atomic_write_text(path, json.dumps(value, indent=2) + "\n")


def _fsync_dir(directory: Path) -> None:
    # Make the rename itself durable; not every platform can open a directory.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


LOCK_FILE = ".bertkit.lock"


@contextlib.contextmanager
def run_lock(directory: str | os.PathLike) -> Iterator[None]:
    """One writer per run folder: an OS lock on DIRECTORY/.bertkit.lock, held while the block
    runs and released by the OS when the process dies (no stale locks after a kill). A second
    process gets FileExistsError naming the folder and the holder's pid. Where the platform has
    no `fcntl` (Windows), nothing is locked."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    path = Path(directory) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "?"
            raise FileExistsError(
                f"{directory}: another bertkit process (pid {holder}) is writing this folder; "
                "wait for it to finish or pick another output folder"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield
    finally:
        handle.close()  # closing releases the lock


# --------------------------------------------------------------------------- a run's checksums
DIGEST_FILE = "trainer_state.sha256"  # a run's checksums of its state and model file
MODEL_FILE = "model.safetensors"
STATE_FILE = "trainer_state.pt"  # a run's optimiser, schedule and RNG state
# What a fine-tuned folder says of itself: its task, head and settings (finetune writes it;
# bertkit.inference.loader reads it).
TASK_FILE = "bertkit_task.json"


def sha256_of(path: str | os.PathLike) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def read_digests(path: Path) -> dict:
    """A run's checksum file: {"sha256": [the state's, ...], "model.safetensors": the model's};
    {} where there is none; a garbled one is a ValueError naming it."""
    import json

    if not path.exists():
        return {}
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        digests = record["sha256"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise ValueError(
            f"{path}: not a checksum file written by bertkit (delete it to skip the check)"
        ) from None
    if not isinstance(digests, list) or not all(isinstance(d, str) for d in digests):
        raise ValueError(f"{path}: not a checksum file written by bertkit (delete it)")
    return record


def in_use(directory: str | os.PathLike) -> bool:
    """Whether a live bertkit process holds DIRECTORY's run lock (it may be writing there)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return False
    path = Path(directory) / LOCK_FILE
    if not path.exists():
        return False
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def record_model_digest(directory: str | os.PathLike) -> None:
    """Record the SHA-256 of DIRECTORY's model.safetensors in its checksum file (beside the
    state's, where a kept state has them): a finished run's model is then checked wherever
    it is loaded, as a checkpoint's is."""
    directory = Path(directory)
    record = read_digests(directory / DIGEST_FILE) or {"sha256": []}
    record[MODEL_FILE] = sha256_of(directory / MODEL_FILE)
    atomic_write_text(directory / DIGEST_FILE, json.dumps(record))


def check_model_digest(directory: str | os.PathLike) -> None:
    """Refuse DIRECTORY's model.safetensors if the run that wrote it recorded another SHA-256
    (trainer_state.sha256): flipped bytes load as wrong weights without any other sign. A
    folder a live run holds is not checked (its model and record are replaced one after the
    other)."""
    directory = Path(directory)
    recorded = read_digests(directory / DIGEST_FILE).get(MODEL_FILE)
    model = directory / MODEL_FILE
    if not isinstance(recorded, str) or not model.exists() or in_use(directory):
        return
    if sha256_of(model) != recorded:
        again = (
            "or `--resume` the run to write it again from its state"
            if (directory / STATE_FILE).exists()
            else "or run again what wrote it"
        )
        raise ValueError(
            f"{model}: its SHA-256 is not the one the run recorded when it wrote it "
            f"({DIGEST_FILE}): the file changed since (corrupt, or edited). Restore it from a "
            f"copy, {again}"
        )
