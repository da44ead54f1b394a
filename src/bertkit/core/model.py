"""The BERT encoder: embeddings, L post-LayerNorm Transformer layers, pooler (and, beyond the
paper, pre-LN layers and a GLU feed-forward: `BertConfig.layer_norm_position`/`feed_forward`).

Module and attribute names equal the checkpoints' own (`attention.self.query`, `LayerNorm`, ...),
so Hugging Face state dicts load unchanged and Google's TF names convert by a table
(`bertkit.core.checkpoint`). Nothing here knows about tasks, data or training.

Shapes: B batch, S sequence length, H hidden size, A attention heads, D = H / A head size.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint as activation_checkpoint

from bertkit.core.checkpoint import NEW_WEIGHTS, load_pretrained, save_pretrained
from bertkit.core.config import BertConfig
from bertkit.core.dropout import dropout as fast_dropout
from bertkit.core.family import family_of
from bertkit.core.rotary import local_attention, rotary_tables, rotated
from bertkit.core.unpad import Layouts, TokenLayout, by_sequence_from, row_multiple
from bertkit.precision import activated, cpu_flags


class BertEmbeddings(nn.Module):
    """Token + segment + learned position embeddings, then LayerNorm and dropout (the paper's
    Fig. 2). The family's variants (`core.family`): positions from row `position_offset`
    (RoBERTa's), no segment table (`type_vocab_size` 0), the tables `embedding_size` wide
    (ELECTRA's; `BertModel.embeddings_project` takes them to hidden_size)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        width = config.embedding_size or config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, width)
        rotary = family_of(config.model_type).positions == "rotary"  # (positions in attention)
        self.position_embeddings = (
            None if rotary else nn.Embedding(config.max_position_embeddings, width)
        )
        self.position_offset = config.position_offset
        self.token_type_embeddings = (
            nn.Embedding(config.type_vocab_size, width) if config.type_vocab_size else None
        )
        self.LayerNorm = nn.LayerNorm(width, eps=config.layer_norm_eps, bias=config.norm_bias)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, S)
        token_type_ids: torch.Tensor | None = None,  # (B, S), 0 for segment A, 1 for B
        position_ids: torch.Tensor | None = None,  # (B, S) or (S,) rows of the table,
        # default position_offset + 0..S-1
        layout: TokenLayout | None = None,
    ) -> torch.Tensor:  # (B, S, H); with `layout`, its rows (its dropout masks: TokenLayout)
        seq_len, first = input_ids.shape[1], self.position_offset
        table = self.position_embeddings
        positions: torch.Tensor | float = 0.0
        if table is not None and position_ids is None:
            positions = table.weight[first : first + seq_len]  # (S, H)
        elif table is not None:
            positions = table(position_ids)
        segments: torch.Tensor | None = None  # (looked up first: an export's node order)
        if self.token_type_embeddings is not None and token_type_ids is None:
            segments = self.token_type_embeddings.weight[0]  # (H,): all segment A
        elif self.token_type_embeddings is not None:
            segments = self.token_type_embeddings(token_type_ids)  # (B, S, H)
        words = self.word_embeddings(input_ids)
        if segments is not None:  # words + segments + positions, transformers' order of the sums
            embeddings = words + segments + positions
        elif table is not None:  # no segments (DistilBERT, MPNet)
            embeddings = words + positions
        else:  # rotary positions and no segments (ModernBERT)
            embeddings = words
        embeddings = self.LayerNorm(embeddings)
        if layout is None:
            return self.dropout(embeddings)
        return layout.dropout(layout.to_rows(embeddings), self.dropout.p, self.training)


class _Projections(nn.Module):
    """Query, key and value of multi-head attention (HF's `BertSelfAttention`'s weights)."""

    def __init__(self, hidden: int, bias: bool = True) -> None:
        super().__init__()
        self.query = nn.Linear(hidden, hidden, bias=bias)
        self.key = nn.Linear(hidden, hidden, bias=bias)
        self.value = nn.Linear(hidden, hidden, bias=bias)


class _Projection(nn.Module):
    """A dense layer, and the LayerNorm after its residual sum when `eps` is given."""

    def __init__(self, size_in: int, size_out: int, eps: float | None = None, bias: bool = True,
                 norm_bias: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.dense = nn.Linear(size_in, size_out, bias=bias)
        if eps is not None:
            self.LayerNorm = nn.LayerNorm(size_out, eps=eps, bias=norm_bias)


class _Attention(nn.Module):
    """Attention's weights: `self` (query, key, value) and `output` (dense + LayerNorm; none in
    ModernBERT's first layer, which normalises nothing before attention)."""

    def __init__(self, hidden: int, eps: float | None, bias: bool = True,
                 norm_bias: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.self = _Projections(hidden, bias)
        self.output = _Projection(hidden, hidden, eps, bias, norm_bias)


# The containers above hold weights only, under the names of Google's and HF's checkpoints
# (`attention.output.LayerNorm.weight`); all of a layer's arithmetic is in `BertLayer.forward`.
class BertLayer(nn.Module):
    """One post-LN Transformer layer: x = LN(x + MHA(x)); x = LN(x + FFN(x)). Pre-LN
    (`layer_norm_position="pre"`): x = x + MHA(LN(x)); x = x + FFN(LN(x)), the same two
    LayerNorms (attention.output's before attention, output's before the feed-forward). GLU
    (`feed_forward="glu"`): FFN(x) = (act(x W) * (x V)) W_2 with [W; V] the intermediate dense."""

    def __init__(self, config: BertConfig, index: int = 0) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.layer_norm_eps
        self.num_heads = config.num_attention_heads
        self.head_size = config.head_size
        self.attention_dropout = config.attention_probs_dropout_prob
        self.pre_ln = config.layer_norm_position == "pre"
        self.glu = config.feed_forward == "glu"
        family = family_of(config.model_type)
        first_norm = eps if index or family.first_attention_norm else None
        self.attention = _Attention(hidden, first_norm, config.attention_bias, config.norm_bias)
        up = 2 * config.intermediate_size if self.glu else config.intermediate_size
        self.intermediate = _Projection(hidden, up, bias=config.mlp_bias)
        self.output = _Projection(config.intermediate_size, hidden, eps, config.mlp_bias,
                                  config.norm_bias)  # fmt: skip
        # ModernBERT's: this layer's kind ("full_attention" or "sliding_attention"), whose mask
        # and rotary base the encoder passes
        self.kind = config.layer_types[index] if config.layer_types else "full_attention"
        self.act_name, self.act = config.hidden_act, activation(config.hidden_act)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        # (DistilBERT's layers draw no dropout after the attention's output projection)
        self.attention_output_dropout = family.attention_output_dropout

    def forward(
        self,
        x: torch.Tensor,  # (N, H) token rows, or (B, S, H) on the padded path: see TokenLayout
        mask: torch.Tensor | None,  # (B, 1, 1|S, S) bool, True = may attend (or additive float,
        # 0 or the dtype's minimum: `padded_only`); None = attend to all
        layout: TokenLayout,
        output_attentions: bool = False,
        read: tuple[torch.Tensor, TokenLayout] | None = None,  # (rows, their layout): see below
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,  # (cos, sin) (S, D): ModernBERT
        reach: int | None = None,  # a sliding layer's: keys at most this far from the query
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rows in, rows out. With `read`, every row is still a key and a value, but the query
        projection, attention, output projection and feed-forward (five sixths of a layer's
        dense FLOPs) run only on the rows read after this layer, and only those rows come out
        (in `read`'s layout); queries and attention at every row where `read` has no
        `queries` (parity, a left-to-right mask, one layout structure: `BertModel.layouts`)."""
        attn, out = self.attention.self, self.attention.output
        normed = out.LayerNorm(x) if self.pre_ln and hasattr(out, "LayerNorm") else x
        within = None if read is None else read[0]  # the rows that come out (None: all)
        dropout_p = self.attention_dropout if self.training else 0.0
        probs = None
        k, v = attn.key(normed), attn.value(normed)  # (N, H) rows
        if rotary is not None and layout.spans is not None and not output_attentions:
            # ModernBERT sequence by sequence on the rows: each turned by its own positions,
            # its window over its own tokens (every query: its rows are few where it is read)
            context = layout.attend(attn.query(normed), k, v, self.num_heads,
                                    self.head_size**-0.5, dropout_p, rotary=rotary, reach=reach)  # fmt: skip
            if within is not None:
                context = context.index_select(0, within)
        elif rotary is not None:  # positions turn queries and keys: on the grid
            context, probs = self._grid_attention(attn.query(normed), k, v, mask, layout,
                                                  dropout_p, output_attentions, rotary=rotary,
                                                  reach=reach)  # fmt: skip
            if within is not None:
                context = context.flatten(0, -2).index_select(0, within)
        elif layout.spans is not None and not output_attentions:
            # sequence by sequence on the rows (CPU, right padding: see TokenLayout.attend),
            # queries only where the output is read
            asked = normed if within is None else normed.index_select(0, within)
            context = layout.attend(attn.query(asked), k, v, self.num_heads,
                                    self.head_size**-0.5, dropout_p, within)  # fmt: skip
        elif (read is not None and read[1].queries is not None and not output_attentions
              and (mask is None or mask.shape[-2] == 1)):  # fmt: skip
            # on the grid, queries only where the output is read, in their own narrow grid
            # (`TokenLayout.to_queries`), against every key
            asked = normed.flatten(0, -2).index_select(0, read[0])
            context, probs = self._grid_attention(attn.query(asked), k, v, mask, layout,
                                                  dropout_p, False, read[1])  # fmt: skip
        else:
            context, probs = self._grid_attention(attn.query(normed), k, v, mask, layout,
                                                  dropout_p, output_attentions)  # fmt: skip
            if within is not None:
                context = context.flatten(0, -2).index_select(0, within)
        if within is not None:
            x = x.flatten(0, -2).index_select(0, within)  # padded rows come as the grid

        def drop(rows: torch.Tensor) -> torch.Tensor:
            return layout.dropout(rows, self.dropout.p, self.training, within)

        attended = out.dense(context)
        if self.attention_output_dropout:
            attended = drop(attended)
        if self.pre_ln:
            x = x + attended
            h = self.feed_forward(self.output.LayerNorm(x))
            return x + drop(self.output.dense(h)), probs
        x = out.LayerNorm(x + attended)
        x = self.output.LayerNorm(x + drop(self.output.dense(self.feed_forward(x))))
        return x, probs

    def _grid_attention(
        self,
        q: torch.Tensor,  # (N, H) rows
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        layout: TokenLayout,
        dropout_p: float,
        output_attentions: bool,
        asked: TokenLayout | None = None,  # q holds these rows' queries alone (its `queries`)
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
        reach: int | None = None,  # a sliding window's half: attention chunk by chunk
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # context rows (N or R, H), probs (B, A, S, S)
        """Attention on the (B, S) grid: the rows scattered into it, the context gathered back.
        With `asked`, the queries are in their own (B, width) grid (`TokenLayout.to_queries`):
        a mask must then be one for every query (key padding)."""
        batch, seq_len, heads, size = layout.batch, layout.seq_len, self.num_heads, self.head_size
        k, v = (layout.to_grid(t).view(batch, seq_len, heads, size).transpose(1, 2)
                for t in (k, v))  # fmt: skip
        q = layout.to_grid(q) if asked is None else asked.to_queries(q)
        asks = q.shape[1]  # S, or the queries' grid width
        q = q.view(batch, asks, heads, size).transpose(1, 2)
        if rotary is not None:
            q, k = rotated(q, rotary), rotated(k, rotary)
        probs = None
        if reach is not None:  # a sliding window: each chunk of queries against its neighbours
            context = local_attention(q, k, v, mask, reach, size**-0.5, dropout_p, self.training)
            context = context.transpose(1, 2)  # (B, S, A, D)
            return layout.to_rows(context), None
        # SDPA draws its dropout with torch's CPU generator, one element at a time: on the CPU,
        # unless parity asks for those draws, attention is computed here with bertkit.core.dropout's
        fast_masks = dropout_p > 0.0 and not layout.parity and q.device.type == "cpu"
        if output_attentions or fast_masks:
            # Explicit softmax(QK^T / sqrt(D) + mask) so the probabilities can be returned. One
            # batched product with the scale and the additive mask folded in (baddbmm's alpha and
            # input): no separate passes, forward and backward, over the (B, A, S, S) scores.
            flat = batch * heads
            q3 = q.reshape(flat, asks, size)
            k3, v3 = (t.reshape(flat, seq_len, size) for t in (k, v))
            if mask is None:
                bias, beta = q3.new_zeros(()).expand(flat, asks, seq_len), 0.0
            else:
                bias, beta = _additive(mask, q3.dtype), 1.0  # (B, 1, 1|S, S)
                bias = bias.expand(batch, heads, *bias.shape[2:]).reshape(flat, -1, seq_len)
            scores = torch.baddbmm(bias, q3, k3.transpose(1, 2), beta=beta, alpha=size**-0.5)
            probs = scores.softmax(dim=-1).view(batch, heads, asks, seq_len)
            if asked is not None and self.training and dropout_p > 0.0:
                dropped = asked.drop_queries(probs, dropout_p)  # the grid's masks at its rows
            else:
                attention_dropout = F.dropout if layout.parity else fast_dropout
                dropped = attention_dropout(probs, dropout_p, self.training)
            context = torch.bmm(dropped.view(flat, asks, seq_len), v3)
            context = context.view(batch, heads, asks, size)  # (B, A, S or width, D)
        elif _products_on_the_grid(q, layout, dropout_p):
            context = _attention_by_products(q, k, v, mask, size**-0.5)  # (B, A, S or width, D)
        else:
            # the scale given, not derived from q's shape: exported to ONNX it is then a constant
            # that ONNX Runtime folds into the score product, instead of Sqrt and Mul on q and k
            if mask is not None and mask.is_floating_point() and mask.dtype != q.dtype:
                mask = mask.to(q.dtype)  # scores as a bias (MPNet's) under autocast
            context = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=1 / math.sqrt(size)
            )
        context = context.transpose(1, 2)  # (B, S or width, A, D)
        return (layout.to_rows(context) if asked is None else asked.from_queries(context)), probs

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, H) -> (N, I)
        """The intermediate activation: act(x W + b), or act(x W + b) * (x V + c) with GLU."""
        if not self.glu:
            return activated(self.intermediate.dense, x, self.act_name, self.act)
        gate, linear = self.intermediate.dense(x).chunk(2, dim=-1)
        return self.act(gate) * linear


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config, i) for i in range(config.num_hidden_layers))
        # MPNet's: a bias per head and bucket of relative distance, shared by every layer
        buckets = config.relative_attention_num_buckets
        self.relative_attention_bias = (
            nn.Embedding(buckets, config.num_attention_heads) if buckets else None
        )
        # pre-LN layers leave the residual stream un-normalised: one LayerNorm after the last
        self.LayerNorm = (
            nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=config.norm_bias)
            if config.layer_norm_position == "pre"
            else None
        )
        # Recompute each layer's activations in the backward pass: less memory, ~30% more compute.
        self.gradient_checkpointing = False

    def forward(
        self,
        x: torch.Tensor,  # token rows: (N, H), or (B, S, H) padded (see TokenLayout)
        mask: torch.Tensor | None,
        layout: TokenLayout,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        read: tuple[torch.Tensor, TokenLayout] | None = None,  # the last layer's, see BertLayer
        kinds: dict[str, tuple[Any, Any, Any]] | None = None,  # kind -> (mask, rotary, reach)
    ) -> tuple[torch.Tensor, tuple | None, tuple | None]:
        hidden_states: list[torch.Tensor] | None = [x] if output_hidden_states else None
        attentions: list[torch.Tensor] | None = [] if output_attentions else None
        last = len(self.layer) - 1
        for i, layer in enumerate(self.layer):
            read_i = read if i == last else None
            mask_i, rotary, reach = (mask, None, None) if kinds is None else kinds[str(layer.kind)]
            if self.gradient_checkpointing and self.training and not output_attentions:
                x, probs = activation_checkpoint(
                    layer, x, mask_i, layout, False, read_i, rotary, reach, use_reentrant=False
                )
            else:
                x, probs = layer(x, mask_i, layout, output_attentions, read_i, rotary, reach)
            if i == last and self.LayerNorm is not None:
                x = self.LayerNorm(x)
            if hidden_states is not None:
                hidden_states.append(x)
            if attentions is not None:
                attentions.append(probs)
        return (
            x,
            tuple(hidden_states) if hidden_states is not None else None,
            tuple(attentions) if attentions is not None else None,
        )


class BertPooler(nn.Module):
    """tanh(W h_[CLS] + b): the sentence representation NSP and classifiers read. With `at` (B,)
    it reads those positions instead (a left-to-right model's last real token: see
    `BertModel.forward`)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(  # (B, S, H) -> (B, H)
        self, hidden_states: torch.Tensor, at: torch.Tensor | None = None
    ) -> torch.Tensor:
        if at is None:
            return torch.tanh(self.dense(hidden_states[:, 0]))
        rows = torch.arange(hidden_states.shape[0], device=hidden_states.device)
        return torch.tanh(self.dense(hidden_states[rows, at]))


# ------------------------------------------------------------------------------ helpers
def activation(name: str):
    """The feed-forward non-linearity a config names ("gelu" is the exact erf GELU of the paper)."""
    if name == "gelu":
        return F.gelu
    if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    if name in ("silu", "swish"):
        return F.silu
    if name == "tanh":
        return torch.tanh
    raise ValueError(f"unknown activation {name!r}")


@dataclass
class BertModelOutput:
    last_hidden_state: torch.Tensor  # (B, S, H)
    pooler_output: torch.Tensor | None  # (B, H): tanh(W h_[CLS] + b); None without a pooler
    hidden_states: tuple[torch.Tensor, ...] | None = None  # L+1 x (B, S, H): embeddings, layer 1..L
    attentions: tuple[torch.Tensor, ...] | None = None  # L x (B, A, S, S) attention probabilities


def attention_mask_for(
    attention_mask: torch.Tensor | None, seq_len: int, causal: bool, device: torch.device
) -> torch.Tensor | None:
    """Boolean mask (True = may attend) for scaled_dot_product_attention.

    `attention_mask` is (B, S) with 1 for real tokens and 0 for padding; the result broadcasts
    over heads: (B, 1, 1, S), or (B, 1, S, S) / (1, 1, S, S) with the left-to-right constraint.
    """
    mask = None
    if attention_mask is not None:
        if attention_mask.dim() != 2 or attention_mask.shape[1] != seq_len:
            raise ValueError(
                f"attention_mask must be (batch, {seq_len}), got {tuple(attention_mask.shape)}"
            )
        mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, S)
    if causal:
        lower = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()
        mask = lower[None, None] if mask is None else mask & lower  # (B|1, 1, S, S)
    return mask


def relative_buckets(seq_len: int, buckets: int, device: torch.device | str,
                     max_distance: int = 128) -> torch.Tensor:  # fmt: skip
    """(S, S) the bucket of each (query, key) distance, T5's and MPNet's: half the buckets for
    keys before the query, half after; in each, distances below a quarter of the buckets
    exactly, farther ones on a log scale up to `max_distance`."""
    position = torch.arange(seq_len, dtype=torch.long, device=device)
    n = position[:, None] - position[None, :]  # query - key
    half = buckets // 2
    bucket = (n < 0).long() * half
    n = n.abs()
    exact = half // 2
    scaled = (
        exact
        + (torch.log(n.float() / exact) / math.log(max_distance / exact) * (half - exact)).long()
    )
    return bucket + torch.where(n < exact, n, scaled.clamp(max=half - 1))


# CPU inference under bf16: attention on a grid up to this wide by batched products
# (`_attention_by_products`) instead of SDPA's kernel. Padded grids from `unpad.by_sequence_from`
# (48) on attend sequence by sequence instead, so past 48 this takes the grids without padding
GRID_PRODUCTS_UNTIL = 96


@functools.cache
def _has_amx() -> bool:
    return "amx_bf16" in cpu_flags()


def _products_on_the_grid(q: torch.Tensor, layout: TokenLayout, dropout_p: float) -> bool:
    """Whether attention on this grid takes `_attention_by_products`: in inference (no gradient,
    no dropout) on the CPU with bf16 queries (autocast's), on grids up to GRID_PRODUCTS_UNTIL
    wide; not in parity mode (SDPA's numbers, as transformers computes them), nor compiled or
    traced (one graph, SDPA's). Alternated end to end on an AMD EPYC Zen 5 (AVX512-BF16), 2
    threads (`Embedder`, all-MiniLM-L6-v2, bf16; docs/results/embeddings), the encoding took
    1.11x less time than with SDPA on the grid for 2,048 SST-2 sentences and 1.05x for texts
    four times as long; in fp32 it gained nothing (0.997x). Not on a CPU with AMX, where SDPA's
    kernel runs its bf16 products on the matrix tiles and these fp32 scores would not: not
    measured there, SDPA kept."""
    return (
        q.device.type == "cpu"
        and q.dtype == torch.bfloat16
        and not _has_amx()
        and dropout_p == 0.0
        and not torch.is_grad_enabled()
        and not layout.parity
        and layout.seq_len <= GRID_PRODUCTS_UNTIL
        and not torch.compiler.is_compiling()
        and not torch.jit.is_tracing()
    )


def _attention_by_products(
    q: torch.Tensor,  # (B, A, S or width, D)
    k: torch.Tensor,  # (B, A, S, D)
    v: torch.Tensor,
    mask: torch.Tensor | None,  # (B | 1, 1 | A, 1 | S or width, S) Boolean or additive
    scale: float,
) -> torch.Tensor:  # (B, A, S or width, D)
    """softmax(q k^T scale + mask) v by batched products: the scores and the softmax in fp32 (as
    SDPA's CPU kernel keeps them under bf16), the weighted sum in v's dtype. On the narrow grids
    of short texts SDPA's CPU kernel costs about as much per head and block whatever the width
    (0.4-0.9 ms a layer for 32 sequences of 3-30 tokens on a Zen 5, 2 threads); three products
    over every head at once cost less."""
    batch, heads, asks, size = q.shape
    seq_len, flat = k.shape[2], batch * heads
    with torch.autocast(q.device.type, enabled=False):
        q3 = q.to(torch.float32, memory_format=torch.contiguous_format).view(flat, asks, size)
        k3 = k.to(torch.float32, memory_format=torch.contiguous_format).view(flat, seq_len, size)
        v3 = v.contiguous().view(flat, seq_len, size)
        if mask is None:
            scores = torch.bmm(q3, k3.transpose(1, 2)).mul_(scale)
        else:
            bias = _additive(mask, torch.float32).float()
            bias = bias.expand(batch, heads, bias.shape[2], seq_len).reshape(flat, -1, seq_len)
            scores = torch.baddbmm(bias, q3, k3.transpose(1, 2), alpha=scale)
        probs = scores.softmax(dim=-1).to(v3.dtype)
        return torch.bmm(probs, v3).view(batch, heads, asks, size)


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A Boolean mask (True = may attend) as scores to add: 0, or the dtype's minimum (exp of
    it minus the row's maximum is 0, as for -inf, without a row of -inf ever making NaN). A mask
    that is already additive comes back as it is."""
    if mask.is_floating_point():
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
        ~mask, torch.finfo(dtype).min
    )


@torch.no_grad()
def truncated_normal_(tensor: torch.Tensor, std: float) -> torch.Tensor:
    """Fill with N(0, std) truncated at +-2 std, TensorFlow's `truncated_normal_initializer`,
    by redrawing the values outside (4.6%, then 0.2%, ...): exact, and several times faster than
    torch.nn.init.trunc_normal_ on CPU."""
    if tensor.is_meta:
        return tensor
    flat = tensor.view(-1).normal_(0.0, std)
    redraw = (flat.abs() > 2 * std).nonzero().squeeze(1)  # one pass over the whole tensor
    while redraw.numel():
        values = flat.new_empty(redraw.numel()).normal_(0.0, std)
        flat[redraw] = values
        redraw = redraw[values.abs() > 2 * std]
    return tensor


@torch.no_grad()
def normal_(tensor: torch.Tensor, std: float) -> torch.Tensor:
    """Fill with N(0, std), as transformers' `_init_weights` draws a Linear's or Embedding's
    weight."""
    return tensor if tensor.is_meta else tensor.normal_(0.0, std)


# How new weights are drawn (`init_module`): Google's truncated normal (BERT's own code, for a
# model from scratch), or a plain normal (transformers': a head on a checkpoint, by default)
INITIALISATIONS = {"truncated-normal": truncated_normal_, "normal": normal_}
assert set(INITIALISATIONS) == set(NEW_WEIGHTS)  # (the names checkpoint.py checks)


class BertPreTrainedModel(nn.Module):
    """Shared by the encoder and every head: config, initialisation, checkpoint I/O."""

    # Sub-module holding the encoder in head models; empty for BertModel itself.
    base_model_prefix = "bert"

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        config.validate()
        self.config = config
        self.source_dir: str | None = None  # where from_pretrained read it (for its vocab)
        # Every position on the padded path, with no data-dependent shapes and an additive
        # attention mask: what an ONNX export traces (bertkit.inference.export sets it on the model and
        # its encoder); the default picks the faster unpadded path.
        self.padded_only = False
        # The padded path without data-dependent shapes, for CUDA graphs (`set_static_shapes`)
        self.static_shapes = False

    def init_weights(self) -> None:
        """Google's initialisation: weights ~ N(0, initializer_range) truncated at 2 sigma
        (tf.truncated_normal_initializer), biases 0, LayerNorm gain 1 / bias 0; then tie weights."""
        encoder = getattr(self, "bert", None)  # a head model's BertModel initialised itself
        for child in self.children():
            if child is not encoder:
                child.apply(self.init_module)
        self.tie_weights()

    def init_module(self, module: nn.Module, weights: str = "truncated-normal") -> None:
        """Initialise one module as Google does (what `init_weights` applies to every child); a
        checkpoint load gives the tensors the checkpoint lacks `weights`, a key of
        INITIALISATIONS: how Linear and Embedding weights are drawn, std initializer_range."""
        if weights not in INITIALISATIONS:
            raise ValueError(
                f"new weights are drawn {' or '.join(INITIALISATIONS)}, not {weights!r}"
            )
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            INITIALISATIONS[weights](module.weight, std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:  # (ModernBERT's have none)
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LSTM):
            module.reset_parameters()

    def tie_weights(self) -> None:
        """Heads that decode to the vocabulary share the word-embedding matrix (see heads.py)."""

    @property
    def num_parameters(self) -> int:
        """Distinct parameters (a tied matrix counts once)."""
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **kwargs: Any):
        """Load from a Hugging Face directory (config.json + model.safetensors / pytorch_model.bin)
        or a Google TF checkpoint directory (bert_config.json + bert_model.ckpt.*); see
        `bertkit.core.checkpoint.load_pretrained` for the options."""
        return load_pretrained(cls, path, **kwargs)

    def save_pretrained(self, directory: str | os.PathLike, **kwargs: Any) -> None:
        """Write config.json + model.safetensors (+ vocab.txt) that transformers loads unchanged;
        see `bertkit.core.checkpoint.save_pretrained`."""
        save_pretrained(self, directory, **kwargs)


class BertModel(BertPreTrainedModel):
    """The bidirectional Transformer encoder of the paper, with the pooler on [CLS].

    >>> model = BertModel(BertConfig.from_preset("tiny", vocab_size=100))
    >>> out = model(torch.tensor([[2, 5, 7, 3]]))
    >>> out.last_hidden_state.shape, out.pooler_output.shape
    (torch.Size([1, 4, 128]), torch.Size([1, 128]))
    """

    base_model_prefix = ""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        width = config.embedding_size or config.hidden_size
        # ELECTRA's: narrower embeddings projected to the encoder's width
        self.embeddings_project = (
            nn.Linear(width, config.hidden_size) if width != config.hidden_size else None
        )
        self.encoder = BertEncoder(config)
        # (a family whose checkpoints hold no pooler has none: DistilBERT, ELECTRA)
        self.pooler = (
            BertPooler(config)
            if add_pooling_layer and family_of(config.model_type).pooler
            else None
        )
        # Dropout masks as transformers draws them (TokenLayout.dropout): `set_dropout_parity`
        self.dropout_parity = False
        # Compiled for inference (`precision.compile_for_inference`): every batch's layouts
        # of one structure (see `layouts`)
        self.one_layout_structure = False
        # What the unpadded row count is rounded up to, when set (None: the device's
        # `row_multiple`): a few hundred gives a batch stream a handful of shapes, each a CUDA
        # graph on the unpadded path (gpu_throughput.py's `bertkit-graphs-unpadded`)
        self.rows_rounded_to: int | None = None
        # Unpadded inference on the CPU: attention sequence by sequence on the rows where that
        # is faster (`layouts`, TokenLayout.attend); False: on the grid (benchmarks' A/B)
        self.attention_by_sequence = True
        self.init_weights()

    def layouts(
        self,
        attention_mask: torch.Tensor | None,
        shape: tuple[int, int],
        device: torch.device | str,
        *,
        unpad: bool,
        causal: bool,
        read_positions: torch.Tensor | None = None,
        read_cls_only: bool = False,
    ) -> Layouts:
        """Where a forward's token rows sit in its (B, S) = `shape` grid (see `TokenLayout`):
        the real tokens' rows (`unpad` and a mask), the last layer's rows when only
        `read_positions` (B, P) and [CLS] (a left-to-right model: its last real token), or
        [CLS] alone (`read_cls_only`), are read after it, and whether attention needs the mask.
        Computed where `attention_mask` is: on the device by `forward`, or on the host before
        a batch goes to a GPU (`_Head.host_layouts`), so the GPU need not stop to count the
        real tokens; `device` is where the batch runs (it sets the row multiple)."""
        batch, seq_len = shape
        # `one_layout_structure`: rows gathered and the mask passed even without padding, so
        # that a compiled forward sees one structure (see TokenLayout.unpadded's `gather`)
        one = self.one_layout_structure
        multiple = self.rows_rounded_to or row_multiple(torch.device(device))
        parity, masked = self.dropout_parity, True
        if unpad and attention_mask is not None:
            # attention sequence by sequence on the rows where it beats SDPA on the grid: in
            # inference on the CPU, on grids wide enough (TokenLayout.attend, by_sequence_from);
            # not where the mask is more than padding, nor for an exported (`padded_only`) or
            # compiled (`one`: a loop over each batch's own spans is no one graph) model, nor in
            # parity mode (SDPA's numbers, as transformers computes them)
            width = by_sequence_from(torch.device(device))
            by_sequence = (self.attention_by_sequence and not self.training and width is not None
                           and seq_len >= width and not causal and not parity and not one
                           and not self.padded_only
                           and self.encoder.relative_attention_bias is None)  # fmt: skip
            layout = TokenLayout.unpadded(attention_mask, multiple, parity, gather=one,
                                          by_sequence=by_sequence)  # fmt: skip
            masked = one or layout.index is not None or causal or self.padded_only
        else:
            layout = TokenLayout(batch, seq_len, parity=parity)
        read = None
        if read_positions is not None or read_cls_only:
            where = attention_mask.device if attention_mask is not None else device
            keep = torch.zeros(batch, seq_len, dtype=torch.bool, device=where)
            if not causal:
                keep[:, 0] = True  # [CLS], read by the pooler
            else:
                rows = torch.arange(batch, device=where)
                keep[rows, _last_tokens(attention_mask, batch, seq_len, where)] = True
            if read_positions is not None:
                keep.scatter_(1, read_positions.long().to(where), True)
            # where attention takes the grid, the last layer asks only the read rows' queries
            # (`TokenLayout.queries`): not for one layout structure (the queries' grid changes
            # width), a left-to-right mask (one per query) or parity (transformers' draws)
            grid_queries = not (one or causal or parity or layout.spans is not None
                                or self.embeddings.position_embeddings is None)  # fmt: skip
            read = layout.subset(keep, 1 if one else multiple, queries=grid_queries)
        return Layouts(layout, read, masked)

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, S) token ids
        token_type_ids: torch.Tensor | None = None,  # (B, S) segment ids, default all 0
        attention_mask: torch.Tensor | None = None,  # (B, S) 1 = token, 0 = padding
        position_ids: torch.Tensor | None = None,
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        causal: bool | None = None,  # left-to-right mask; default config.is_decoder
        unpad: bool = False,
        read_positions: torch.Tensor | None = None,
        read_cls_only: bool = False,
        layouts: Layouts | None = None,
    ) -> BertModelOutput:
        """Encode a batch. With `unpad=True` and an `attention_mask`, the dense layers run on
        real tokens only (faster by the padding fraction) and every output is zero at padded
        positions; the outputs at real tokens are the same either way.

        `read_positions` (B, P) says that only those positions' final states will be read (and
        [CLS]'s, by the pooler): the last layer's feed-forward then runs only there and
        `last_hidden_state` is zero elsewhere (the masked LM passes its masked positions).
        `read_cls_only`: only [CLS]'s final state will be read (classifiers). Both are ignored
        when hidden states or attentions are asked for. A left-to-right (`causal`) model pools
        its last real token, not [CLS] (which sees only itself there). `layouts`: what
        `self.layouts` gives for these arguments, computed beforehand (on the host)."""
        self._check_inputs(input_ids, token_type_ids)
        seq_len = input_ids.shape[1]
        causal = self.config.is_decoder if causal is None else causal
        mask = attention_mask_for(attention_mask, seq_len, causal, input_ids.device)
        if self.padded_only and mask is not None:
            # What an ONNX export traces: an additive mask, made once. A Boolean one exports as
            # Where(mask, 0, -inf) before each layer's softmax and Where(IsNaN(p), 0, p) after
            # it; with the float mask those go, and real tokens' outputs are the same (exp of
            # the dtype's minimum minus the row's maximum is 0, as for -inf).
            mask = _additive(mask, self.embeddings.word_embeddings.weight.dtype)

        batch = input_ids.shape[0]
        # Left to right, [CLS] attends to itself alone, so a sentence representation read there
        # would be the same for every input: the pooler reads the last real token instead (the
        # final [SEP], which has seen the whole input, as GPT's classifier does). The paper does
        # not say where its LTR ablation's classifier reads.
        pool_at = _last_tokens(attention_mask, batch, seq_len, input_ids.device) if causal else None
        if layouts is None:
            reads_all = output_hidden_states or output_attentions
            layouts = self.layouts(
                attention_mask, (batch, seq_len), input_ids.device, unpad=unpad, causal=causal,
                read_positions=None if reads_all else read_positions,
                read_cls_only=read_cls_only and not reads_all,
            )  # fmt: skip
        elif (layouts.rows.batch, layouts.rows.seq_len) != (batch, seq_len):
            raise ValueError(
                f"layouts for a {layouts.rows.batch} x {layouts.rows.seq_len} batch, given "
                f"{batch} x {seq_len}"
            )
        layout, read = layouts.rows, layouts.read
        if not layouts.masked:
            # No padding (SQuAD's 384-piece windows, say): attention needs no mask, and without
            # one SDPA may take its flash kernel (a mask rules that out on CUDA)
            mask = None
        if self.encoder.relative_attention_bias is not None:  # MPNet's, added to every score
            mask = self._relative_bias(seq_len, input_ids.device, mask)
        kinds = self._kinds(seq_len, input_ids.device, mask, output_attentions)  # ModernBERT's
        x = self.embeddings(input_ids, token_type_ids, position_ids, layout)  # rows
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)
        x, hidden_states, attentions = self.encoder(
            x, mask, layout, output_hidden_states, output_attentions, read, kinds
        )
        x = (layout if read is None else read[1]).to_grid(x)  # (B, S, H)
        if hidden_states is not None:
            hidden_states = tuple(layout.to_grid(h) for h in hidden_states)
        pooled = self.pooler(x, pool_at) if self.pooler is not None else None  # (B, H)
        return BertModelOutput(x, pooled, hidden_states, attentions)

    def _kinds(self, seq_len: int, device: torch.device, mask: torch.Tensor | None,
               output_attentions: bool = False) -> dict[str, tuple[Any, Any, Any]] | None:  # fmt: skip
        """For rotary positions (ModernBERT's): each kind of layer's mask, (cos, sin) and
        reach. Global layers: the padding mask. Sliding ones: a window of `local_attention`
        pieces, half each side, computed chunk by chunk (`local_attention`: the keys within
        reach only, a few times the window a query instead of the whole input); as one band
        mask over the grid where the probabilities are asked for or the model is exported."""
        config = self.config
        if self.embeddings.position_embeddings is not None:
            return None
        size, theta = config.head_size, config.global_rope_theta or 160000.0
        kinds: dict[str, tuple[Any, Any, Any]] = {
            "full_attention": (mask, rotary_tables(seq_len, size, theta, device), None)
        }
        if config.layer_types and "sliding_attention" in config.layer_types:
            reach = (config.local_attention or 128) // 2
            tables = rotary_tables(seq_len, size, config.local_rope_theta or 10000.0, device)
            if not (output_attentions or self.padded_only):
                kinds["sliding_attention"] = (mask, tables, reach)
                return kinds
            position = torch.arange(seq_len, device=device)
            band = ((position[:, None] - position[None, :]).abs() <= reach)[None, None]
            if mask is None:
                local = band  # (1, 1, S, S)
            elif mask.dtype == torch.bool:
                local = mask & band
            else:  # an additive mask (an exported model's)
                local = mask + _additive(band, mask.dtype)
            kinds["sliding_attention"] = (local, tables, None)
        return kinds

    def _relative_bias(self, seq_len: int, device: torch.device,
                       mask: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
        """(1 or B, A, S, S): the relative position bias, plus the mask as scores."""
        table = self.encoder.relative_attention_bias
        assert table is not None
        buckets = relative_buckets(seq_len, table.num_embeddings, device)
        bias = table(buckets).permute(2, 0, 1).unsqueeze(0)  # (1, A, S, S)
        return bias if mask is None else _additive(mask, bias.dtype) + bias

    def _check_inputs(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> None:
        """Clear errors for a batch the model cannot read: its shape, length and ids."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, seq_len), got {tuple(input_ids.shape)}")
        seq_len = input_ids.shape[1]
        if seq_len > self.config.max_length:
            offset = self.config.position_offset
            raise ValueError(
                f"sequence length {seq_len} exceeds max_position_embeddings "
                f"({self.config.max_position_embeddings}"
                + (f", less {self.config.model_type}'s offset {offset}" if offset else "")
                + "); truncate the input (the tokenizer's max_length) or use a model with more "
                "positions"
            )
        if token_type_ids is not None and token_type_ids.shape != input_ids.shape:
            raise ValueError(
                f"token_type_ids {tuple(token_type_ids.shape)} must match input_ids "
                f"{tuple(input_ids.shape)}"
            )
        # a cheap check on the CPU (on a GPU it would force a sync; compiled, a graph break)
        if input_ids.device.type == "cpu" and not torch.compiler.is_compiling():
            _check_ids(input_ids, self.config.vocab_size, "input_ids", "vocab_size")
            if token_type_ids is not None and self.config.type_vocab_size:
                _check_ids(
                    token_type_ids, self.config.type_vocab_size, "token_type_ids", "type_vocab_size"
                )


def set_dropout_parity(model: nn.Module, parity: bool = True) -> nn.Module:
    """Draw the dropout masks of every encoder in `model` as transformers draws them (the
    padded grid's, from torch's generator: slower on the CPU), so that a seeded training run
    follows transformers' step for step; `parity=False`, the default, draws them for real
    tokens only with a parallel generator (`bertkit.core.dropout`): statistically the same run."""
    for module in model.modules():
        if isinstance(module, BertModel):
            module.dropout_parity = parity
    return model


def _last_tokens(attention_mask: torch.Tensor | None, batch: int, seq_len: int,
                 device: torch.device | str) -> torch.Tensor:  # fmt: skip
    """(B,) the position of each row's last real token."""
    if attention_mask is None:
        return torch.full((batch,), seq_len - 1, device=device)
    return attention_mask.long().cumsum(1).argmax(1)  # the last 1 of each row


def set_static_shapes(model: nn.Module, on: bool = True) -> nn.Module:
    """Train every head in `model` on the padded path with no data-dependent shape (no rows
    chosen by the mask, the last layer computed everywhere): a batch of a given shape then runs
    the same kernels on the same shapes, which CUDA graphs (`--compile graphs`) need. The
    outputs at real tokens are the unpadded path's."""
    for module in model.modules():
        if isinstance(module, BertPreTrainedModel):
            module.static_shapes = on
    return model


def set_activation_checkpointing(model: nn.Module, on: bool = True) -> nn.Module:
    """Recompute each encoder layer's activations in the backward pass (every encoder in
    `model`): far less activation memory, about a third more compute, the same gradients."""
    for module in model.modules():
        if isinstance(module, BertEncoder):
            module.gradient_checkpointing = on
    return model


def _check_ids(ids: torch.Tensor, limit: int, name: str, field: str) -> None:
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= limit):
        raise ValueError(
            f"{name} holds ids in [{int(ids.min())}, {int(ids.max())}] but the model's {field} is "
            f"{limit}: the tokenizer's vocabulary does not match this model"
        )
