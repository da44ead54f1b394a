"""Atomic file writes: write to a temporary name beside the target, fsync, rename into place.

A killed process leaves either the old file or the new one, never a torn one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


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


def read_jsonl(path: str | os.PathLike) -> list:
    """The items of a JSON-lines input file (blank lines skipped). `{"text": a, "text_pair": b}`
    becomes the pair `(a, b)` and `{"text": a}` the string `a`; anything else is kept as read.
    ValueError names the file and line of a line that is not JSON."""
    import json

    items: list = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not JSON ({err.msg})") from None
            if isinstance(item, dict) and "text" in item:
                item = (item["text"], item["text_pair"]) if "text_pair" in item else item["text"]
            items.append(item)
    return items


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
