"""Pictures of training runs: the curves of a `log.jsonl` as a PNG.

    bertkit viz runs/pretrain/log.jsonl --out curves.png

Pre-training logs (`mlm_loss`, `nsp_loss`, held-out `mlm_accuracy`/`nsp_accuracy`) and
fine-tuning logs (`loss`, dev figures per epoch) alike: losses by step on the left, evaluation
figures on the right (by epoch when the log has epochs, else by step).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from bertkit._io import atomic_path

_NOT_PLOTTED = {"step", "split", "epoch", "score", "lr", "tokens_per_s", "loss"}


def read_log(path: str | os.PathLike) -> list[dict]:
    """The entries of a log.jsonl; a line cut short by a kill is skipped."""
    entries = []
    for line in Path(path).read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return entries


def plot_log(log: str | os.PathLike, png: str | os.PathLike, title: str = "") -> Path | None:
    """Write the curves of `log` to `png`; None when the log has no training entries."""
    entries = read_log(log) if Path(log).exists() else []
    train = [e for e in entries if e.get("split") == "train"]
    evals = [e for e in entries if e.get("split") == "eval"]
    if not train:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    losses = [k for k in train[0] if k.endswith("loss") and k != "loss"] or ["loss"]
    for key in losses:
        left.plot([e["step"] for e in train], [e[key] for e in train], label=f"train {key}")
    for key in [k for k in (evals[0] if evals else {}) if k.endswith("loss")]:
        left.plot([e["step"] for e in evals], [e[key] for e in evals], "o-", label=f"eval {key}")
    left.set(title="loss", xlabel="step")
    left.legend(fontsize=8)
    axis = "epoch" if evals and "epoch" in evals[0] else "step"
    figures = [
        k
        for k, v in (evals[0] if evals else {}).items()
        if k not in _NOT_PLOTTED
        and isinstance(v, float)
        and not k.endswith(("loss", "total", "thresh"))
    ]
    for key in figures:
        right.plot([e[axis] for e in evals], [e[key] for e in evals], "o-", label=key)
    if any("nsp_accuracy" == k for k in figures):
        right.axhline(0.5, color="grey", linestyle=":", linewidth=1)
    right.set(title="evaluation", xlabel=axis)
    if figures:
        right.legend(fontsize=8)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    png = Path(png)
    with atomic_path(png) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
    return png
