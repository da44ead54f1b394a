"""README.md of a fine-tuned folder (a model card): the base model, the data files and their
SHA-256, the labels, the validation figures, the command that makes it again, and how to load it
in bertkit, transformers and (an embedding model) sentence-transformers."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from bertkit import __version__
from bertkit._io import atomic_write_text, sha256_of
from bertkit.settings import flat


def write_model_card(
    out: Path, task: Any, model: Path, data: Any, config: Any, results: dict[str, Any]
) -> Path:
    """OUT/README.md from a finished run's `results` (finetune's) and settings."""
    head = results.get("head") or task.head_class(config.bilstm)
    lines = [f"# {out.name}: {task.name}, fine-tuned from {model.name}", ""]
    lines += [f"- base model: `{model}`", f"- task: `{task.name}` (head `{head}`)"]
    labels = task.labels() if hasattr(task, "labels") else None
    if labels:
        lines.append("- labels: " + ", ".join(f"`{name}`" for name in labels))
    lines += [f"- trained with bertkit {__version__}, {results.get('seconds', '?')} s, precision "
              f"{results.get('precision', {}).get('compute', '?')}", ""]  # fmt: skip
    files = _data_files(data)
    if files:
        lines += ["## Data", "", "| file | SHA-256 |", "|---|---|"]
        lines += [f"| `{path}` | `{sha256_of(path)}` |" for path in files]
        lines.append("")
    lines += ["## Validation", ""]
    selected = results.get("selected_by", "the task's main metrics")
    lines.append(f"The best evaluation (epoch {results.get('best_epoch')}, chosen by {selected}):")
    lines.append("")
    for split in ("before_training", "dev", "test"):
        if results.get(split):
            figures = ", ".join(f"{k} {v:.4f}" for k, v in results[split].items()
                                if isinstance(v, (int, float)))  # fmt: skip
            lines.append(f"- {split.replace('_', ' ')}: {figures}")
    if results.get("stopped_early"):
        lines.append(f"- stopped early at step {results['stopped_early']['step']}")
    lines += ["", "## Made with", "", "```sh", _command(task, model, data, config, out), "```", ""]
    lines += ["## Loading it", "", "```python"] + _loading(out, task, head) + ["```", ""]
    path = out / "README.md"
    atomic_write_text(path, "\n".join(lines))
    return path


def _data_files(data: Any) -> list[Path]:
    """The files a run read: your own data's, or the regular files of the paper's folder."""
    from bertkit.tasks.own import DataConfig

    if isinstance(data, DataConfig):
        named = (data.train, data.validation, data.test)
        return [Path(p) for p in named if p is not None and Path(p).is_file()]
    if data is not None and Path(data).is_dir():
        return sorted(p for p in Path(data).iterdir() if p.is_file())
    return []


def _command(task: Any, model: Path, data: Any, config: Any, out: Path) -> str:
    """`bertkit finetune` with the settings that differ from the task's defaults."""
    from bertkit.finetuning.config import FinetuneConfig
    from bertkit.tasks.own import DataConfig

    words = ["bertkit", "finetune", task.name, "--model", str(model)]
    if isinstance(data, DataConfig):
        defaults = flat(DataConfig())
        for name, (value, flag) in flat(data).items():
            words += _flag(flag, value, defaults[name][0])
    elif data is not None:
        words += ["--data", str(data)]
    defaults = flat(FinetuneConfig().resolved(task))
    for name, (value, flag) in flat(config).items():
        if name not in ("progress", "overwrite", "resume"):
            words += _flag(flag, value, defaults[name][0])
    return shlex.join([*words, "--out", str(out)])


def _flag(flag: str, value: Any, default: Any) -> list[str]:
    if value == default or value is None:
        return []
    if value is True:
        return [flag]
    return [] if value is False else [flag, str(value)]


def _loading(out: Path, task: Any, head: str) -> list[str]:
    if task.name == "sentence-embedding":
        return [
            "from bertkit import Embedder",
            f'Embedder("{out}")(["a text", "another"])       # unit vectors',
            "from sentence_transformers import SentenceTransformer",
            f'SentenceTransformer("{out}").encode(["a text"])  # the same vectors',
        ]
    return [
        "from bertkit import Predictor",
        f'Predictor("{out}")(["a text"])',
        f"from transformers import {head}, AutoTokenizer",
        f'model = {head}.from_pretrained("{out}")',
        f'tokenizer = AutoTokenizer.from_pretrained("{out}")',
    ]
