"""`bertkit predict --input FILES --output FOLDER`: a fine-tuned model's answers for every row of a
corpus, in the shards and manifest of every corpus job (resumable, N processes, Ray).

Each shard holds the row's `id`, the answer's fields as columns (a classifier's `label`, `score`
and `probabilities`; a tagger's `tags` and `entities`; a reranker's `ranking` — lists and
objects as JSON text, so every shard has the same columns), the kept columns and the issue.
The model reads each row as `Predictor` and `predict_file` do: its text column (and a pair
column), or with `rerank` a row's `query` and `texts`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from bertkit.jobs.config import PredictJobConfig
from bertkit.jobs.inputs import CorpusRow


class PredictionMapper:
    def __init__(self, model: str | os.PathLike, config: PredictJobConfig) -> None:
        from bertkit.inference.predict import Predictor

        self.config = config
        self.predictor = Predictor(model, batch_size=config.batch_size, device=config.device,
                                   precision=config.precision, progress=False,
                                   raw_scores=config.raw_scores, **vars(config.heads))  # fmt: skip
        self.loaded = self.predictor.loaded
        if config.rerank and self.predictor.rerank_label is None:
            raise ValueError(f"{model}: --rerank takes a cross-encoder (a model fine-tuned on "
                             "text pairs)")  # fmt: skip
        self.answer_names: list[str] | None = None

    def describe(self) -> dict[str, Any]:
        return {"kind": "predict", "task": self.predictor.task.name,
                "max_seq_length": self.predictor.max_seq_length,
                "precision": self.predictor.precision.name,
                "pair_column": self.config.text_pair_column, "rerank": self.config.rerank}  # fmt: skip

    def __call__(self, rows: Sequence[CorpusRow]) -> tuple[dict[str, Any], list[str | None]]:
        import pyarrow as pa

        columns = self.config.columns
        todo = [i for i, row in enumerate(rows) if row.text is not None]
        batch = [(rows[i].line, {columns.text: rows[i].text, **rows[i].kept}) for i in todo]
        answered = (self.predictor.answer_rows(rows[todo[0]].name, batch, columns.text,
                                               self.config.text_pair_column, self.config.rerank)
                    if batch else [])  # fmt: skip
        answers: list[dict[str, Any] | None] = [None] * len(rows)
        for i, (_, values), written in zip(todo, batch, answered, strict=True):
            answers[i] = {k: v for k, v in written.items() if k not in values}
        names = self.answer_names or sorted({k for a in answers if a for k in a})
        self.answer_names = names
        table = {name: pa.array([_cell(a.get(name)) if a else None for a in answers])
                 for name in names}  # fmt: skip
        return table, [row.issue for row in rows]


def _cell(value: Any) -> Any:
    """Lists and objects as JSON text (the same column type in every shard)."""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, (list, dict)) else value


def predict_corpus(model: str | os.PathLike, inputs: Sequence[str | os.PathLike] | None,
                   out: str | os.PathLike, config: PredictJobConfig | None = None, *,
                   dataset: str | None = None, split: str = "train", ray: str | None = None,
                   **settings: Any) -> dict[str, Any]:  # fmt: skip
    """Predict every row of `inputs` (or of a cached `dataset`) into the folder `out`; the
    manifest."""
    from bertkit.jobs.run import start_job

    return start_job("predict", PredictionMapper, model, inputs, out,
                     config or PredictJobConfig(), settings, dataset=dataset, split=split,
                     ray=ray)  # fmt: skip
