"""The paper's fine-tuning tasks: GLUE (nine), SQuAD v1.1/v2.0, CoNLL-2003 NER, SWAG; and
CoNLL-2003's POS tagging and chunking."""

from __future__ import annotations

from bertkit.tasks.base import DataError, Task

TASK_NAMES = (
    "cola",
    "sst2",
    "mrpc",
    "stsb",
    "qqp",
    "mnli",
    "qnli",
    "rte",
    "wnli",
    "squad1",
    "squad2",
    "conll2003",
    "conll2003-pos",
    "conll2003-chunk",
    "swag",
)


def get_task(name: str) -> Task:
    """A fresh task object by its command-line name (`mrpc`, `squad1`, `conll2003`, ...)."""
    from bertkit.tasks.glue import GLUE, GlueTask
    from bertkit.tasks.ner import ConllTask
    from bertkit.tasks.squad import SquadTask
    from bertkit.tasks.swag import SwagTask

    if name in GLUE:
        return GlueTask(GLUE[name])
    if name in ("squad1", "squad2"):
        return SquadTask(int(name[-1]))
    if name == "conll2003":
        return ConllTask()
    if name in ("conll2003-pos", "conll2003-chunk"):
        return ConllTask(name.split("-")[1])
    if name == "swag":
        return SwagTask()
    raise ValueError(f"unknown task {name!r}; one of {', '.join(TASK_NAMES)}")


__all__ = ["TASK_NAMES", "DataError", "Task", "get_task"]
