"""`Embedder`: vectors of raw texts from a model folder, in batches: the one encoding path of
the Python API, `bertkit embed`'s corpus jobs (`jobs.embed.EmbeddingMapper`) and search
queries.

Embedder("runs/emb")(["A man is eating.", "Someone eats."])   # (2, H) unit vectors
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch

from bertkit.core.embedding import declared_length
from bertkit.inference.loader import load


class Embedder:
    """Vectors of raw texts from a model folder (a bertkit sentence-embedding model, a
    sentence-transformers folder, or any BERT: its declared pooling, else mean), unit length
    unless `normalize` is false, in batches of `batch_size` formed longest first (a batch of
    like lengths wastes less on padding; the unpadded encoder computes real tokens only).
    `precision` as for predict and serve: `auto` is bf16 autocast where the device runs bf16
    natively (the vectors then equal fp32's within bf16's rounding), fp32 elsewhere.
    `max_seq_length`: where texts are cut (default: the folder's declared length, else 128).

    >>> Embedder("runs/emb")(["a text", "another"]).shape   # doctest: +SKIP
    (2, 384)
    """

    def __init__(
        self,
        model: str | os.PathLike,
        *,
        device: str | None = None,
        batch_size: int = 64,
        max_seq_length: int | None = None,
        precision: str = "auto",
        pooling: str | None = None,
        normalize: bool = True,
    ) -> None:
        loaded = load(model, head="BertForSentenceEmbedding", device=device, precision=precision)
        self.loaded, self.model, self.device = loaded, loaded.model, loaded.device
        self.tokenizer, self.precision = loaded.tokenizer, loaded.precision
        if pooling is not None:
            self.model.pooling = pooling
        self.batch_size, self.normalize = batch_size, normalize
        positions = loaded.config.max_length
        self.max_seq_length = min(max_seq_length or declared_length(loaded.path) or 128, positions)
        self.dimension = loaded.config.hidden_size
        self.pad_id = loaded.config.pad_token_id or 0
        # a text as its model reads it: [CLS] … [SEP], RoBERTa's <s> … </s>
        self.cls_id, self.sep_id = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        """(N, H) float32 vectors of `texts`, in their order."""
        return self.encode(self.inputs(texts)[0])

    def inputs(self, texts: Sequence[str]) -> tuple[list[list[int]], list[int]]:
        """Each text's ids as the model reads it ([CLS] … [SEP], cut to `max_seq_length`), and
        its length before the cut."""
        pieces = self.tokenizer.encode_ids(list(texts)) if texts else []
        room = self.max_seq_length - 2
        inputs = [[self.cls_id, *ids[:room], self.sep_id] for ids in pieces]
        return inputs, [len(ids) + 2 for ids in pieces]

    @torch.no_grad()
    def encode(self, inputs: list[list[int]]) -> np.ndarray:
        """(N, H) float32 vectors of token id lists ([CLS] … [SEP]), longest first in batches,
        back in the order given."""
        order = sorted(range(len(inputs)), key=lambda i: -len(inputs[i]))
        out = np.zeros((len(inputs), self.dimension), np.float32)
        dtype = self.precision.dtype
        with torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None):
            for start in range(0, len(order), self.batch_size):
                chosen = order[start : start + self.batch_size]
                width = len(inputs[chosen[0]])
                ids = torch.full((len(chosen), width), self.pad_id, dtype=torch.long)
                mask = torch.zeros((len(chosen), width), dtype=torch.long)
                for row, i in enumerate(chosen):
                    ids[row, : len(inputs[i])] = torch.tensor(inputs[i])
                    mask[row, : len(inputs[i])] = 1
                vectors = self.model(ids.to(self.device), torch.zeros_like(ids).to(self.device),
                                     mask.to(self.device), normalize=self.normalize)  # fmt: skip
                out[chosen] = vectors.float().cpu().numpy()
        return out
