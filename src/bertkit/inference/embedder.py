"""`Embedder`: vectors of raw texts from a model folder — the one path from text to vectors.
The Python API, `bertkit embed`'s corpus jobs (`jobs.embed.EmbeddingMapper`), search's queries
(`jobs.embed.query_embedder`) and serve's /embed, /v1/embeddings and /similarity all call it, so
one text gets one vector through every door.

    Embedder("runs/emb")(["A man is eating.", "Someone eats."])   # (2, H) unit vectors

One length rule (`reading_length`): the folder's declared length (sentence-transformers'
`sentence_bert_config.json`, a fine-tuned folder's task record), else what its tokenizer and its
positions allow — sentence-transformers' own rule. One pooling rule: the folder's declared
pooling (`1_Pooling/config.json`), else the mean of the real tokens' final states.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from bertkit.core.embedding import (
    MultiVector,
    Splade,
    maxsim,
    pool,
    prompt_for,
    read_multi_vector,
    read_pooling,
    read_prompts,
    read_splade,
    shortened,
)
from bertkit.inference.loader import Loaded, load, reading_length
from bertkit.inference.texts import Ids, Text

SparseVector = tuple[np.ndarray, np.ndarray]  # a sparse vector's indices (int32) and values
SPARSE_TOKENS = 2048  # tokens whose vocabulary-wide logits are held at once


class Row(NamedTuple):
    """An input as the model reads it: its piece ids, segment ids, and how many of its first
    pieces pooling leaves out ([CLS] and a prompt's pieces where the folder's pooling does not
    count the prompt; 0: all are pooled)."""

    ids: list[int]
    types: list[int]
    unpooled: int = 0
    unattended: int = 0  # trailing pieces computed but not attended to (ColBERT's expansion)


class Embedder:
    """Vectors of texts (`Text`: a text, a pair, or token ids) from a model folder — a bertkit
    sentence-embedding model, a sentence-transformers folder, a fine-tuned folder's encoder, or
    any encoder of the family: its declared pooling, else mean; unit length unless `normalize`
    is false; in batches of `batch_size` formed longest first (a batch of like lengths wastes
    less on padding; the unpadded encoder computes real tokens only). `precision` as for predict
    and serve: `auto` is bf16 autocast where the device runs bf16 natively (the vectors then
    equal fp32's within bf16's rounding), fp32 elsewhere. `max_seq_length`: where texts are cut
    (default: `reading_length`'s rule). `backend` (torch|onnx) and `compile` (off|on) as
    `bertkit predict` takes them.

    `prompt_name`: one of the prompts the folder declares (sentence-transformers'
    config_sentence_transformers.json, e.g. "query"), put before each text as
    `SentenceTransformer.encode(prompt_name=...)` puts it (default: the folder's
    `default_prompt_name`, else none); an unknown name is refused, listing the folder's.
    `truncate_dim`: the first that many coordinates of each vector (a Matryoshka model's
    smaller size), cut before the vector is brought to unit length — the direction
    `SentenceTransformer(truncate_dim=...)` gives, at unit length. `sparse`: open the
    masked-LM head too, for `sparse` vectors (a SparseEncoder folder's SPLADE pooling opens it
    anyway).

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
        backend: str = "torch",
        compile: str = "off",
        prompt_name: str | None = None,
        truncate_dim: int | None = None,
        sparse: bool = False,
    ) -> None:
        from bertkit.core.hub import model_dir

        path = model_dir(model)  # a folder, or a Hub name
        # a SPLADE folder (or `sparse`): its masked-LM head too
        sparse = sparse or read_splade(path) is not None
        if sparse and backend != "torch":
            raise ValueError(f"{path}: sparse (SPLADE) vectors run on the torch backend")
        loaded = load(path, head="BertForMaskedLM" if sparse else "BertModel", device=device,
                      precision=precision, backend=backend, compile=compile)  # fmt: skip
        mlm = loaded.model.cls.predictions if sparse else None
        self._open(loaded, loaded.encoder, batch_size, max_seq_length, pooling, normalize,
                   truncate_dim, mlm)  # fmt: skip
        self.use_prompt(prompt_name)

    @classmethod
    def of(
        cls,
        loaded: Loaded,
        encoder: Any = None,
        *,
        batch_size: int = 64,
        max_seq_length: int | None = None,
        pooling: str | None = None,
        normalize: bool = True,
        truncate_dim: int | None = None,
        mlm: Any = None,
    ) -> Embedder:
        """The embedder of a folder already opened (`loader.load`): its `encoder` (default
        `loaded.encoder`: a head's `.bert`, an ONNX export of the encoder) — what serve embeds
        with, whatever else the folder answers; `mlm`: its masked-LM head's predictions (what
        `sparse` reads)."""
        embedder = cls.__new__(cls)
        embedder._open(loaded, loaded.encoder if encoder is None else encoder, batch_size,
                       max_seq_length, pooling, normalize, truncate_dim, mlm)  # fmt: skip
        return embedder

    def _open(self, loaded: Loaded, encoder: Any, batch_size: int, max_seq_length: int | None,
              pooling: str | None, normalize: bool, truncate_dim: int | None,
              mlm: Any = None) -> None:  # fmt: skip
        self.loaded, self.encoder, self.device = loaded, encoder, loaded.device
        self.mlm = mlm
        # how sparse vectors pool the masked-LM logits: the folder's SPLADE pooling, else
        # SPLADE v2's (max, relu), as text-embeddings-inference's --pooling splade
        declared = read_splade(loaded.path)
        self.splade, self.declares_sparse = declared or Splade(), declared is not None
        # per-token vectors: a MultiVectorEncoder folder's settings, else each token's final
        # state at unit length
        multi = read_multi_vector(loaded.path)
        self.multi, self.declares_multi_vector = multi or MultiVector(), multi is not None
        self.projection: torch.nn.Linear | None = None
        if self.multi.projection is not None:
            self.projection = _linear(loaded.path / self.multi.projection, self.device)
        self.tokenizer, self.precision = loaded.tokenizer, loaded.precision
        self.pooling = pooling or read_pooling(loaded.path) or "mean"
        pool(torch.zeros(1, 1, 1), torch.ones(1, 1), self.pooling)  # an unknown pooling refused
        self.batch_size, self.normalize = batch_size, normalize
        self.max_seq_length = reading_length(loaded, max_seq_length)
        self.width = loaded.config.hidden_size  # the model's vectors, before any cut
        if truncate_dim is not None and not 1 <= truncate_dim <= self.width:
            raise ValueError(f"{loaded.path}: truncate_dim (--dimensions) must be from 1 to "
                             f"the model's {self.width} dimensions, not {truncate_dim}")  # fmt: skip
        self.truncate_dim = truncate_dim
        self.dimension = truncate_dim or self.width  # the vectors this embedder gives
        self.pad_id = self.tokenizer.pad_token_id
        self.pair_specials = self.tokenizer.special_tokens_added(True)
        self.prompts, default, self.include_prompt = read_prompts(loaded.path)
        self._prompted: dict[str, tuple[str, int]] = {}
        self.prompt_name: str | None = None
        if default is not None:
            self.use_prompt(default)

    def use_prompt(self, name: str | None) -> None:
        """Put the folder's prompt `name` before every text from now on (None: the folder's
        default prompt, else none)."""
        if name is not None:
            self.resolve_prompt(name)  # an unknown name refused now
            self.prompt_name = name

    def prompt_for(self, role: str) -> str | None:
        """The prompt name a `role` ("query" or "document") takes by default, as
        sentence-transformers' encode_query/encode_document choose it: the folder's prompt of
        that role, else its default prompt (None: no prompt)."""
        return prompt_for(self.prompts, role) or self.prompt_name

    @property
    def prompt(self) -> str:
        """The text put before each text by default ("" for none)."""
        return self.resolve_prompt(self.prompt_name)[0]

    @property
    def token_dimension(self) -> int:
        """The width of the per-token vectors `multi_vector` gives (the projection's, cut to
        `truncate_dim`)."""
        width = self.projection.out_features if self.projection is not None else self.width
        return min(self.truncate_dim or width, width)

    def resolve_prompt(self, name: str | None) -> tuple[str, int]:
        """Prompt `name`'s text and the pieces pooling leaves out with it (0 where the pooling
        counts the prompt): [CLS] and the prompt's pieces, as sentence-transformers counts its
        prompt_length (the prompt tokenized alone, less [SEP])."""
        if name is None:
            return "", 0
        if name not in self._prompted:
            if name not in self.prompts:
                declared = ", ".join(sorted(self.prompts)) or "none"
                raise ValueError(f"{self.loaded.path}: no prompt named {name!r} (the folder "
                                 f"declares {declared}, in config_sentence_transformers.json)")  # fmt: skip
            text = self.prompts[name]
            unpooled = 0
            if text and not self.include_prompt:
                unpooled = len(self.tokenizer.encode_ids([text])[0]) + 1
            self._prompted[name] = (text, unpooled)
        return self._prompted[name]

    def __call__(self, texts: Sequence[Text], *, prompt_name: str | None = None) -> np.ndarray:
        """(N, H) float32 vectors of `texts`, in their order; `prompt_name`: this call's prompt
        (default: the embedder's)."""
        return self.encode(self.inputs(texts, prompt_name=prompt_name)[0])[0]

    def inputs(
        self,
        texts: Sequence[Text],
        *,
        prompt_name: str | Sequence[str | None] | None = None,
        max_length: int | None = None,
    ) -> tuple[list[Row], list[int]]:
        """Each text as the model reads it ([CLS] A [SEP], a pair as the tokenizer lays pairs
        out, token ids as given; cut to `max_length`, default `max_seq_length`), and its pieces
        before the cut. A text (not a pair, not token ids) gets its prompt before it:
        `prompt_name`, one for all or one per text (default: the embedder's)."""
        limit = min(max_length or self.max_seq_length, self.max_seq_length)
        rows: list[Row | None] = [None] * len(texts)
        lengths = [0] * len(texts)
        names = _each(prompt_name, len(texts)) if prompt_name is not None else None
        singles = [i for i, t in enumerate(texts) if isinstance(t, str)]
        pairs = [i for i, t in enumerate(texts) if not isinstance(t, (str, Ids))]
        for i, text in enumerate(texts):
            if isinstance(text, Ids):
                ids = list(text[:limit])
                rows[i], lengths[i] = Row(ids, [0] * len(ids)), len(text)
        if singles:
            room = limit - self.tokenizer.special_tokens_added(False)
            prompts = [self.resolve_prompt(self.prompt_name if names is None or names[i] is None
                                    else names[i]) for i in singles]  # fmt: skip
            plain = [
                prompt + str(texts[i]) for i, (prompt, _) in zip(singles, prompts, strict=True)
            ]
            encoded = self.tokenizer.encode_ids(plain)
            for i, ids, (_, unpooled) in zip(singles, encoded, prompts, strict=True):
                rows[i] = Row(*self.tokenizer.with_specials(ids[:room]), unpooled)
                lengths[i] = len(ids) + limit - room
        if pairs:
            firsts = self.tokenizer.encode_ids([texts[i][0] for i in pairs])
            seconds = self.tokenizer.encode_ids([texts[i][1] for i in pairs])
            cut = []
            for i, a, b in zip(pairs, firsts, seconds, strict=True):
                lengths[i] = len(a) + len(b) + self.pair_specials
                if lengths[i] <= limit:
                    rows[i] = Row(*self.tokenizer.with_specials(a, b or None))
                else:
                    cut.append(i)
            if cut:  # the tokenizer's own longest-first cut, as a cross-encoder's
                both = self.tokenizer([texts[i][0] for i in cut], [texts[i][1] for i in cut],
                                      max_length=limit, truncation=True)  # fmt: skip
                for i, ids, types in zip(cut, both["input_ids"], both["token_type_ids"],
                                         strict=True):  # fmt: skip
                    rows[i] = Row(ids, types)
        return rows, lengths  # type: ignore[return-value]

    @torch.inference_mode()
    def encode(
        self,
        rows: Sequence[Row],
        *,
        pooling: str | Sequence[str] | None = None,
        normalize: bool | Sequence[bool] | None = None,
    ) -> tuple[np.ndarray, list[int]]:
        """(N, `dimension`) float32 vectors of `rows` (as `inputs` makes them), longest first in
        batches, back in the order given, and each row's pieces. `pooling` and `normalize`
        (default: the embedder's) may be given for each row (a server's batch mixes
        requests)."""
        poolings = _each(pooling or self.pooling, len(rows))
        normalized = _each(self.normalize if normalize is None else normalize, len(rows))
        out = np.zeros((len(rows), self.dimension), np.float32)
        for chosen, hidden, mask in self._batches(rows):
            hidden = hidden.float().cpu()
            batch = [rows[i] for i in chosen]
            if any(row.unpooled for row in batch):  # a prompt's tokens not pooled
                mask = mask.clone()
                for r, row in enumerate(batch):
                    mask[r, : row.unpooled] = 0
            for kind in {poolings[i] for i in chosen}:
                mine = [r for r, i in enumerate(chosen) if poolings[i] == kind]
                unit = torch.tensor([normalized[chosen[r]] for r in mine])
                vectors = shortened(pool(hidden[mine], mask[mine], kind), self.dimension, unit)
                out[[chosen[r] for r in mine]] = vectors.numpy()
        return out, [len(row.ids) for row in rows]

    def _batches(self, rows: Sequence[Row]) -> Iterator[tuple[list[int], torch.Tensor,
                                                               torch.Tensor]]:  # fmt: skip
        """The rows longest first in batches of `batch_size` (a batch of like lengths wastes
        less on padding): each batch's row numbers, its final states (B, S, H) where the model
        left them and its mask, under the precision's autocast — also while the caller's head
        runs on them."""
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i].ids))
        dtype = self.precision.dtype
        with torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None):
            for start in range(0, len(order), self.batch_size):
                chosen = order[start : start + self.batch_size]
                yield (chosen, *self._forward([rows[i] for i in chosen]))

    def sparse(self, texts: Sequence[Text], *,
               prompt_name: str | None = None) -> list[SparseVector]:  # fmt: skip
        """Each text's sparse (SPLADE) vector over the vocabulary, as
        sentence-transformers' `SparseEncoder.encode` makes it: (indices, values) of its
        non-zero entries, by index."""
        return self.encode_sparse(self.inputs(texts, prompt_name=prompt_name)[0])[0]

    @torch.inference_mode()
    def encode_sparse(self, rows: Sequence[Row]) -> tuple[list[SparseVector], list[int]]:
        """The sparse vectors of `rows` (as `inputs` makes them) and each row's pieces: the
        masked-LM head run on the real tokens only (never on padding), a few thousand tokens'
        vocabulary logits at a time, each text's `splade` pooling taken over its own tokens —
        for max pooling the max of the logits first, then log1p(ReLU) of that one row (the
        same numbers: the transform is monotonic)."""
        if self.mlm is None:
            raise ValueError(f"{self.loaded.path}: sparse (SPLADE) vectors need a masked-LM "
                             "head, and this model has none (a SparseEncoder folder or a "
                             "pre-trained BERT with its MLM head has one)")  # fmt: skip
        out: list[SparseVector] = [(np.zeros(0, np.int32), np.zeros(0, np.float32))] * len(rows)
        largest = self.splade.pooling == "max"
        for chosen, hidden, mask in self._batches(rows):
            packed = hidden[mask.to(hidden.device).bool()]  # (T, H): real tokens, in order
            ends = np.cumsum([len(rows[i].ids) for i in chosen]).tolist()
            first = 0
            while first < len(chosen):  # rows whose logits fit SPARSE_TOKENS together
                last = first + 1
                while (last < len(chosen)
                       and ends[last] - (ends[first - 1] if first else 0) <= SPARSE_TOKENS):  # fmt: skip
                    last += 1
                begin = ends[first - 1] if first else 0
                logits = self.mlm(packed[begin : ends[last - 1]]).float()
                for r in range(first, last):
                    a, b = (ends[r - 1] if r else 0) - begin, ends[r] - begin
                    # max: the largest logit, then the transform; sum: the transform of
                    # each token's, summed
                    weights = logits[a:b].amax(0) if largest else logits[a:b].clone()
                    weights = weights.relu_().log1p_()
                    if self.splade.activation == "log1p_relu":
                        weights = weights.log1p_()
                    if not largest:
                        weights = weights.sum(0)
                    index = torch.nonzero(weights).squeeze(1)
                    out[chosen[r]] = (index.cpu().numpy().astype(np.int32),
                                      weights[index].cpu().numpy())  # fmt: skip
                first = last
        return out, [len(row.ids) for row in rows]

    def multi_vector(self, texts: Sequence[str], *, role: str = "document",
                     prompt_name: str | None = None) -> list[np.ndarray]:  # fmt: skip
        """Each text's per-token vectors (n_i, D) float32 for late interaction (ColBERT's
        MaxSim), as sentence-transformers' `MultiVectorEncoder.encode_query` / `encode_document`
        make them for `role` "query" / "document": the role's prompt and length, queries
        padded with [MASK]s where the folder says, projected, skip-listed and normalised as its
        modules say."""
        return self.encode_multi(self.multi_inputs(texts, role, prompt_name), role)[0]

    def maxsim_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """Each (query, text)'s late-interaction score: MaxSim of the query's vectors (role
        query) over the text's (role document), divided by the query's count where the folder
        scores by meanmaxsim; each distinct query embedded once."""
        queries = sorted({query for query, _ in pairs})
        asked = dict(zip(queries, self.multi_vector(queries, role="query"), strict=True))
        texts = self.multi_vector([text for _, text in pairs])
        mean = self.multi.similarity == "meanmaxsim"
        return [float(maxsim(torch.from_numpy(asked[query]), [torch.from_numpy(vectors)],
                             mean)[0])
                for (query, _), vectors in zip(pairs, texts, strict=True)]  # fmt: skip

    def multi_inputs(self, texts: Sequence[str], role: str,
                     prompt_name: str | None = None) -> list[Row]:  # fmt: skip
        """Texts as a multi-vector model reads them in `role`: its prompt (`prompt_name`, else
        the folder's for the role), cut at the role's length, a query expanded to the
        expansion's length with its token (default [MASK]) — attended to or not as it says."""
        if role not in ("query", "document"):
            raise ValueError(f"role must be query or document, not {role!r}")
        spec = self.multi
        expansion = spec.expansion if role == "query" else None
        length = spec.query_length if role == "query" else spec.document_length
        if expansion is not None and expansion["strategy"] == "fixed":
            length = expansion["length"]
        rows, _ = self.inputs(texts, prompt_name=prompt_name or self.prompt_for(role),
                              max_length=length)  # fmt: skip
        if expansion is None:
            return rows
        token = expansion.get("token") or self.tokenizer.mask_token
        fill = self.tokenizer.vocab[token]
        floor, attend = expansion["length"], expansion.get("attend", False)
        expanded = []
        for row in rows:
            extra = max(floor - len(row.ids), 0)
            expanded.append(Row(row.ids + [fill] * extra, row.types + [0] * extra, row.unpooled,
                                0 if attend else extra))  # fmt: skip
        return expanded

    @torch.inference_mode()
    def encode_multi(self, rows: Sequence[Row],
                     role: str = "document") -> tuple[list[np.ndarray], list[int]]:  # fmt: skip
        """The per-token vectors of `rows` (as `multi_inputs` makes them) and each row's pieces:
        longest first in batches, unpadded where no query expansion hides pieces from
        attention."""
        spec = self.multi
        skipped = torch.tensor(self._skiplist_ids(), dtype=torch.long)
        drop = len(skipped) > 0 and role in spec.skiplist_tasks
        keep = (torch.tensor(spec.keep_only, dtype=torch.long)
                if spec.keep_only and role != "query" else None)  # fmt: skip
        out: list[np.ndarray] = [np.zeros((0, self.dimension), np.float32)] * len(rows)
        for chosen, hidden, _ in self._batches(rows):
            if self.projection is not None:
                hidden = self.projection(hidden)
            hidden = hidden.float().cpu()
            for r, i in enumerate(chosen):
                ids = torch.tensor(rows[i].ids)
                kept = torch.ones(len(ids), dtype=torch.bool)
                if drop:
                    kept &= ~torch.isin(ids, skipped)
                if keep is not None:
                    kept &= torch.isin(ids, keep)
                vectors = hidden[r, : len(ids)][kept]
                if spec.normalize:
                    vectors = torch.nn.functional.normalize(vectors, dim=-1)
                if self.truncate_dim is not None:
                    vectors = shortened(vectors, self.truncate_dim, True)
                out[i] = vectors.numpy()
        return out, [len(row.ids) for row in rows]

    def _skiplist_ids(self) -> list[int]:
        """The skip-list words' ids: those that are one piece of the vocabulary (as
        sentence-transformers resolves them: one that is not is left out)."""
        vocab, unknown = self.tokenizer.vocab, self.tokenizer.unk_token
        return [vocab[w] for w in self.multi.skiplist if w in vocab or w == unknown]

    def _forward(self, rows: list[Row]) -> tuple[torch.Tensor, torch.Tensor]:
        """The final states (B, S, H) of a batch of rows where the model left them, and its
        mask (on the host)."""
        width = max(len(row.ids) for row in rows)
        ids = np.full((len(rows), width), self.pad_id, np.int64)
        types = np.zeros((len(rows), width), np.int64)
        mask = np.zeros((len(rows), width), np.int64)
        for r, row in enumerate(rows):
            ids[r, : len(row.ids)] = row.ids
            types[r, : len(row.types)] = row.types
            mask[r, : len(row.ids) - row.unattended] = 1
        input_ids, token_types, attention = map(torch.from_numpy, (ids, types, mask))
        if any(row.unattended for row in rows):
            # pieces no token attends to, computed all the same (ColBERT's query expansion):
            # the padded forward, which computes every position
            padded: Any = self.encoder
            hidden = padded(input_ids.to(self.device), token_types.to(self.device),
                            attention.to(self.device)).last_hidden_state  # fmt: skip
            return hidden, attention
        if isinstance(self.encoder, torch.nn.Module):
            encoder: Any = self.encoder
            # where the real tokens are, worked out on the host: the forward need not count
            # them (and a compiled one must not)
            layouts = encoder.layouts(attention, tuple(attention.shape), self.device, unpad=True,
                                      causal=encoder.config.is_decoder).to(self.device)  # fmt: skip
            hidden = encoder(input_ids.to(self.device), token_types.to(self.device),
                             attention.to(self.device), unpad=True, layouts=layouts
                             ).last_hidden_state  # fmt: skip
        else:  # an ONNX Runtime session of the encoder
            hidden = self.encoder(input_ids=input_ids, token_type_ids=token_types,
                                  attention_mask=attention).last_hidden_state  # fmt: skip
        return hidden, attention


def _linear(folder: Any, device: torch.device) -> torch.nn.Linear:
    """A sentence-transformers Dense module's linear map (its config.json and weights)."""
    import json

    from safetensors.torch import load_file

    settings = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    file = folder / "model.safetensors"
    if not file.exists():
        raise FileNotFoundError(f"{file}: the projection's weights are missing")
    weights = load_file(file)
    layer = torch.nn.Linear(settings["in_features"], settings["out_features"],
                            bias=bool(settings.get("bias", True)))  # fmt: skip
    layer.load_state_dict({k.removeprefix("linear."): v for k, v in weights.items()})
    return layer.to(device).eval()


def _each(value: Any, count: int) -> list[Any]:
    """`value` for each of `count` rows: a sequence as it is, one value repeated.

    >>> _each("mean", 2), _each([True, False], 2)
    (['mean', 'mean'], [True, False])
    """
    if isinstance(value, (str, bool)):
        return [value] * count
    return list(value)
