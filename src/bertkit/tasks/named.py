"""Datasets by their name, as a transformers user writes `load_dataset("imdb")`: `--dataset
NAME[:CONFIG]` with `--train-split`, `--validation-split` and `--test-split` reads those splits
from the local datasets cache (the `datasets` library finds them; offline where HF_HUB_OFFLINE
or HF_DATASETS_OFFLINE is set, as that library allows) with the reader of `save_to_disk`
folders: the columns, and a ClassLabel's names as the labels.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any


def dataset_files(data: Any, validation: float | str | None) -> tuple[Any, float | None]:
    """`data` (a DataConfig naming a `dataset`) with its train, validation and test files set
    to the cached splits, and the validation fraction left to carve: `validation` a split's
    name (default "validation", where the dataset has one) or a fraction of the training
    split."""
    name = data.dataset
    if data.train or data.validation or data.test:
        raise ValueError(f"--dataset {name}: give its splits (--train-split ...), not files too")
    carve = None if isinstance(validation, str) else validation
    wanted = {"train": data.train_split, "test": data.test_split}
    if carve is None:
        wanted["validation"] = validation if isinstance(validation, str) else None
    files = {role: split_file(name, split) for role, split in wanted.items() if split}
    if carve is None and "validation" not in files:  # its "validation" split, if it has one
        splits = split_names(name)
        if "validation" not in splits:
            raise ValueError(
                f"--dataset {name} has no 'validation' split (its splits: {', '.join(splits)}): "
                "name one with --validation-split (e.g. test), or give a fraction of the "
                "training split (--validation-split 0.1)"
            )
        files["validation"] = split_file(name, "validation")
    given = {role: str(path) for role, path in files.items()}
    return dataclasses.replace(data, dataset=None, **given), carve


def split_names(name: str) -> list[str]:
    """The splits the cached dataset `name` has."""
    return list(_load(name, None).keys())


def split_file(name: str, split: str) -> Path:
    """The arrow data of one cached split: its cache file where there is one, else the split
    saved once beside the cache (the reader takes one file or one save_to_disk folder)."""
    found = _load(name, split)
    files = [Path(f["filename"]) for f in found.cache_files]
    if len(files) == 1:
        return files[0]
    folder = Path(_cache()) / "bertkit" / found._fingerprint
    if not (folder / "state.json").exists():
        found.save_to_disk(str(folder))
    return folder


def _cache() -> str:
    import datasets

    return os.environ.get("HF_DATASETS_CACHE") or str(datasets.config.HF_DATASETS_CACHE)


def _load(name: str, split: str | None):
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"--dataset {name} needs the datasets library: pip install datasets"
        ) from None
    repo, _, config = name.partition(":")
    try:
        return datasets.load_dataset(repo, config or None, split=split, cache_dir=_cache())
    except ValueError as err:
        if split is not None and "split" in str(err).lower():
            raise ValueError(
                f"--dataset {name} has no split {split!r} (its splits: "
                f"{', '.join(split_names(name))})"
            ) from None
        raise ValueError(f"--dataset {name}: {err}") from None
    except (ConnectionError, FileNotFoundError, OSError) as err:
        raise FileNotFoundError(
            f"--dataset {name}: not in the datasets cache ({_cache()}), and {err}. Load it once "
            f'where there is a network (python -c "import datasets; datasets.load_dataset('
            f"'{repo}'{', ' + repr(config) if config else ''})\", the same HF_HOME), or give "
            "--train and --validation files"
        ) from None
