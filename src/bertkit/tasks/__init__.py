"""Fine-tuning tasks: the paper's — GLUE (nine), SQuAD v1.1/v2.0, CoNLL-2003 NER (and its POS
tagging and chunking), SWAG — and four generic ones on your own files: `text-classification`,
`token-classification`, `question-answering`, `multiple-choice` (`bertkit.tasks.own`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bertkit.tasks.base import OWN_TASKS, PAPER_TASKS, DataError, Task, check_data

if TYPE_CHECKING:
    from bertkit.tasks.own import DataConfig

TASK_NAMES = PAPER_TASKS + OWN_TASKS


def get_task(name: str, data: DataConfig | None = None) -> Task:
    """A fresh task object by its command-line name (`mrpc`, `squad1`, `conll2003`, ...); the
    generic tasks read the files `data` names (`bertkit.tasks.own.DataConfig`)."""
    if name in OWN_TASKS:
        from bertkit.tasks.multiple_choice import MultipleChoiceTask
        from bertkit.tasks.question_answering import QuestionAnsweringTask
        from bertkit.tasks.sentence_embedding import SentenceEmbeddingTask
        from bertkit.tasks.text_classification import TextClassificationTask
        from bertkit.tasks.token_classification import TokenClassificationTask

        classes = {
            "text-classification": TextClassificationTask,
            "token-classification": TokenClassificationTask,
            "question-answering": QuestionAnsweringTask,
            "multiple-choice": MultipleChoiceTask,
            "sentence-embedding": SentenceEmbeddingTask,
        }
        return classes[name](data)
    check_data(name, data)
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


__all__ = ["OWN_TASKS", "PAPER_TASKS", "TASK_NAMES", "DataError", "Task", "check_data", "get_task"]
