"""Settings as dataclass fields that carry their one-line doc and their check: the Python API
takes the dataclasses (`PretrainConfig`, `FinetuneConfig`, `MaskingConfig`, `OptimConfig`, ...)
and the `bertkit` command builds its flags from the same fields (name, type, default, choices,
help), so a setting is declared once, and a value is refused with the same words whether it
came from a flag or from Python.

>>> from dataclasses import dataclass, fields
>>> @dataclass
... class Example(Settings):
...     steps: int = setting(10, "optimiser steps", check="positive")
>>> f = fields(Example)[0]
>>> f.default, f.metadata["help"], f.metadata["check"]
(10, 'optimiser steps', 'positive')
>>> Example(steps=0)
Traceback (most recent call last):
...
ValueError: Example: --steps must be positive, got 0
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import sys
import typing
import warnings
from typing import Any, TypeVar

T = TypeVar("T")

# check name: (lowest, highest, highest included); None: no bound on that side
CHECKS: dict[str, tuple[float | None, float | None, bool]] = {
    "positive": (0.0, None, False),  # > 0
    "non-negative": (0.0, None, True),  # >= 0
    "fraction": (0.0, 1.0, False),  # [0, 1)
    "probability": (0.0, 1.0, True),  # [0, 1]
}


def setting(default: Any, help: str, *, choices: tuple | None = None, check: str | None = None,
            flags: tuple[str, ...] = ()) -> Any:  # fmt: skip
    """A dataclass field with its doc. `choices`: the values allowed; `check`: a name in
    CHECKS (positive, non-negative, fraction in [0, 1), probability in [0, 1]), enforced by
    `Settings.__post_init__` and by the command's parser; `flags`: other spellings the command
    accepts beside --field-name."""
    if check is not None and check not in CHECKS:
        raise ValueError(f"unknown check {check!r}; one of {sorted(CHECKS)}")
    metadata = {"help": help, "choices": choices, "check": check, "flags": flags}
    return dataclasses.field(default=default, metadata=metadata)


def problem(value: Any, check: str | None) -> str | None:
    """What is wrong with a number under `check` ("must be positive, got 0"), or None.

    >>> problem(0.5, "fraction"), problem(1, "fraction"), problem(float("nan"), None)
    (None, 'must be in [0, 1), got 1', "'nan' is not a finite number")
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value):
        return f"{str(value)!r} is not a finite number"
    if check is None:
        return None
    low, high, closed = CHECKS[check]
    assert low is not None  # every check has a lower bound
    if high is None:
        if value < low or (value == low and not closed):
            return f"must be {'positive' if not closed else '0 or more'}, got {value:g}"
        return None
    if not (low <= value <= high if closed else low <= value < high):
        return f"must be in [{low:g}, {high:g}{']' if closed else ')'}, got {value:g}"
    return None


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


class Settings:
    """Base of the settings dataclasses: every field is checked when the object is made (and
    by `dataclasses.replace`), by its `check` and `choices`."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            value, meta = getattr(self, field.name), field.metadata
            if value is None or "help" not in meta:
                continue
            wrong = problem(value, meta["check"])
            if wrong is None and meta["choices"] is not None and value not in meta["choices"]:
                wrong = f"{value!r} is not one of {', '.join(map(str, meta['choices']))}"
            if wrong is not None:
                flags = "/".join([flag(field.name), *meta["flags"]])  # as argparse names it
                raise ValueError(f"{type(self).__name__}: {flags} {wrong}")


PRECISIONS = ("auto", "fp32", "bf16", "fp16")
BACKENDS = ("torch", "onnx")
QUANTIZATIONS = ("int8",)


def precision_setting() -> Any:
    """The compute precision of a run or a model in use (every one takes the same choices)."""
    return setting(
        "auto",
        "auto: bf16 autocast where it is native (a GPU with bf16; a CPU with AMX-BF16 or "
        "AVX512-BF16), else fp32; bf16 elsewhere warns (emulated: far slower); fp16 is GPU only",
        choices=PRECISIONS,
    )


def quantize_setting(help: str) -> Any:
    """The weights of an ONNX model: as trained (None) or int8."""
    return setting(None, help, choices=QUANTIZATIONS)


def parity_setting() -> Any:
    """Dropout masks as transformers draws them (a run of every kind takes the same flag)."""
    return setting(
        False,
        "draw dropout masks as transformers does (the padded grid's, from torch's generator), "
        "so a seeded run follows transformers' step for step; slower on CPUs. Default: masks "
        "for real tokens only from a parallel generator, the same distribution",
    )


def checkpointing_setting() -> Any:
    """Activation checkpointing (a run of every kind takes the same flag)."""
    return setting(
        False,
        "recompute each layer's activations in the backward pass instead of keeping them: "
        "about a third more compute for far less activation memory (BERT-large at 512, a "
        "larger batch on one card); the same numbers",
    )


def compile_setting() -> Any:
    """Whether a run compiles its model (every run takes the same choices)."""
    return setting(
        "auto",
        "torch.compile the model's forward and backward (the compile time is logged on its own "
        "line): on, off, or auto: on with CUDA (graphs when one GPU pre-trains a model no "
        "wider than BERT-small's 512); off on CPUs, where unpadded batches change shape "
        "from step to step and a new shape can take seconds to compile. graphs: compiled with "
        "CUDA graphs (mode reduce-overhead) on the padded path, every batch the same shape: a "
        "step is one launch, the lever for small models on a GPU (on a CPU: compiled, padded)",
        choices=("auto", "on", "off", "graphs"),
    )


def device_setting() -> Any:
    return setting(None, "cpu or cuda (default: cuda when available)")


@dataclasses.dataclass
class RuntimeConfig(Settings):
    """How a model in use runs, the same for `bertkit predict` and `bertkit serve` (both nest
    it: their flags and Python names are these fields', `--backend`, `Predictor(device=...)`),
    and what `inference.loader.load` takes."""

    device: str | None = device_setting()
    backend: str = setting(
        "torch",
        "onnx: run MODEL/model.onnx (bertkit export --onnx) with ONNX Runtime",
        choices=BACKENDS,
    )
    precision: str = precision_setting()
    compile: str = setting(
        "off",
        "on: torch.compile the model for inference (inductor, every size symbolic, weights "
        "frozen): each call faster after the first of its kind compiles (tens of seconds on "
        "two cores; the server compiles at start-up). torch backend only",
        choices=("off", "on"),
    )


def nested(
    cls: type,
    *,
    helps: dict[str, str] | None = None,
    renamed: dict[str, str] | None = None,
    **defaults: Any,
) -> Any:
    """A field holding another settings dataclass (a run's masking, its optimiser): its fields
    are flags of their own, at this field's place in the command's help, and names the outer
    class takes (with `flat_names`). `defaults` and `helps`: this holder's own default and
    help of some of them (fine-tuning's learning rate is the task's); `renamed`: old
    spellings, a Python name (its --flag too) or a --flag, of a field: {old: field name},
    still taken, with a warning."""
    metadata = {"nested": True, "defaults": defaults, "helps": helps or {},
                "renamed": renamed or {}}  # fmt: skip
    return dataclasses.field(default_factory=lambda: cls(**defaults), metadata=metadata)


def flat_names(cls: T) -> T:
    """Let the settings dataclass `cls` take its nested settings' fields by name as well:
    FinetuneConfig(learning_rate=2e-5) fills its optimiser's settings, as the command's flags
    do; so does `dataclasses.replace`, and `config.learning_rate` reads it. Old names a `nested`
    field lists are taken with a warning."""
    hints = typing.get_type_hints(cls)
    holders = [
        (f, field_names(hints[f.name]))
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.metadata.get("nested")
    ]
    own = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for field, names in holders:
        if names & own:
            raise TypeError(f"{cls}.{field.name} holds names of its own: {names & own}")
    init = cls.__init__  # type: ignore[misc]

    @functools.wraps(init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        for field, names in holders:
            for old, new in field.metadata["renamed"].items():
                if not old.startswith("--") and old in kwargs:
                    warnings.warn(f"{old} is now {new} (one name for it everywhere); the old "
                                  "name still works", FutureWarning, stacklevel=2)  # fmt: skip
                    kwargs[new] = kwargs.pop(old)
            mine = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
            if mine:
                held = kwargs.get(field.name)
                held = held if held is not None else field.default_factory()  # type: ignore[operator]
                kwargs[field.name] = dataclasses.replace(held, **mine)
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[misc]
    for field, names in holders:  # read and set by name too: config.precision
        for name in names:
            setattr(cls, name, _through(field.name, name))
    return cls


def _through(holder: str, name: str) -> property:
    """`name` of the nested settings in the field `holder`, as if it were the outer one's."""

    def get(self: Any) -> Any:
        return getattr(getattr(self, holder), name)

    def put(self: Any, value: Any) -> None:
        setattr(getattr(self, holder), name, value)

    return property(get, put, doc=f"{holder}.{name}")


# --------------------------------------------------------------------------- the command line
def number_type(kind: type, check: str | None = None, names: bool = False):
    """An argparse type of `kind` (int or float) that refuses what `check` refuses; `names`:
    what is not a number is a name, taken as it is (a field of `float | str`)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            if names:
                return text
            raise
        wrong = problem(value, check)
        if wrong is not None:
            raise argparse.ArgumentTypeError(wrong.replace(f"got {value:g}", f"got {text}"))
        return value

    parse.__name__ = kind.__name__  # argparse names the type in "invalid int value"
    return parse


class Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """The help of a command built from settings: every default that is not None/False is
    shown (recipe settings say theirs in the help)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.default == argparse.SUPPRESS:
            return action.help
        return super()._get_help_string(action)


def command(commands: Any, name: str, help: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A subcommand of `commands` (argparse's subparsers) whose flags are settings: its help
    shows their defaults (`Formatter`)."""
    return commands.add_parser(name, help=help, formatter_class=Formatter, **kwargs)


class _Renamed(argparse.Action):
    """An old spelling of a flag: stores as the new one does, with a warning."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: warning: {option_string} is now {self.const} (one name for it "
              "everywhere); the old name still works", file=sys.stderr)  # fmt: skip
        setattr(namespace, self.dest, True if self.nargs == 0 else values)


def add_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    skip: tuple[str, ...] = (),
    recipes: dict[str, dict[str, Any]] | None = None,
    holder: typing.Mapping[str, Any] | None = None,
) -> None:
    """One flag per field of the settings dataclass `cls` (nested settings in place): --field-name
    (and the field's other spellings), its type, default, choices and one-line help. A field
    some recipe sets has no default on the command line (the recipe's value fills it in, an
    explicit flag wins) and its help lists each recipe's value. `holder`: the metadata of the
    `nested` field `cls` sits in (its defaults, helps and old spellings)."""
    hints = typing.get_type_hints(cls)
    holder = holder or {}
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        meta = field.metadata
        if meta.get("nested"):
            add_flags(parser, hints[field.name], skip, recipes, meta)
            continue
        flags = [flag(field.name), *meta.get("flags", ())]
        help = holder.get("helps", {}).get(field.name, meta["help"])
        default = holder.get("defaults", {}).get(field.name, field.default)
        if recipes and any(field.name in recipe for recipe in recipes.values()):
            values = "; ".join(
                f"{name} {recipe.get(field.name, default if default is not None else 'unset')}"
                for name, recipe in recipes.items()
            )
            help, default = f"{help} (recipe: {values})", None
        kind = hints[field.name]
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        base = args[0] if args else kind
        old = [o if o.startswith("--") else flag(o)
               for o, new in holder.get("renamed", {}).items() if new == field.name]  # fmt: skip
        if base is bool:
            parser.add_argument(*flags, dest=field.name, action="store_true", help=help)
            if old:
                parser.add_argument(*old, dest=field.name, action=_Renamed, nargs=0,
                                    const=flags[0], help=argparse.SUPPRESS)  # fmt: skip
            continue
        parse = (number_type(base, meta.get("check"), names=str in args)
                 if base in (int, float) else base)  # fmt: skip
        choices = meta.get("choices")
        parser.add_argument(
            *flags, dest=field.name, type=parse, default=default, choices=choices, help=help
        )
        if old:
            parser.add_argument(*old, dest=field.name, action=_Renamed, type=parse,
                                choices=choices, const=flags[0], help=argparse.SUPPRESS)  # fmt: skip


def field_names(cls: type) -> set[str]:
    """The names `cls` takes, its nested settings' included."""
    hints = typing.get_type_hints(cls)
    names = set()
    for field in dataclasses.fields(cls):
        if field.metadata.get("nested"):
            names |= field_names(hints[field.name])
        else:
            names.add(field.name)
    return names


def flat(settings: Any) -> dict[str, tuple[Any, str]]:
    """Every field of a settings object by name, nested settings' included, with the flag that
    sets it: {"max_steps": (1000, "--max-steps"), "learning_rate": (1e-4, "--lr"), ...}."""
    values: dict[str, tuple[Any, str]] = {}
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        if field.metadata.get("nested"):
            values.update(flat(value))
        else:
            spellings = field.metadata.get("flags") or ()
            values[field.name] = (value, spellings[0] if spellings else flag(field.name))
    return values


def values(settings: Any) -> dict[str, Any]:
    """Every field of a settings object by name, nested settings' included: what `from_values`
    takes back (a settings object as JSON, flat as its flags are)."""
    return {name: value for name, (value, _) in flat(settings).items()}


def from_values(cls: type, values: dict[str, Any]):
    """An instance of `cls` from flat values by field name, nested settings filled from theirs
    (`learning_rate` goes to the optimiser's settings); a name `cls` does not take is refused."""
    unknown = set(values) - field_names(cls)
    if unknown:
        raise TypeError(f"{cls.__name__}: unknown settings {sorted(unknown)}")
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if field.metadata.get("nested"):
            inner = hints[field.name]
            mine = {k: v for k, v in values.items() if k in field_names(inner)}
            kwargs[field.name] = from_values(inner, field.metadata["defaults"] | mine)
        elif field.name in values:
            kwargs[field.name] = values[field.name]
    return cls(**kwargs)


def replaced(settings: Any, **values: Any):
    """`settings` with fields replaced by flat name, nested ones included:
    replaced(pretrain_config, learning_rate=1e-3, max_steps=10)."""
    unknown = set(values) - field_names(type(settings))
    if unknown:
        raise TypeError(f"{type(settings).__name__}: unknown settings {sorted(unknown)}")
    hints = typing.get_type_hints(type(settings))
    changes: dict[str, Any] = {}
    for field in dataclasses.fields(settings):
        if field.metadata.get("nested"):
            mine = {k: v for k, v in values.items() if k in field_names(hints[field.name])}
            if mine:
                changes[field.name] = replaced(getattr(settings, field.name), **mine)
        elif field.name in values:
            changes[field.name] = values[field.name]
    return dataclasses.replace(settings, **changes)


def from_flags(args: argparse.Namespace, cls: type, **values: Any):
    """An instance of the settings dataclass `cls` from parsed flags (and `values` on top)."""
    names = field_names(cls)
    return from_values(cls, {k: v for k, v in vars(args).items() if k in names} | values)
