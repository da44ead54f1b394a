"""Settings as dataclass fields that carry their one-line doc: the Python API takes the
dataclasses (`FinetuneConfig`, `MaskingConfig`, ...) and the `bertkit` command builds its flags
from the same fields (name, type, default, help), so a setting is declared once.

>>> from dataclasses import dataclass, fields
>>> @dataclass
... class Example:
...     steps: int = setting(10, "optimiser steps", check="positive")
>>> f = fields(Example)[0]
>>> f.default, f.metadata["help"], f.metadata["check"]
(10, 'optimiser steps', 'positive')
"""

from __future__ import annotations

import dataclasses
from typing import Any


def setting(default: Any, help: str, *, choices: tuple | None = None, check: str | None = None,
            flags: tuple[str, ...] = ()) -> Any:  # fmt: skip
    """A dataclass field with its doc. `choices`: the values allowed; `check`: positive,
    non-negative or fraction (a value in [0, 1)), enforced when the command parses it;
    `flags`: other spellings the command accepts beside --field-name."""
    metadata = {"help": help, "choices": choices, "check": check, "flags": flags}
    return dataclasses.field(default=default, metadata=metadata)


def precision_setting() -> Any:
    """The compute precision of a training run (every run takes the same choices)."""
    return setting(
        "auto",
        "auto: bf16 autocast where it is native (a GPU with bf16; a CPU with AMX-BF16 or "
        "AVX512-BF16), else fp32; bf16 elsewhere warns (emulated: far slower); fp16 is GPU only",
        choices=("auto", "fp32", "bf16", "fp16"),
    )


def device_setting() -> Any:
    return setting(None, "cpu or cuda (default: cuda when available)")
