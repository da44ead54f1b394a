"""Fill-mask: what a masked-LM head puts at each `[MASK]` of a text.

    fill = FillMask("runs/pretrain")
    fill("The capital of France is [MASK].", top=5)
    # [[{"position": 6, "tokens": ["paris", ...], "ids": [...], "probabilities": [...]}]]

One list per text, one dict per `[MASK]` in the order they appear; a text may hold several
`[MASK]`s (each predicted independently, as BERT was trained) and a pair of texts is written
`("text a", "text b")`. Any checkpoint bertkit loads works if it carries the MLM head (bertkit's
pre-training output, Hugging Face `BertForMaskedLM` / `BertForPreTraining`, Google's
`bert_model.ckpt`); an encoder saved without it (e.g. all-MiniLM-L6-v2) is refused, since its
head would be random. The probabilities are a softmax over the whole vocabulary, as Hugging
Face's `pipeline("fill-mask")` gives them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from bertkit.inference.loader import Loaded, load
from bertkit.settings import Settings, device_setting, replaced, setting

# The tensor whose absence means the checkpoint has no MLM head (the others follow it).
MLM_HEAD_TENSOR = "cls.predictions.transform.dense.weight"

Text = str | tuple[str, str] | list[str]


def has_mlm_head(model: str | os.PathLike) -> bool:
    """Whether a checkpoint directory holds a masked-LM head (read from its tensor names)."""
    from bertkit.core.checkpoint import tensor_names

    return MLM_HEAD_TENSOR in tensor_names(model)


@dataclass
class FillMaskConfig(Settings):
    """How `FillMask` runs: the `bertkit fill-mask` flags are these fields."""

    top: int = setting(5, "candidates per [MASK]", check="positive")
    batch_size: int = setting(32, "texts per model call", check="positive")
    max_seq_length: int | None = setting(
        None, "pieces per text (default: the model's longest)", check="positive"
    )
    device: str | None = device_setting()


class FillMask:
    def __init__(
        self, model: str | os.PathLike, config: FillMaskConfig | None = None, **settings: Any
    ) -> None:
        """The MLM head of `model`, run as `config` (or FillMaskConfig's fields by name)
        says."""
        self.config = config = replaced(config or FillMaskConfig(), **settings)
        from bertkit.core.hub import model_dir

        model = model_dir(model)  # a folder, or a Hub name
        if not has_mlm_head(model):  # refused before loading: no warning of random tensors
            raise ValueError(
                f"{model}: this checkpoint has no masked-LM head (no {MLM_HEAD_TENSOR}), so "
                "fill-mask would print random words; use a pre-trained BERT saved with its "
                "MLM head (bertkit pretrain's output, BertForMaskedLM, BertForPreTraining)"
            )
        self._use(load(model, head="BertForMaskedLM", device=config.device))

    @classmethod
    def of(cls, loaded: Loaded, config: FillMaskConfig | None = None, **settings: Any) -> FillMask:
        """Fill-mask with a masked LM already opened by the loader (as `serve` opens it)."""
        fill = cls.__new__(cls)
        fill.config = replaced(config or FillMaskConfig(), **settings)
        fill._use(loaded)
        return fill

    def _use(self, loaded: Loaded) -> None:
        self.model, self.tokenizer, self.device = loaded.model, loaded.tokenizer, loaded.device
        self.mask = self.tokenizer.mask_token  # [MASK], RoBERTa's <mask>
        if self.mask is None or self.mask not in self.tokenizer.vocab:
            raise ValueError(f"{loaded.path}: the vocabulary has no mask token")
        self.batch_size = self.config.batch_size
        self.max_seq_length = self.config.max_seq_length or loaded.config.max_length

    @torch.no_grad()
    def __call__(
        self, texts: Text | Sequence[Text], top: int | None = None
    ) -> list[list[dict[str, Any]]]:
        """Per text, per `[MASK]`: `position` (its index among the pieces, [CLS] = 0), the `top`
        (default: the config's) most likely `tokens`, their `ids` and `probabilities` (most
        likely first)."""
        top = self.config.top if top is None else top
        batch: list[Text]
        if isinstance(texts, str) or (
            isinstance(texts, tuple) and len(texts) == 2 and all(isinstance(t, str) for t in texts)
        ):
            batch = [texts]  # type: ignore[list-item]  # one text, not a sequence of them
        else:
            batch = list(texts)
        if top < 1:
            raise ValueError(f"top must be at least 1, got {top}")
        top = min(top, self.tokenizer.vocab_size)
        results: list[list[dict[str, Any]]] = []
        for start in range(0, len(batch), self.batch_size):
            results += self._batch(batch[start : start + self.batch_size], start, top)
        return results

    def _batch(self, texts: list[Text], first: int, top: int) -> list[list[dict[str, Any]]]:
        singles: list[str] = []
        pairs: list[str | None] = []
        for number, text in enumerate(texts, start=first):
            if isinstance(text, str):
                singles.append(text)
                pairs.append(None)
            elif isinstance(text, (tuple, list)) and len(text) == 2:
                singles.append(str(text[0]))
                pairs.append(str(text[1]))
            else:
                raise ValueError(f"text {number}: a string or a pair of strings, not {text!r}")
        encoded = self.tokenizer(  # a None second segment is a single text: batches may mix
            singles,
            pairs,
            truncation=False,
            padding=True,
            return_tensors="pt",
        )
        ids = encoded["input_ids"]
        mask_id = self.tokenizer.vocab[self.mask]
        lengths = encoded["attention_mask"].sum(1).tolist()
        for number, length in enumerate(lengths, start=first):
            if length > self.max_seq_length:
                raise ValueError(
                    f"text {number}: {length} pieces, more than the model's "
                    f"{self.max_seq_length}; shorten it"
                )
        is_mask = ids == mask_id
        counts = is_mask.sum(1)
        for number, count in enumerate(counts.tolist(), start=first):
            if count == 0:
                raise ValueError(f"text {number}: no {self.mask} to fill")
        # masked positions, padded with position 0 ([CLS]) up to the most [MASK]s of a text
        positions = torch.zeros(len(texts), int(counts.max()), dtype=torch.long)
        for row in range(len(texts)):
            found = is_mask[row].nonzero().view(-1)
            positions[row, : len(found)] = found
        logits = self.model(
            ids.to(self.device),
            encoded["token_type_ids"].to(self.device),
            encoded["attention_mask"].to(self.device),
            masked_positions=positions.to(self.device),
        ).logits.float()  # (B, P, V)
        probabilities, best = logits.softmax(-1).topk(top, dim=-1)
        results = []
        for row in range(len(texts)):
            masks = []
            for slot in range(int(counts[row])):
                chosen = best[row, slot].tolist()
                masks.append(
                    {
                        "position": int(positions[row, slot]),
                        "tokens": self.tokenizer.convert_ids_to_tokens(chosen),
                        "ids": chosen,
                        "probabilities": probabilities[row, slot].tolist(),
                    }
                )
            results.append(masks)
        return results
