"""`Embedder`: unit vectors of raw texts from a model folder, in batches.

Embedder("runs/emb")(["A man is eating.", "Someone eats."])   # (2, H) unit vectors
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch

from bertkit.embedding import declared_length
from bertkit.inference.loader import load


class Embedder:
    """Unit vectors of raw texts from a model folder (a bertkit sentence-embedding model, a
    sentence-transformers folder, or any BERT: mean pooling), in batches. `precision` as for
    predict and serve: `auto` is bf16 autocast where the device runs bf16 natively (the vectors
    then equal fp32's within bf16's rounding), fp32 elsewhere.

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
    ) -> None:
        loaded = load(model, head="BertForSentenceEmbedding", device=device, precision=precision)
        self.model, self.tokenizer, self.device = loaded.model, loaded.tokenizer, loaded.device
        self.precision = loaded.precision
        self.batch_size = batch_size
        self.max_seq_length = max_seq_length or declared_length(loaded.path) or 128

    @torch.no_grad()
    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        # longest first, as sentence-transformers encodes: a batch of like lengths wastes less
        # of the attention on padding (+10% sentences/s on SST-2 in bf16; docs/results/embeddings)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        dtype = self.precision.dtype
        with torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None):
            vectors = self._encode([texts[i] for i in order])
        restored = np.empty_like(vectors)
        restored[order] = vectors
        return restored

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        vectors = []
        for start in range(0, len(texts), self.batch_size):
            encoded = self.tokenizer(
                list(texts[start : start + self.batch_size]), max_length=self.max_seq_length,
                truncation=True, padding=True, return_tensors="pt",
            )  # fmt: skip
            batch = {k: v.to(self.device) for k, v in encoded.items() if k != "offset_mapping"}
            vectors.append(
                self.model(
                    batch["input_ids"], batch.get("token_type_ids"), batch["attention_mask"]
                ).cpu()
            )
        hidden = self.model.config.hidden_size
        return torch.cat(vectors).numpy() if vectors else np.zeros((0, hidden), np.float32)
