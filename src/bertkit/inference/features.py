"""The feature-based approach (the paper, Sec. 5.3): frozen contextual features from chosen
layers of a pre-trained BERT, fed to a task model that trains while BERT does not.

Layer selections (`hidden_states[0]` is the embedding output, `[i]` layer i's output):

| name | features | width |
|---|---|---|
| `embeddings` | hidden_states[0] | H |
| `layer:N` | hidden_states[N] (N = 1..L; negative counts from the top) | H |
| `last` | hidden_states[L] | H |
| `second_to_last` | hidden_states[L-1] | H |
| `sum_last_4` | hidden_states[L-3] + ... + hidden_states[L] | H |
| `concat_last_4` | [hidden_states[L-3]; ...; hidden_states[L]] | 4H |
| `all` | every layer, stacked (L+1, H): for a learned weighted sum (`ScalarMix`) | (L+1)·H |

`extract` gives per-token features of texts (or per-word features of pre-split words: the first
sub-token of each word, as the paper's NER); `save_features` writes them to one `.safetensors`
file. `BiLSTMTagger` is the paper's Table 7 task model: a 2-layer bidirectional LSTM (768 units
per direction) and a linear classifier over the frozen features.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertkit.core.losses import IGNORE_INDEX, token_loss
from bertkit.settings import Settings, device_setting, replaced, setting

SELECTIONS = (
    "embeddings",
    "last",
    "second_to_last",
    "sum_last_4",
    "concat_last_4",
    "all",
)


def select_layers(hidden_states: Sequence[torch.Tensor], selection: str) -> torch.Tensor:
    """Combine the (L+1) hidden states (each (..., H)) as `selection` says:
    select_layers(h, "sum_last_4") == h[-4] + h[-3] + h[-2] + h[-1]"""
    count = len(hidden_states) - 1  # L
    if selection == "embeddings":
        return hidden_states[0]
    if selection == "last":
        return hidden_states[-1]
    if selection == "second_to_last":
        return hidden_states[-2]
    if selection == "sum_last_4":
        return torch.stack(list(hidden_states[-4:])).sum(0)
    if selection == "concat_last_4":
        return torch.cat(list(hidden_states[-4:]), dim=-1)
    if selection == "all":
        return torch.stack(list(hidden_states), dim=-2)  # (..., L+1, H)
    if selection.startswith("layer:"):
        try:
            index = int(selection.split(":", 1)[1])
        except ValueError:
            index = None
        if index is not None and -count <= index <= count and index != 0:
            return hidden_states[index if index > 0 else count + 1 + index]
        raise ValueError(f"{selection!r}: the layer must be 1..{count} or -1..-{count}")
    raise ValueError(f"unknown layer selection {selection!r}; one of {SELECTIONS} or layer:N")


@torch.no_grad()
def extract(
    model,
    tokenizer,
    items: Sequence[str] | Sequence[Sequence[str]],
    selections: Sequence[str] = ("last",),
    *,
    max_seq_length: int = 512,
    batch_size: int = 32,
    device: str | torch.device | None = None,
) -> dict[str, list[torch.Tensor]]:
    """Features of every item for every selection: `{selection: [tensor (tokens, width) per
    item]}`. Items are texts (one row per WordPiece, [CLS] and [SEP] included) or lists of
    words (one row per word: its first sub-token; [CLS]/[SEP] left out). `model` is a
    `BertModel` (or any head: its `.bert` is used); it is put in eval mode and not trained."""
    encoder = getattr(model, "bert", model)
    device = torch.device(device) if device else next(encoder.parameters()).device
    encoder.to(device).eval()
    for selection in selections:  # fail before any work
        select_layers([torch.zeros(1)] * (encoder.config.num_hidden_layers + 1), selection)
    words_given = bool(items) and not isinstance(items[0], str)
    rows, positions = _encode(tokenizer, items, words_given, max_seq_length)
    result: dict[str, list] = {s: [None] * len(items) for s in selections}
    order = np.argsort([-len(r) for r in rows], kind="stable")
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        width = max(len(rows[i]) for i in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, i in enumerate(chunk):
            ids[j, : len(rows[i])] = torch.tensor(rows[i])
            mask[j, : len(rows[i])] = 1
        out = encoder(ids.to(device), None, mask.to(device), output_hidden_states=True)
        for selection in selections:
            features = select_layers(out.hidden_states, selection).float().cpu()
            for j, i in enumerate(chunk):
                keep = positions[i] if positions is not None else slice(0, len(rows[i]))
                result[selection][i] = features[j, keep].clone()
    return result


def _encode(tokenizer, items, words_given: bool, max_seq_length: int):
    cls_id, sep_id, unk = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.unk_token_id
    if not words_given:
        encoded = tokenizer(list(items), max_length=max_seq_length, truncation=True)
        return encoded["input_ids"], None
    flat = [w for words in items for w in words]
    pieces = tokenizer.encode_words(flat) if flat else []
    rows, positions, at = [], [], 0
    for n, words in enumerate(items):
        ids, firsts = [cls_id], []
        for p in pieces[at : at + len(words)]:
            firsts.append(len(ids))
            ids += p or [unk]
        at += len(words)
        ids.append(sep_id)
        if len(ids) > max_seq_length:
            raise ValueError(
                f"item {n}: {len(words)} words make {len(ids)} pieces, over max_seq_length "
                f"{max_seq_length}"
            )
        rows.append(ids)
        positions.append(torch.tensor(firsts, dtype=torch.long))
    return rows, positions


def token_ids(tokenizer, items, max_seq_length: int = 512) -> list[torch.Tensor]:
    """The id of what each row of `extract`'s features stands for, per item: every WordPiece of
    a text ([CLS] and [SEP] included), or each word's first piece for lists of words."""
    words_given = bool(items) and not isinstance(items[0], str)
    rows, positions = _encode(tokenizer, items, words_given, max_seq_length)
    if positions is None:
        return [torch.tensor(r, dtype=torch.long) for r in rows]
    return [torch.tensor(r, dtype=torch.long)[p] for r, p in zip(rows, positions, strict=True)]


def save_features(
    features: dict[str, list[torch.Tensor]],
    path: str | os.PathLike,
    metadata: dict | None = None,
    ids: list[torch.Tensor] | None = None,
) -> Path:
    """One `.safetensors` file, rows of all items concatenated (CSR layout):

    - `<selection>` (rows, width) for each selection, `:` written `_` (`layer:2` -> `layer_2`;
      `all` is (rows, L+1, H));
    - `offsets` (items + 1,): item i is rows offsets[i]:offsets[i+1];
    - `token_ids` (rows,) with `ids` (`token_ids(...)`): the piece each row stands for, so a row
      can be read back as text with the model's vocab.txt;
    - string metadata: the model, the input, `per_word`. `load_features` reads it back."""
    from safetensors.torch import save_file

    from bertkit._io import atomic_path

    path = Path(path)
    tensors: dict[str, torch.Tensor] = {}
    lengths: list[int] = []
    for selection, rows in features.items():
        tensors[selection.replace(":", "_")] = torch.cat(rows).contiguous()
        lengths = [len(r) for r in rows]
    tensors["offsets"] = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.long)
    if ids is not None:
        if [len(i) for i in ids] != lengths:
            raise ValueError("token ids and features disagree on the rows of some item")
        tensors["token_ids"] = torch.cat(ids).contiguous()
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={k: str(v) for k, v in (metadata or {}).items()})
    return path


def read_items(
    path: str | os.PathLike, *, words: bool = False, conll: bool = False
) -> list[str] | list[list[str]]:
    """What `bertkit extract` reads: one text per line, or (`words`) one whitespace-split
    sentence per line, or (`conll`) the sentences of a CoNLL-2003 file. An empty line is an
    error naming the file and line."""
    if conll:
        from bertkit.tasks.ner import read_conll

        return [list(s.words) for s in read_conll(path)]
    with open(path, encoding="utf-8") as handle:
        lines = [line.rstrip("\n") for line in handle]
    empty = [n for n, line in enumerate(lines, start=1) if not line.strip()]
    if empty:
        raise ValueError(f"{path}:{empty[0]}: an empty line (one item per line)")
    return [line.split() for line in lines] if words else lines


@dataclass
class ExtractConfig(Settings):
    """What `extract_file` (`bertkit extract`) reads and keeps: its flags are these fields."""

    layers: str = setting(
        "last",
        "comma-separated: embeddings, last, second_to_last, sum_last_4, concat_last_4, all, "
        "layer:N",
    )
    words: bool = setting(False, "lines are words: one row per word (first piece)")
    conll: bool = setting(False, "input is a CoNLL file: per word")
    max_seq_length: int = setting(512, "pieces per text", check="positive")
    batch_size: int = setting(32, "texts per model call", check="positive")
    device: str | None = device_setting()

    def selections(self) -> list[str]:
        return [s.strip() for s in self.layers.split(",") if s.strip()]


def extract_file(
    model: str | os.PathLike,
    source: str | os.PathLike,
    out: str | os.PathLike,
    config: ExtractConfig | None = None,
    **settings: Any,
) -> tuple[Path, dict[str, list[torch.Tensor]]]:
    """The features of `source`'s items (`read_items`) under `model` in `out` (`save_features`,
    with each row's token id), as `config` (or ExtractConfig's fields by name) says. Returns
    the file and the features."""
    from bertkit.inference.loader import load

    config = replaced(config or ExtractConfig(), **settings)
    items = read_items(source, words=config.words, conll=config.conll)
    loaded = load(model, head="BertModel", device=config.device)
    tokenizer, encoder = loaded.tokenizer, loaded.model
    features = extract(encoder, tokenizer, items, config.selections(),
                       max_seq_length=config.max_seq_length, batch_size=config.batch_size,
                       device=config.device)  # fmt: skip
    meta = {"model": str(model), "input": str(source), "per_word": config.words or config.conll}
    ids = token_ids(tokenizer, items, config.max_seq_length)
    return save_features(features, out, meta, ids=ids), features


def load_features(path: str | os.PathLike, selection: str) -> list[torch.Tensor]:
    """The per-item tensors of one selection from a file `save_features` wrote."""
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    key = selection.replace(":", "_")
    if key not in tensors:
        names = sorted(k for k in tensors if k not in ("offsets", "token_ids"))
        raise KeyError(f"{path}: no features {selection!r}; it has {names}")
    offsets = tensors["offsets"].tolist()
    return [tensors[key][a:b] for a, b in zip(offsets[:-1], offsets[1:], strict=True)]


class ScalarMix(nn.Module):
    """A learned weighted sum of all layers, gamma * sum_j softmax(w)_j h_j (ELMo's)."""

    def __init__(self, num_layers: int) -> None:
        super().__init__()
        self.weights = nn.Parameter(torch.zeros(num_layers))
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, stacked: torch.Tensor) -> torch.Tensor:  # (..., layers, H) -> (..., H)
        return self.gamma * torch.einsum("...lh,l->...h", stacked, self.weights.softmax(0))


class BiLSTMTagger(nn.Module):
    """The paper's feature-based NER model: frozen features -> 2-layer BiLSTM -> classifier.
    With `mix_layers`, the input is every layer (`all`) combined by a learned `ScalarMix`."""

    def __init__(
        self,
        input_size: int,
        num_labels: int,
        hidden_size: int = 768,
        num_layers: int = 2,
        dropout: float = 0.1,
        mix_layers: int | None = None,
    ) -> None:
        super().__init__()
        self.mix = ScalarMix(mix_layers) if mix_layers else None
        self.dropout = nn.Dropout(dropout)
        self.lstm = nn.LSTM(
            input_size,
            hidden_size,
            num_layers=num_layers,
            bidirectional=True,
            batch_first=True,
            dropout=dropout if num_layers > 1 else 0.0,
        )
        self.classifier = nn.Linear(2 * hidden_size, num_labels)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """(B, T, D) or (B, T, layers, H) features, (B,) lengths -> (B, T, labels) logits."""
        if self.mix is not None:
            features = self.mix(features)
        packed = nn.utils.rnn.pack_padded_sequence(
            self.dropout(features), lengths.cpu(), batch_first=True, enforce_sorted=False
        )
        out, _ = self.lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(
            out, batch_first=True, total_length=features.shape[1]
        )
        return self.classifier(self.dropout(out))


class _TaggerObjective:
    """The tagger's loss for the `Trainer`: cross-entropy of every word's tag."""

    def counts(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.tensor([float((batch["labels"] != IGNORE_INDEX).sum())], dtype=torch.float64)

    def loss(self, model, batch, totals):
        logits = model(batch["features"], batch["lengths"])
        total = token_loss(logits, batch["labels"], reduction="sum")
        units = (batch["labels"] != IGNORE_INDEX).sum()
        stats = torch.stack([total.detach().double(), units.double()])
        return total / totals[0].clamp(min=1), stats

    def log_entry(self, sums: torch.Tensor) -> dict[str, float]:
        loss, units = sums.tolist()
        return {"loss": round(loss / max(units, 1), 6)}


def _tagger_batch(items: Sequence[tuple[torch.Tensor, list[int]]]) -> dict[str, torch.Tensor]:
    x, lengths = _pad([features for features, _ in items])
    labels = torch.full(x.shape[:2], IGNORE_INDEX, dtype=torch.long)
    for j, (_, tags) in enumerate(items):
        labels[j, : len(tags)] = torch.tensor(tags)
    mask = (torch.arange(x.shape[1]) < lengths[:, None]).long()  # what the loop counts as tokens
    return {"features": x, "lengths": lengths, "labels": labels, "attention_mask": mask}


def train_tagger(
    train: tuple[list[torch.Tensor], list[list[int]]],
    dev: tuple[list[torch.Tensor], list[list[int]]],
    num_labels: int,
    *,
    hidden_size: int = 768,
    epochs: int = 4,
    batch_size: int = 32,
    learning_rate: float = 1e-3,
    seed: int = 0,
    mix_layers: int | None = None,
    device: str | torch.device = "cpu",
    out: str | os.PathLike | None = None,
    resume: bool = False,
    progress: bool = False,
) -> tuple[BiLSTMTagger, list[list[int]]]:
    """Train a `BiLSTMTagger` on per-word features and label ids; return it and its dev
    predictions (label ids per word) after the last epoch. It trains on the `Trainer`: Adam
    (AdamW without weight decay) at a constant `learning_rate`, gradients clipped at 1, random
    batches; with `out`, the run's log.jsonl and a checkpoint every epoch go there, and
    `resume` continues a killed run (without `out`, a temporary folder)."""
    from bertkit.tasks.base import FinetuneData
    from bertkit.training.config import TrainingConfig
    from bertkit.training.distributed import Distributed
    from bertkit.training.loop import Trainer
    from bertkit.training.optim import OptimConfig

    torch.manual_seed(seed)
    features, labels = train
    width = features[0].shape[-1]
    tagger = BiLSTMTagger(width, num_labels, hidden_size, mix_layers=mix_layers)
    data = FinetuneData(
        list(zip(features, labels, strict=True)),
        batch_size,
        _tagger_batch,
        seed=seed,
        bucket_batches=1,
        lengths=[len(f) for f in features],
    )
    steps = data.batches_per_epoch * epochs
    with contextlib.ExitStack() as stack:
        if out is None:
            out = stack.enter_context(tempfile.TemporaryDirectory(prefix="bertkit-tagger-"))
        Path(out).mkdir(parents=True, exist_ok=True)
        config = TrainingConfig(
            out_dir=str(out),
            max_steps=steps,
            optim=OptimConfig(
                learning_rate=learning_rate, warmup_steps=0, schedule="constant", weight_decay=0.0
            ),
            log_every=max(1, min(50, data.batches_per_epoch // 4)),
            save_every=data.batches_per_epoch,
            seed=seed,
            resume=resume,
            progress=progress,
            extra={"tagger": {"hidden_size": hidden_size, "mix_layers": mix_layers}},
        )
        trainer = Trainer(
            tagger,
            _TaggerObjective(),
            data,
            config,
            dist_info=Distributed(device=torch.device(device)),
        )
        trainer.train()
    return tagger, predict_tags(tagger, dev[0], batch_size, device)


@torch.no_grad()
def predict_tags(tagger, features, batch_size: int = 64, device="cpu") -> list[list[int]]:
    tagger.eval()
    predictions = []
    for start in range(0, len(features), batch_size):
        chunk = features[start : start + batch_size]
        x, lengths = _pad(chunk)
        best = tagger(x.to(device), lengths).argmax(-1).cpu()
        predictions += [best[j, : len(f)].tolist() for j, f in enumerate(chunk)]
    return predictions


def _pad(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(r) for r in rows])
    padded = torch.zeros(len(rows), int(lengths.max()), *rows[0].shape[1:])
    for j, r in enumerate(rows):
        padded[j, : len(r)] = r
    return padded, lengths
