"""Starting points for pre-training from scratch beyond Google's initialisation, each an option
of `bertkit pretrain` measured in docs/results/recipe/: every tensor keeps its shape and stays a
learned parameter of the paper's architecture (checkpoints load anywhere); only where training
starts differs.

- `local_attention_` (`--attention-init local`, in `--recipe laptop`): layer 1's heads start on
  each piece's left and right neighbours; what takes masked LM off the unigram plateau.
- `mimetic_attention_` (`--attention-init mimetic|mimetic-qk`): Trockman & Kolter (ICML 2023).
- `sinusoidal_positions_` (`--position-init sinusoidal`): Vaswani et al.'s sines.

`apply(model, position_init=..., attention_init=...)` is what `--position-init` and
`--attention-init` do to a freshly built model.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from bertkit.core.model import BertLayer, BertModel

POSITION_INITS = ("normal", "sinusoidal")
ATTENTION_INITS = ("normal", "mimetic", "mimetic-qk", "local")


def apply(
    model: nn.Module,
    *,
    position_init: str = "normal",
    attention_init: str = "normal",
    left_to_right: bool = False,
) -> nn.Module:
    """Lay the named starting points over a freshly initialised `model` (a BertModel or a head
    on one): "normal" leaves Google's initialisation as it is. `left_to_right`: the model
    cannot see to the right (Table 5's LTR row), so local attention looks two to the left."""
    if position_init not in POSITION_INITS:
        raise ValueError(f"position_init must be one of {POSITION_INITS}, not {position_init!r}")
    if attention_init not in ATTENTION_INITS:
        raise ValueError(f"attention_init must be one of {ATTENTION_INITS}, not {attention_init!r}")
    encoder = model if isinstance(model, BertModel) else model.bert
    assert isinstance(encoder, BertModel)
    if position_init == "sinusoidal":
        table = encoder.embeddings.position_embeddings
        if table is None:
            raise ValueError("position_init sinusoidal: this model has rotary positions, no table")
        sinusoidal_positions_(table, encoder.config.initializer_range)
    if attention_init in ("mimetic", "mimetic-qk"):
        vo = None if attention_init == "mimetic-qk" else (0.4, 0.4)
        for layer in encoder.encoder.layer:
            mimetic_attention_(layer, vo=vo)
    elif attention_init == "local":
        local_attention_(model, offsets=(-1, -2) if left_to_right else (-1, 1))
    return model


@torch.no_grad()
def sinusoidal_positions_(embedding: nn.Embedding, std: float) -> nn.Embedding:
    """Fill learned position embeddings with the Transformer's sinusoids (Vaswani et al. 2017,
    3.5), scaled to standard deviation `std`. The embeddings stay learned parameters (the
    architecture and checkpoints are BERT's); only their starting point differs from the
    truncated normal: PE(p + k) is a linear function of PE(p), so attention can learn "look one
    token to the left" once, for every position, instead of once per position."""
    positions, width = embedding.weight.shape
    p = torch.arange(positions, dtype=torch.float64)[:, None]
    rates = torch.exp(-math.log(10_000.0) * torch.arange(0, width, 2, dtype=torch.float64) / width)
    table = torch.zeros(positions, width, dtype=torch.float64)
    table[:, 0::2] = torch.sin(p * rates)
    table[:, 1::2] = torch.cos(p * rates)[:, : width // 2]
    table *= std / table.std()
    embedding.weight.copy_(table.to(embedding.weight.dtype))
    return embedding


def _factor(target: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left (H, rank) and right (rank, H) factors whose product is the best rank-`rank`
    approximation of `target` (SVD, singular values split evenly)."""
    u, s, vh = torch.linalg.svd(target)
    root = s[:rank].sqrt()
    return u[:, :rank] * root, root[:, None] * vh[:rank]


@torch.no_grad()
def mimetic_attention_(
    layer: nn.Module,
    qk: tuple[float, float] = (0.7, 0.7),
    vo: tuple[float, float] | None = (0.4, 0.4),
    generator: torch.Generator | None = None,
) -> nn.Module:
    """Mimetic initialisation of one layer's self-attention (Trockman & Kolter, "Mimetic
    Initialization of Self-Attention Layers", ICML 2023): per head, W_q^T W_k starts near
    alpha Z + beta I and, over all heads, W_o W_v near alpha Z - beta I (Z ~ N(0, 1/H)), the
    structure trained Transformers show. With W_q^T W_k ~ I a token attends to tokens like
    itself, so rows that share a position pattern attend to each other from step 0 instead of
    uniformly: the attention saddle that holds a post-LN BERT at the unigram plateau is skipped.
    The architecture is BERT's; only the starting point of query/key/value/output weights
    differs (their biases start at 0). `qk`/`vo` are (alpha, beta); `vo=None` leaves the value
    and output weights at Google's initialisation."""
    assert isinstance(layer, BertLayer)
    attention = layer.attention
    query, key = attention.self.query, attention.self.key
    value, dense = attention.self.value, attention.output.dense
    hidden, size = query.weight.shape[1], layer.head_size

    def noisy_identity(alpha: float, beta: float) -> torch.Tensor:
        z = torch.randn(hidden, hidden, generator=generator, dtype=torch.float64)
        return alpha * z / math.sqrt(hidden) + beta * torch.eye(hidden, dtype=torch.float64)

    for head in range(layer.num_heads):
        left, right = _factor(noisy_identity(*qk), size)  # W_q_h^T W_k_h = left @ right
        rows = slice(head * size, (head + 1) * size)
        query.weight[rows] = left.T.to(query.weight.dtype)
        key.weight[rows] = right.to(key.weight.dtype)
    nn.init.zeros_(query.bias)
    nn.init.zeros_(key.bias)
    if vo is not None:
        alpha, beta = vo
        left, right = _factor(noisy_identity(alpha, -beta), hidden)  # W_o W_v = left @ right
        dense.weight.copy_(left.to(dense.weight.dtype))
        value.weight.copy_(right.to(value.weight.dtype))
        nn.init.zeros_(value.bias)
        nn.init.zeros_(dense.bias)
    return layer


@torch.no_grad()
def local_attention_(
    model: nn.Module,
    position_dims: int | None = None,
    sharpness: float = 2.0,
    offsets: tuple[int, ...] = (-1, 1),
) -> nn.Module:
    """Start a BERT whose first layer reads each piece's neighbours: head h of layer 1 attends to
    the piece `offsets[h % len(offsets)]` positions away (by default head 0 the left neighbour,
    head 1 the right, and so on; a left-to-right model takes (-1, -2)), so a masked piece sees
    its context from step 0 instead of after the thousands of steps it takes learned absolute
    positions to find "one to the left" (the MLM plateau). `model`: a BertModel or a head on one.

    How: the last `position_dims` dimensions of the embedding space hold the positions and
    nothing else (token and segment embeddings start at 0 there; the positions at 0 elsewhere;
    default min(32, head size)):
    sinusoids, half at frequencies spread over (0, pi] (sharp peaks), half slow (no aliasing);
    a head's query is its key rotated by the offset, the angle-addition identity making
    q_i . k_j peak at j = i + offset. Everything stays a learned parameter of the paper's
    architecture (checkpoints load anywhere); only the starting point differs. `sharpness`
    scales the attention scores (2: ~75% of a head's attention on its neighbour at the start)."""
    encoder = model if isinstance(model, BertModel) else model.bert
    assert isinstance(encoder, BertModel)
    embeddings = encoder.embeddings
    layer = encoder.encoder.layer[0]
    assert isinstance(layer, BertLayer)
    hidden = embeddings.word_embeddings.weight.shape[1]
    position_dims = position_dims or min(32, layer.head_size, hidden // 4 * 2)
    pairs = position_dims // 2
    if position_dims % 2 or not 2 <= position_dims <= min(hidden, layer.head_size):
        raise ValueError(f"position_dims must be even and in 2..{min(hidden, layer.head_size)}")
    rest = hidden - position_dims
    high = pairs // 2
    rates = torch.cat(
        [
            torch.arange(1, high + 1, dtype=torch.float64) * math.pi / (high + 0.5),
            torch.logspace(math.log10(0.2), math.log10(0.005), pairs - high, dtype=torch.float64),
        ]
    )
    assert embeddings.position_embeddings is not None  # (a BERT's, pre-trained here)
    positions = embeddings.position_embeddings.weight
    p = torch.arange(positions.shape[0], dtype=torch.float64)[:, None]
    # amplitude: the position part's norm equals a token embedding's norm over its dimensions
    scale = float(embeddings.word_embeddings.weight[:, :rest].norm(dim=1).mean()) / math.sqrt(pairs)
    table = torch.zeros(positions.shape, dtype=torch.float64)
    table[:, rest::2] = torch.sin(p * rates) * scale
    table[:, rest + 1 :: 2] = torch.cos(p * rates) * scale
    positions.copy_(table.to(positions.dtype))
    embeddings.word_embeddings.weight[:, rest:] = 0.0
    if embeddings.token_type_embeddings is not None:
        embeddings.token_type_embeddings.weight[:, rest:] = 0.0
    # After the embedding LayerNorm a row has norm sqrt(hidden), about half of it positional:
    # each sin/cos pair has amplitude ~ sqrt(hidden / 2 / pairs).
    amplitude2 = hidden / 2 / pairs
    gain = math.sqrt(sharpness * 8.0 * math.sqrt(layer.head_size) / (pairs * amplitude2))
    query, key, size = layer.attention.self.query, layer.attention.self.key, layer.head_size
    for head in range(layer.num_heads):
        offset = offsets[head % len(offsets)]
        rows = slice(head * size, head * size + position_dims)
        query.weight[head * size : (head + 1) * size] = 0.0
        key.weight[head * size : (head + 1) * size] = 0.0
        cos, sin = torch.cos(rates * offset), torch.sin(rates * offset)
        block = torch.zeros(position_dims, position_dims, dtype=torch.float64)
        for k in range(pairs):  # q = R(offset) p_i, so q_i . p_j = sum cos(w (i + offset - j))
            block[2 * k : 2 * k + 2, 2 * k : 2 * k + 2] = torch.tensor(
                [[cos[k], sin[k]], [-sin[k], cos[k]]], dtype=torch.float64
            )
        query.weight[rows, rest:] = (gain * block).to(query.weight.dtype)
        key.weight[rows, rest:] = gain * torch.eye(position_dims, dtype=key.weight.dtype)
    nn.init.zeros_(query.bias)
    nn.init.zeros_(key.bias)
    return model
