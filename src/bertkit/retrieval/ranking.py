"""The arithmetic of ranking that scoring (`retrieval.beir`) and search (`retrieval.index`)
share: rows at unit length (cosines as dot products), sparse documents as a CSR matrix and sparse
queries as its columns' partner, and reciprocal-rank fusion of several rankings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def unit_rows(matrix: np.ndarray) -> np.ndarray:
    """Each row at unit length (float32; a zero row stays zero): cosines are then dot products.

    >>> unit_rows(np.array([[3.0, 4.0], [0.0, 0.0]])).tolist()
    [[0.6000000238418579, 0.800000011920929], [0.0, 0.0]]
    """
    matrix = np.asarray(matrix, np.float32)
    return matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)


def rows_matrix(table: Any, width: int) -> Any:
    """The sparse vectors of an Arrow table's `indices` and `values` list columns (no nulls) as
    a (rows, `width`) torch CSR matrix, sharing the table's buffers where it can."""
    import torch

    lists = table.column("indices").combine_chunks()
    offsets = lists.offsets.to_numpy().astype(np.int64)
    columns = lists.flatten().to_numpy().astype(np.int64)
    values = table.column("values").combine_chunks().flatten().to_numpy().astype(np.float32)
    return torch.sparse_csr_tensor(torch.as_tensor(offsets - offsets[0]),
                                   torch.as_tensor(columns), torch.as_tensor(values),
                                   (table.num_rows, width), check_invariants=False)  # fmt: skip


def queries_matrix(queries: Sequence[tuple[np.ndarray, np.ndarray]], width: int) -> Any:
    """Sparse queries as the columns of a dense (`width`, queries) torch matrix: what a CSR
    matrix of documents multiplies into their scores."""
    import torch

    matrix = torch.zeros((width, len(queries)), dtype=torch.float32)
    for q, (indices, values) in enumerate(queries):
        matrix[torch.as_tensor(indices, dtype=torch.long), q] = torch.as_tensor(values)
    return matrix


def fused(rankings: Sequence[list[list[str]]], top: int,
          k: int = 60) -> tuple[list[list[str]], np.ndarray]:  # fmt: skip
    """Reciprocal-rank fusion (Cormack et al., 2009) of several rankings of the same queries:
    a document's score is the sum over the rankings of 1 / (k + its rank, from 1); best first
    (ties: the order the documents first appear in).

    >>> fused([[["a", "b"]], [["b", "c"]]], top=3)[0]
    [['b', 'a', 'c']]
    """
    ids, scores = [], []
    for lists in zip(*rankings, strict=True):
        total: dict[str, float] = {}
        for ranking in lists:
            for rank, document in enumerate(ranking, start=1):
                total[document] = total.get(document, 0.0) + 1.0 / (k + rank)
        best = sorted(total.items(), key=lambda item: -item[1])[:top]
        ids.append([d for d, _ in best])
        scores.append([s for _, s in best] + [0.0] * (top - len(best)))
    return ids, np.asarray(scores, np.float32)
