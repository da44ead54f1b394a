"""The settings dataclasses (bertkit.settings): each field's check holds for Python callers as for
the command line, flat names reach nested settings, recipes lay under what a user gives."""

import dataclasses
import re

import pytest

from bertkit.cli import build_parser, main
from bertkit.finetuning.evaluation import EvaluateConfig
from bertkit.finetuning.train import FinetuneConfig
from bertkit.inference.features import ExtractConfig
from bertkit.inference.fill_mask import FillMaskConfig
from bertkit.inference.predict import PredictConfig
from bertkit.pretraining.dataset import MaskingConfig
from bertkit.pretraining.recipes import apply_recipe
from bertkit.pretraining.train import PretrainConfig
from bertkit.rows import FileConfig
from bertkit.serve import ServeConfig
from bertkit.settings import from_flags, from_values, replaced
from bertkit.tasks import get_task
from bertkit.tasks.own import DataConfig
from bertkit.training.optim import OptimConfig


@pytest.mark.parametrize(
    "make, flag, says",
    [
        (lambda: PretrainConfig(batch_size=0), ["--batch-size", "0"], "must be positive, got 0"),
        (lambda: PretrainConfig(eval_every=-1), ["--eval-every", "-1"], "must be 0 or more"),
        (lambda: PretrainConfig(dropout=1.0), ["--dropout", "1"], "must be in [0, 1), got 1"),
        (
            lambda: MaskingConfig(mask_prob=1.5),
            ["--mask-prob", "1.5"],
            "must be in [0, 1], got 1.5",
        ),
        (lambda: OptimConfig(learning_rate=float("inf")), ["--lr", "inf"], "'inf' is not a finite"),
        (lambda: OptimConfig(adam_beta2=1.0), ["--adam-beta2", "1"], "must be in [0, 1)"),
        (lambda: PretrainConfig(objective="cbow"), ["--objective", "cbow"], "cbow"),
    ],
)
def test_python_callers_meet_the_checks_the_command_line_makes(make, flag, says, capsys):
    with pytest.raises(ValueError) as error:
        make()
    assert says in str(error.value)
    assert flag[0] in str(error.value)  # named by its flag, as the command names it
    with pytest.raises(SystemExit) as exit_info:
        main(["pretrain", "--data", "d", "--out", "o", "--max-steps", "5", *flag])
    assert exit_info.value.code == 2
    assert says in capsys.readouterr().err


def test_every_settings_class_checks_itself_and_replace_too():
    for make, says in (
        (lambda: FinetuneConfig(epochs=0), "FinetuneConfig: --epochs must be positive, got 0"),
        (lambda: FinetuneConfig(warmup_fraction=1.0), "--warmup-fraction must be in [0, 1), got 1"),
        (lambda: ServeConfig(max_batch_size=0), "--max-batch-size must be positive, got 0"),
        (lambda: ServeConfig(backend="tensorrt"), "--backend 'tensorrt' is not one of torch, onnx"),
        (lambda: DataConfig(max_cell_chars=0), "--max-cell-chars must be positive, got 0"),
        (lambda: OptimConfig(optimizer="sgd"), "--optimizer 'sgd' is not one of adamw"),
        (lambda: OptimConfig(warmup_steps=10, warmup_fraction=0.1), "not both"),
        (lambda: dataclasses.replace(PretrainConfig(), seq_len=0), "--seq-len must be positive"),
    ):
        with pytest.raises(ValueError, match=re.escape(says)):
            make()


def test_flat_names_reach_the_nested_settings():
    config = from_values(PretrainConfig, {"learning_rate": 3e-4, "mask_prob": 0.3, "seq_len": 64})
    assert config.optim.learning_rate == 3e-4 and config.masking.mask_prob == 0.3
    assert config.seq_len == 64 and config.optim.adam_beta2 == 0.999  # the one default
    changed = replaced(config, adam_beta2=0.98, max_steps=7)
    assert changed.optim.adam_beta2 == 0.98 and changed.optim.learning_rate == 3e-4
    assert changed.max_steps == 7 and config.max_steps is None  # a copy
    assert PretrainConfig(learning_rate=3e-4, mask_prob=0.3, seq_len=64) == config  # by name
    with pytest.raises(TypeError, match="unknown settings"):
        replaced(config, learning_rat=1.0)
    with pytest.raises(TypeError, match="unknown settings"):
        from_values(PretrainConfig, {"epochs": 3})


def test_fine_tuning_holds_the_optimiser_settings_pre_training_holds():
    """One OptimConfig, one warm-up vocabulary: FinetuneConfig takes its fields by name (and
    `dataclasses.replace` too); the old warm-up name still works, with a warning."""
    config = FinetuneConfig(learning_rate=2e-5, weight_decay=0.0, epochs=2)
    assert config.optim.learning_rate == 2e-5 and config.optim.weight_decay == 0.0
    assert dataclasses.replace(config, learning_rate=3e-5, seed=1).optim.learning_rate == 3e-5
    assert FinetuneConfig().optim.learning_rate is None  # the task's
    with pytest.warns(FutureWarning, match="warmup_proportion is now warmup_fraction"):
        assert FinetuneConfig(warmup_proportion=0.2).optim.warmup_fraction == 0.2
    mrpc = FinetuneConfig().resolved(get_task("mrpc"))
    assert mrpc.optim.learning_rate == 5e-5 and mrpc.optim.warmup_fraction == 0.1
    # Google's run_classifier.py: int(steps x fraction), unlike pre-training's rounding
    assert mrpc.optim_for(119).warmup_steps == 11 and mrpc.optim_for(119).warmup_fraction is None
    steps = FinetuneConfig(warmup_steps=7).resolved(get_task("mrpc"))
    assert steps.optim.warmup_fraction is None and steps.optim_for(119).warmup_steps == 7


@pytest.mark.parametrize("old", ["--warmup", "--warmup-proportion"])
def test_the_old_warmup_flags_still_work_and_say_the_new_one(old, capsys):
    args = build_parser().parse_args(["finetune", "mrpc", "--data", "d", "--out", "o", old, "0.2"])
    assert from_flags(args, FinetuneConfig).optim.warmup_fraction == 0.2
    assert f"{old} is now --warmup-fraction" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # checked as the new flag is
        build_parser().parse_args(["finetune", "mrpc", "--data", "d", "--out", "o", old, "1.5"])
    assert "must be in [0, 1), got 1.5" in capsys.readouterr().err


def test_apply_recipe_is_what_the_command_builds():
    laptop = apply_recipe("laptop", {"budget_seconds": 600.0, "config": "small"})
    assert laptop.batch_size == 32 and laptop.optim.learning_rate == 1e-3  # 2e-3 x 256 / 512
    assert laptop.optim.budget_warmup() == 0.1 and laptop.masking.mask_prob == 0.15
    paper = apply_recipe(None, {"max_steps": 20_000})
    assert paper.optim.warmup_steps == 10_000 and paper.batch_size == 256
    assert paper.optim.warmup_steps_for(20_000, None) == 10_000
    # an explicit warm-up replaces the recipe's, in steps or as a fraction
    assert apply_recipe(None, {"max_steps": 100, "warmup_fraction": 0.2}).optim.warmup_steps is None
    given = apply_recipe("laptop", {"max_steps": 100, "warmup_steps": 5}).optim
    assert given.warmup_steps == 5 and given.warmup_fraction is None
    # a budget's warm-up is a fraction of it, never the paper's 10,000 steps
    budget = apply_recipe(None, {"budget_seconds": 60.0})
    assert budget.optim.warmup_steps is None and budget.optim.budget_warmup() == 0.1
    assert budget.optim.warmup_steps_for(None, 60.0) == 0


def test_the_warmup_in_steps():
    assert OptimConfig(warmup_fraction=0.1).warmup_steps_for(24, None) == 2
    assert OptimConfig(warmup_fraction=0.0).warmup_steps_for(24, None) == 0
    assert OptimConfig(warmup_steps=3).warmup_steps_for(24, None) == 3
    with pytest.raises(ValueError, match="not shorter than the run"):
        OptimConfig().warmup_steps_for(500, None)  # the paper's 10,000
    with pytest.raises(ValueError, match="give --warmup-fraction"):
        OptimConfig(warmup_steps=3).warmup_steps_for(None, 60.0)
    with pytest.raises(ValueError, match="--max-steps N or --budget"):
        OptimConfig().warmup_steps_for(None, None)


def test_phases_are_a_field_and_share_one_held_out_length():
    plan = PretrainConfig(phases="32:6,64:4", max_steps=99).phase_plan()
    assert [(p.seq_len, p.max_steps, p.eval_seq_len) for p in plan] == [(32, 6, 64), (64, 4, 64)]
    plan = PretrainConfig(phases=[(32, 0.75), (128, 0.25)], budget_seconds=100.0).phase_plan()
    assert [(p.seq_len, p.max_steps, p.budget_seconds) for p in plan] == [
        (32, None, 75.0),
        (128, None, 25.0),
    ]
    (single,) = PretrainConfig(max_steps=5, seq_len=64).phase_plan()
    assert single.seq_len == 64 and single.eval_seq_len == 64 and single.phases is None
    with pytest.raises(ValueError, match="--phases SEQ:STEPS"):
        PretrainConfig().phase_plan()


def test_the_commands_that_use_models_take_settings_too(capsys):
    """predict, evaluate, fill-mask and extract are built from settings as finetune is; one
    FileConfig says how a file is read, for training (DataConfig) and for predict."""
    assert type(DataConfig().reading) is type(PredictConfig().reading) is FileConfig
    assert DataConfig(format="tsv", columns=("a", "b")).reading.column_names == ("a", "b")
    saved = FileConfig(columns="a,b", encoding="cp1252")
    assert PredictConfig().reading.over(saved) == saved  # nothing given: as trained
    assert PredictConfig(columns="").reading.over(saved).column_names is None  # a header line
    given = PredictConfig(delimiter=";").reading.over(saved)
    assert given == FileConfig(columns="a,b", encoding="cp1252", delimiter=";")
    for make, says in (
        (lambda: PredictConfig(batch_size=0), "PredictConfig: --batch-size must be positive"),
        (lambda: PredictConfig(backend="tensorrt"), "--backend 'tensorrt' is not one of"),
        (lambda: PredictConfig(delimiter=";;"), "--delimiter must be one character, got ';;'"),
        (lambda: FillMaskConfig(top=0), "FillMaskConfig: --top must be positive, got 0"),
        (lambda: ExtractConfig(max_seq_length=0), "--max-seq-length must be positive, got 0"),
        (lambda: EvaluateConfig(batch_size=0), "EvaluateConfig: --batch-size must be positive"),
    ):
        with pytest.raises(ValueError, match=re.escape(says)):
            make()
    for argv in (["fill-mask", "--model", "m", "--top", "0", "a [MASK]"],
                 ["predict", "--model", "m", "--batch-size", "0", "a text"]):  # fmt: skip
        with pytest.raises(SystemExit):
            main(argv)
        assert "must be positive, got 0" in capsys.readouterr().err


def test_both_runs_nest_one_compute_setting_read_and_set_by_name():
    from bertkit.settings import flat
    from bertkit.training.config import ComputeConfig

    tune = FinetuneConfig(precision="fp32", device="cpu", parity=True)
    assert tune.compute == ComputeConfig(precision="fp32", device="cpu", parity=True)
    assert tune.precision == "fp32" and tune.learning_rate == tune.optim.learning_rate
    pre = dataclasses.replace(PretrainConfig(), compile="off")
    pre.activation_checkpointing = True
    assert pre.compute.compile == "off" and pre.compute.activation_checkpointing
    with pytest.raises(ValueError, match="--precision"):
        FinetuneConfig(precision="fp8")
    # declared once: both commands take these flags from ComputeConfig, with its defaults
    names = [f.name for f in dataclasses.fields(ComputeConfig)]
    for config in (FinetuneConfig(), PretrainConfig()):
        values = flat(config)
        assert {n: values[n] for n in names} == flat(ComputeConfig())
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for command in ("pretrain", "finetune"):
        helps = {a.dest: a.help for a in commands[command]._actions}
        assert [helps[n] for n in names] == [
            a.help for a in commands["pretrain"]._actions if a.dest in names
        ]


def test_the_packages_names_are_listed_once_and_typed_the_same():
    """`bertkit`'s public names: `_EXPORTS` (name -> module, imported on first use) is the one
    list; `__all__` is made from it, and the imports static checkers read (TYPE_CHECKING) name
    the same names from the same modules."""
    import ast
    import importlib

    import bertkit

    assert bertkit.__all__ == list(bertkit._EXPORTS)
    tree = ast.parse(importlib.util.find_spec("bertkit").loader.get_source("bertkit"))
    checking = next(
        n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)
    )
    typed = {alias.name: node.module for node in checking.body for alias in node.names}
    assert typed == bertkit._EXPORTS
    for name, module in bertkit._EXPORTS.items():
        assert getattr(bertkit, name) is getattr(importlib.import_module(module), name)
