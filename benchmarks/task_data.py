"""Where each task's files lie in the shared data folder (`../shared/data`, `$BERTKIT_DATA`), for
the benchmark scripts: GLUE tasks under `glue/` in the GLUE download's own folder names."""

from __future__ import annotations

from pathlib import Path

from bertkit.tasks.glue import GLUE


def task_data(root: str | Path, task: str) -> Path:
    """glue/MRPC for mrpc, conll2003 for conll2003 and its -pos/-chunk columns, squad, swag."""
    if task in GLUE:
        return Path(root) / "glue" / GLUE[task].folder
    for prefix in ("conll2003", "squad", "swag"):
        if task.startswith(prefix):
            return Path(root) / prefix
    raise ValueError(f"no shared data folder known for task {task!r}")
