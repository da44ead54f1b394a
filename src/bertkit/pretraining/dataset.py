"""Batches of pre-training instances: deterministic, resumable, sharded by rank.

Each epoch has a plan: the instances of every document (`instances.document_instances`), in a
shuffled order that depends only on (seed, version). Every rank walks the same plan; a global
batch is the next `world_size * batch_size` plan rows and rank r takes its r-th slice, so one
process with the whole global batch sees exactly what several ranks see together. Masks are drawn
when an instance is drawn, from a generator seeded by (seed, version, plan row): dynamic masking
(the default) gives every epoch its own version, static masking cycles through `dupe_factor`
versions (Google's `dupe_factor` copies). The position (epoch, row) is the whole state to resume.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bertkit.core.losses import IGNORE_INDEX
from bertkit.core.tokenizer import BertTokenizer
from bertkit.pretraining.instances import (
    OBJECTIVES,
    document_instances,
    mask_tokens,
)
from bertkit.pretraining.shards import Shards
from bertkit.settings import Settings, setting


@dataclass(frozen=True)
class MaskingConfig(Settings):
    """How masked-LM targets are chosen and corrupted (the paper's: 15%, 80/10/10); the
    `bertkit pretrain` flags are these fields."""

    mask_prob: float = setting(0.15, "fraction of the pieces chosen for MLM", check="probability")
    max_predictions: int = setting(20, "chosen pieces per sequence at most", check="positive")
    mask_token_prob: float = setting(0.8, "chosen pieces that become [MASK]", check="probability")
    random_token_prob: float = setting(
        0.1, "chosen pieces that become a random piece (the rest stay)", check="probability"
    )
    whole_word_mask: bool = setting(False, "choose all pieces of a word together")
    static_masking: bool = setting(
        False,
        "fixed masks cycling through --dupe-factor versions (Google's default) instead of new "
        "masks every epoch",
    )
    dupe_factor: int = setting(10, "versions of the static masks", check="positive")


class PretrainingData:
    """The batch stream of one rank. `next_batch()` gives a dict of tensors ready for
    `BertForPreTraining` (`input_ids`, `token_type_ids`, `attention_mask`, `masked_positions`,
    `labels`, and `next_sentence_label` for the NSP objective)."""

    def __init__(
        self,
        shards: Shards,
        tokenizer: BertTokenizer,
        *,
        batch_size: int,
        seq_len: int = 128,
        short_seq_prob: float = 0.1,
        objective: str = "mlm+nsp",
        masking: MaskingConfig = MaskingConfig(),
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        fixed_shapes: bool = False,
    ) -> None:
        if objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
        shards.check_vocab(tokenizer)
        if seq_len > 1 << 15:
            raise ValueError(f"seq_len {seq_len} is unreasonably large")
        self.shards = shards
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.seq_len, self.short_seq_prob = seq_len, short_seq_prob
        self.objective, self.masking, self.seed = objective, masking, seed
        # every batch padded to seq_len and to the most predictions a sequence can have (CUDA
        # graphs replay one shape); else to the batch's longest
        self.fixed_shapes = fixed_shapes
        self.pad_id = tokenizer.pad_token_id
        if tokenizer.mask_token_id is None:
            raise ValueError(
                f"the tokenizer has no mask token ({tokenizer.mask_token}): it cannot pre-train "
                "a masked LM"
            )
        self.mask_id = tokenizer.mask_token_id
        # the special tokens around the segments as the tokenizer lays them out: BERT's
        # [CLS] A [SEP] (B [SEP]) with segments 0 (then 1), RoBERTa's <s> A </s></s> B </s>
        self.layout = _Layout(tokenizer, pair=objective == "mlm+nsp")
        # random replacements: ordinary tokens only (Google draws from the whole vocabulary,
        # [CLS], [PAD] and [unusedN] included)
        self.random_ids = np.asarray(tokenizer.ordinary_ids(), dtype=np.int64)
        self.is_continuation = np.asarray(tokenizer.continues_word(), dtype=bool)
        self.epoch, self.row = 0, 0
        self._plan_version: int | None = None
        self._plan = np.zeros((0, 7), np.int64)

    # ------------------------------------------------------------------ plan and position
    def _version(self, epoch: int) -> int:
        return epoch % self.masking.dupe_factor if self.masking.static_masking else epoch

    def plan(self, epoch: int) -> np.ndarray:
        """(n, 7) instance spans of an epoch, in training order."""
        version = self._version(epoch)
        if version != self._plan_version:
            self._plan = build_plan(
                self.shards,
                np.random.default_rng([self.seed, version, 0]),
                max_seq_length=self.seq_len,
                short_seq_prob=self.short_seq_prob,
                objective=self.objective,
                specials=self.layout.specials,
            )
            self._plan_version = version
        return self._plan

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "row": self.row}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.row = int(state["epoch"]), int(state["row"])

    # ------------------------------------------------------------------ batches
    def next_batch(self) -> dict[str, torch.Tensor]:
        plan, rows, version = self._advance()
        return self.collate([self.instance(plan[r], (self.seed, version, r)) for r in rows])

    def skip(self) -> None:
        """Move past the next batch without making it (a prefetching worker skips the batches
        the others make: `bertkit.pretraining.prefetch`)."""
        self._advance()

    def _advance(self) -> tuple[np.ndarray, range, int]:
        """The plan, the rows of this rank's next batch and their masks' version; the position
        moves past them."""
        plan = self.plan(self.epoch)
        if len(plan) < self.global_batch:
            raise ValueError(
                f"the corpus gives only {len(plan)} instances per epoch, fewer than one global "
                f"batch of {self.global_batch}"
            )
        if self.row + self.global_batch > len(plan):  # drop the incomplete last batch
            self.epoch, self.row = self.epoch + 1, 0
            plan = self.plan(self.epoch)
        start = self.row + self.rank * self.batch_size
        self.row += self.global_batch
        return plan, range(start, start + self.batch_size), self._version(self.epoch)

    def instance(self, span: np.ndarray, key: tuple[int, ...]) -> dict[str, Any]:
        shard_a, a0, a1, shard_b, b0, b1, is_random = (int(x) for x in span)
        a = np.asarray(self.shards.tokens[shard_a][a0:a1], dtype=np.int64)
        b = np.asarray(self.shards.tokens[shard_b][b0:b1], dtype=np.int64)
        ids, segments, maskable = self.layout(a, b if self.objective == "mlm+nsp" else None)
        if self.objective == "ltr":  # predict every next token, left to right
            positions = np.arange(len(ids) - 1)
            return {
                "input_ids": ids,
                "segments": segments,
                "positions": positions,
                "labels": ids[1:],
                "nsp": -1,
            }
        rng = np.random.default_rng(key)
        corrupted, positions, labels = mask_tokens(
            ids,
            maskable,
            rng,
            mask_id=self.mask_id,
            random_ids=self.random_ids,
            mask_prob=self.masking.mask_prob,
            max_predictions=self.masking.max_predictions,
            word_starts=~self.is_continuation[ids] if self.masking.whole_word_mask else None,
            mask_token_prob=self.masking.mask_token_prob,
            random_token_prob=self.masking.random_token_prob,
        )
        nsp = is_random if self.objective == "mlm+nsp" else -1
        return {
            "input_ids": corrupted,
            "segments": segments,
            "positions": positions,
            "labels": labels,
            "nsp": nsp,
        }

    def collate(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Pad to the longest sequence of the batch (not to max_seq_length), or with
        `fixed_shapes` to seq_len and the most predictions a sequence can have."""
        batch = len(items)
        length = max(len(x["input_ids"]) for x in items)
        predictions = max(len(x["positions"]) for x in items)
        if self.fixed_shapes:
            most = self.seq_len - 1 if self.objective == "ltr" else self.masking.max_predictions
            length, predictions = max(length, self.seq_len), max(predictions, most)
        ids = np.full((batch, length), self.pad_id, np.int64)
        segments = np.zeros((batch, length), np.int64)
        attention = np.zeros((batch, length), np.int64)
        positions = np.zeros((batch, predictions), np.int64)
        labels = np.full((batch, predictions), IGNORE_INDEX, np.int64)
        for row, item in enumerate(items):
            n, p = len(item["input_ids"]), len(item["positions"])
            ids[row, :n] = item["input_ids"]
            segments[row, :n] = item["segments"]
            attention[row, :n] = 1
            positions[row, :p] = item["positions"]
            labels[row, :p] = item["labels"]
        out = {
            "input_ids": torch.from_numpy(ids),
            "token_type_ids": torch.from_numpy(segments),
            "attention_mask": torch.from_numpy(attention),
            "masked_positions": torch.from_numpy(positions),
            "labels": torch.from_numpy(labels),
        }
        if self.objective == "mlm+nsp":
            out["next_sentence_label"] = torch.tensor([x["nsp"] for x in items], dtype=torch.long)
        return out


def build_plan(
    shards: Shards,
    rng: np.random.Generator,
    *,
    max_seq_length: int,
    short_seq_prob: float,
    objective: str,
    specials: int | None = None,
) -> np.ndarray:
    """Every document's instances, shuffled: an (n, 7) int64 array of `SPAN_FIELDS`
    (`specials`: the special tokens an instance adds, `document_instances`)."""
    num_documents = shards.num_documents
    rows: list[tuple[int, ...]] = []
    for document in range(num_documents):
        shard, bounds = shards.sentence_bounds(document)
        rows.extend(
            document_instances(
                shard,
                bounds,
                document,
                num_documents,
                shards.sentence_bounds,
                rng,
                max_seq_length=max_seq_length,
                short_seq_prob=short_seq_prob,
                objective=objective,
                specials=specials,
            )
        )
    plan = np.asarray(rows, dtype=np.int64).reshape(-1, 7)
    return plan[rng.permutation(len(plan))]


class _Layout:
    """An instance's ids, segment ids and maskable positions from its segments' ids, laid out
    as the tokenizer lays out one text (or a pair); its special tokens are never masked."""

    def __init__(self, tokenizer: BertTokenizer, *, pair: bool) -> None:
        ids, types = tokenizer.with_specials([-1], [-2] if pair else None)  # -1: A, -2: B
        self.template, self.types = np.asarray(ids, np.int64), np.asarray(types, np.int64)
        markers = (-1, -2) if pair else (-1,)
        self.slots = [int(np.flatnonzero(self.template == m)[0]) for m in markers]
        self.specials = len(ids) - len(self.slots)  # what an instance adds to its segments
        self.special_ids = np.unique(self.template[self.template >= 0])

    def __call__(self, a: np.ndarray, b: np.ndarray | None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
        pieces: list[np.ndarray] = []
        types: list[np.ndarray] = []
        start = 0
        for slot, segment in zip(self.slots, [a] if b is None else [a, b], strict=True):
            pieces += [self.template[start:slot], segment]
            types += [self.types[start:slot], np.full(len(segment), self.types[slot], np.int64)]
            start = slot + 1
        ids = np.concatenate([*pieces, self.template[start:]])
        return ids, np.concatenate([*types, self.types[start:]]), ~np.isin(ids, self.special_ids)
