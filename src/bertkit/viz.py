"""Pictures of training runs: the curves of a `log.jsonl` as a PNG.

    bertkit viz runs/pretrain/log.jsonl --out curves.png

Pre-training logs (`mlm_loss`, `nsp_loss`, held-out `mlm_accuracy`/`nsp_accuracy`) and
fine-tuning logs (`loss`, dev figures per epoch) alike: each loss on its own panel and scale,
evaluation figures (by epoch when the log has epochs, else by step), the learning rate.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from bertkit._io import atomic_path

_LABELS = {
    "mlm_accuracy": "MLM accuracy, all [MASK]",
    "mlm_accuracy_801010": "MLM accuracy, 80/10/10",
    "nsp_accuracy": "NSP accuracy",
}
_NOT_PLOTTED = {
    "step",
    "split",
    "epoch",
    "score",
    "lr",
    "tokens_per_s",
    "loss",
    "seconds",
    "tokens",
    "grad_norm",
}


def read_log(path: str | os.PathLike) -> list[dict]:
    """The entries of a log.jsonl, one JSON object a line. The last line, which a kill can cut
    short, is skipped when it is not one; any other such line is a ValueError naming the file
    and line (bytes that are not UTF-8, text that is not JSON, JSON that is not an object)."""
    lines = Path(path).read_bytes().split(b"\n")
    while lines and not lines[-1].strip():
        lines.pop()
    entries = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            entry = json.loads(raw.decode("utf-8"))
            if not isinstance(entry, dict):
                raise TypeError(f"a JSON {type(entry).__name__}")
        except (UnicodeDecodeError, json.JSONDecodeError, TypeError) as err:
            if number == len(lines):
                continue  # cut short by a kill
            what = {UnicodeDecodeError: "bytes that are not UTF-8",
                    json.JSONDecodeError: "not JSON"}.get(type(err), str(err))  # fmt: skip
            raise ValueError(
                f"{path}:{number}: not a log entry ({what}; each line of a log.jsonl is a JSON "
                "object such as bertkit writes)"
            ) from None
        entries.append(entry)
    return entries


def plot_log(log: str | os.PathLike, png: str | os.PathLike, title: str = "") -> Path | None:
    """Write the curves of `log` to `png`; None when the log has no training entries.

    One panel per loss (pre-training: MLM and NSP apart, each on its own scale, train and
    held-out), one for the evaluation figures (with the chance line of NSP), one for the
    learning rate. The x axis is the step (fine-tuning figures: the epoch)."""
    entries = read_log(log) if Path(log).exists() else []
    train = [e for e in entries if e.get("split") == "train"]
    evals = [e for e in entries if e.get("split") == "eval"]
    if not train:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    losses = [k for k in train[0] if k.endswith("loss") and k != "loss"] or ["loss"]
    axis = "epoch" if evals and "epoch" in evals[0] else "step"
    figures = [
        k
        for k, v in (evals[0] if evals else {}).items()
        if k not in _NOT_PLOTTED
        and isinstance(v, float)
        and "loss" not in k
        and "perplexity" not in k
        and not k.endswith(("total", "thresh"))
        # a tagger's per-type figures (precision_LOC, f1_creative-work, ...) are in the report
        and not k.startswith(("precision_", "recall_", "f1_"))
    ]
    has_lr = any("lr" in e for e in train)
    count = len(losses) + bool(figures) + has_lr
    fig, axes = plt.subplots(1, count, figsize=(4.3 * count, 3.9), squeeze=False)
    panels = iter(axes[0])
    steps = [e["step"] for e in train]
    for key in losses:
        ax = next(panels)
        values = [e.get(key) for e in train]
        ax.plot(steps, values, linewidth=1, label="train")
        held = []
        for suffix, label in (("", "held out"), ("_801010", "held out, 80/10/10")):
            points = [
                (e["step"], e[key + suffix]) for e in evals if e.get(key + suffix) is not None
            ]
            if points and axis == "step":
                if suffix == "" and key == "mlm_loss" and "mlm_loss_801010" in evals[0]:
                    label = "held out, all [MASK]"
                ax.plot(*zip(*points, strict=True), "o-", markersize=3, label=label)
                held += [v for _, v in points]
        name = {"mlm_loss": "MLM loss", "nsp_loss": "NSP loss"}.get(key, key)
        ax.set(title=name, xlabel="step", ylabel="nats")
        if key == "nsp_loss":
            ax.axhline(0.6931, color="grey", linestyle=":", linewidth=1)  # ln 2: chance
        _zoom(ax, [v for v in values if v is not None] + held)
        ax.legend(fontsize=8)
    if figures:
        ax = next(panels)
        for key in figures:
            label = _LABELS.get(key, key) if "mlm_accuracy_801010" in evals[0] else key
            ax.plot([e[axis] for e in evals], [e.get(key) for e in evals], "o-", ms=3, label=label)
        if "nsp_accuracy" in figures:
            ax.axhline(0.5, color="grey", linestyle=":", linewidth=1)
        ax.set(title="evaluation", xlabel=axis)
        if axis == "epoch":  # whole epochs, not 1.2, 1.4, ... between two of them
            from matplotlib.ticker import MaxNLocator

            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=8)
    if has_lr:
        ax = next(panels)
        ax.plot(steps, [e.get("lr") for e in train], color="tab:purple")
        ax.set(title="learning rate", xlabel="step")
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    for ax in axes[0]:
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return save_png(fig, png)


def save_png(fig, png: str | os.PathLike, **options) -> Path:
    """Write `fig` to `png` atomically (a kill leaves the old picture or the new, never half
    of one) and close it: every picture bertkit draws ends here. `options` go to savefig."""
    import matplotlib.pyplot as plt

    png = Path(png)
    with atomic_path(png) as tmp:
        fig.savefig(tmp, **({"dpi": 100} | options), format="png")
    plt.close(fig)
    return png


def _zoom(ax, values: list[float]) -> None:
    """Leave out the first steps' loss (ln V for a fresh model) when it would flatten the rest:
    the y range covers the values after the first 5% of the run, with a margin."""
    if len(values) < 20:
        return
    rest = values[len(values) // 20 :]
    low, high = min(rest), max(rest)
    margin = 0.1 * (high - low) or 0.05
    ax.set_ylim(low - margin, high + margin)


def plot_confusion(
    confusion: dict, png: str | os.PathLike, title: str = "", max_classes: int = 40
) -> Path:
    """The confusion matrix of a report (`{"labels": [...], "matrix": [[...]], "rows": ...,
    "columns": ...}`) as a heat map: each row coloured by its share of the row (so a rare
    class's errors show as clearly as a common one's), each cell with its count. Beyond
    `max_classes` labels, the most frequent gold labels are shown and the others summed as
    "(other)"."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    labels = list(confusion["labels"])
    matrix = np.asarray(confusion["matrix"], dtype=np.int64)
    if len(labels) > max_classes:
        keep = np.sort(np.argsort(-matrix.sum(1), kind="stable")[: max_classes - 1])
        rest = np.setdiff1d(np.arange(len(labels)), keep)
        index = np.append(keep, len(labels))
        grown = np.zeros((len(labels) + 1, len(labels) + 1), dtype=np.int64)
        grown[: len(labels), : len(labels)] = matrix
        grown[len(labels)] = grown[rest].sum(0)
        grown[:, len(labels)] = grown[:, rest].sum(1)
        matrix = grown[np.ix_(index, index)]
        labels = [labels[i] for i in keep] + ["(other)"]
    n = len(labels)
    totals = matrix.sum(1, keepdims=True)
    shares = np.divide(matrix, totals, out=np.zeros(matrix.shape), where=totals > 0)
    size = min(3.2 + 0.45 * n, 20)
    fig, ax = plt.subplots(figsize=(size + 1.2, size))
    image = ax.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="share of the row")
    ax.set_xticks(range(n), labels, rotation=45 if n > 4 else 0, ha="right" if n > 4 else "center")
    ax.set_yticks(range(n), labels)
    ax.set_xlabel(confusion.get("columns", "predicted"))
    ax.set_ylabel(confusion.get("rows", "gold"))
    if n <= 25:
        for i in range(n):
            for j in range(n):
                colour = "white" if shares[i, j] > 0.55 else "black"
                ax.text(j, i, f"{matrix[i, j]:,}", ha="center", va="center", color=colour,
                        fontsize=9 if n <= 10 else 7)  # fmt: skip
    correct = np.trace(matrix) / max(matrix.sum(), 1)
    unit = "words" if "word" in confusion.get("rows", "") else "rows"  # taggers count words
    ax.set_title(f"{title}\n{matrix.sum():,} {unit}, diagonal {correct:.1%}" if title else "")
    fig.tight_layout()
    return save_png(fig, png)
