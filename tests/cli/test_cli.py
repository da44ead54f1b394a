import pytest

from bertkit import cli
from bertkit.cli import build_parser, main, use
from bertkit.finetuning.evaluation import EvaluateConfig
from bertkit.settings import from_flags


def test_vocab_command(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("alpha beta gamma delta\n" * 20)
    assert main(["vocab", str(corpus), "--size", "200", "--out", str(tmp_path / "v")]) == 0
    assert "vocab.txt" in capsys.readouterr().out
    assert main(["vocab", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "v")]) == 2
    assert "missing.txt: no such corpus file" in capsys.readouterr().err
    # a line that is not UTF-8: named, and skipped when asked as the error says (as `prepare`)
    (tmp_path / "bad.txt").write_bytes(b"alpha beta\n\xff\xfe gamma\n")
    argv = ["vocab", str(corpus), str(tmp_path / "bad.txt"), "--out", str(tmp_path / "w")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "bad.txt:2: not UTF-8 at byte offset 11" in err and "--on-error skip" in err
    assert main([*argv, "--on-error", "skip"]) == 0
    assert "skipped 0 empty documents, 1 bad lines" in capsys.readouterr().out


def test_every_subcommand_has_help(capsys):
    """Every subcommand the parser has (read from it, not listed here), each with a usage line
    and a description of its own."""
    import argparse

    parser = build_parser()
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(commands.choices) >= 15, sorted(commands.choices)
    for command in commands.choices:
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args([command, "--help"])
        assert exit_info.value.code == 0
        shown = capsys.readouterr().out
        assert shown.startswith(f"usage: bertkit {command}") and len(shown) > 200, command


def test_pretrain_recipe_sets_its_settings_and_flags_win(monkeypatch, capsys, tmp_path):
    import bertkit.pretraining.train as train

    seen = {}

    def fake_run_pretraining(data, out, settings):  # the PretrainConfig the flags made
        phases = [(phase.seq_len, phase.max_steps) for phase in settings.phase_plan()]
        seen.update(vars(settings), **vars(settings.optim), **vars(settings.masking))
        seen["phases"] = phases
        return []

    monkeypatch.setattr(train, "run_pretraining", fake_run_pretraining)
    base = ["pretrain", "--data", "d", "--out", "o"]
    assert main([*base, "--recipe", "laptop", "--budget", "10m"]) == 0
    assert seen["config"] == "tiny" and seen["batch_size"] == 32 and seen["learning_rate"] == 2e-3
    assert seen["budget_seconds"] == 600.0 and seen["warmup_fraction"] == 0.1
    assert seen["warmup_steps"] is None and seen["dropout"] == 0.0
    assert seen["mlm_bias_init"] == "unigram" and seen["adam_beta2"] == 0.98
    assert main([*base, "--recipe", "laptop", "--max-steps", "50", "--lr", "5e-4"]) == 0
    assert seen["learning_rate"] == 5e-4 and seen["phases"] == [(128, 50)]
    # a wider model gets a lower peak (BERT-small diverged at 2e-3); an explicit --lr still wins
    assert main([*base, "--recipe", "laptop", "--max-steps", "50", "--config", "small"]) == 0
    assert seen["learning_rate"] == 1e-3 and seen["config"] == "small"
    assert main([*base, "--recipe", "laptop", "--max-steps", "50", "--config", "mini"]) == 0
    assert seen["learning_rate"] == 2e-3
    from bertkit.core.config import BertConfig

    BertConfig(vocab_size=100, hidden_size=384, num_attention_heads=6).to_json_file(
        tmp_path / "config.json"
    )
    args = ["--recipe", "laptop", "--max-steps", "50", "--config", str(tmp_path / "config.json")]
    assert main([*base, *args]) == 0 and seen["learning_rate"] == pytest.approx(2e-3 * 256 / 384)
    args = ["--recipe", "laptop", "--max-steps", "50", "--config", "base", "--lr", "3e-4"]
    assert main([*base, *args]) == 0 and seen["learning_rate"] == 3e-4
    # no recipe: the paper's settings
    assert main([*base, "--max-steps", "20000"]) == 0
    assert seen["batch_size"] == 256 and seen["learning_rate"] == 1e-4
    assert seen["warmup_steps"] == 10_000 and seen["dropout"] is None
    assert main([*base]) == 2
    assert "--budget" in capsys.readouterr().err
    assert main([*base, "--budget", "soon"]) == 2
    assert "expected a duration" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # every default is shown in --help
        main(["pretrain", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 10)" in text and "paper 256; laptop 32" in text


PRE = ["pretrain", "--data", "d", "--out", "o"]


@pytest.mark.parametrize(
    "args, says",
    [
        ([*PRE, "--save-every", "0"], "--save-every: must be positive"),
        ([*PRE, "--log-every", "0"], "--log-every: must be positive"),
        ([*PRE, "--max-steps", "0"], "--max-steps: must be positive"),
        ([*PRE, "--batch-size", "0"], "--batch-size: must be positive"),
        ([*PRE, "--lr", "inf"], "--learning-rate/--lr: 'inf' is not a finite"),
        ([*PRE, "--mask-prob", "1.5"], "--mask-prob: must be in [0, 1]"),
        (["finetune", "mrpc", "--epochs", "0"], "--epochs: must be positive"),
        (["fill-mask", "--model", "m", "x", "--top", "-1"], "--top: must be positive"),
    ],
)
def test_numeric_flags_are_checked_when_parsed(args, says, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    assert says in capsys.readouterr().err


def test_the_parser_answers_as_a_new_user_would_want(capsys):
    parser = build_parser()
    args = parser.parse_args(
        ["finetune", "MRPC", "--model", "m", "--data", "d", "--out", "o", "-v"]
    )
    assert args.task == "mrpc" and args.verbose
    assert (
        parser.parse_args(["finetune", "sst-2", "--model", "m", "--data", "d", "--out", "o"]).task
        == "sst2"
    )
    assert (
        parser.parse_args(
            ["finetune", "CoNLL2003-POS", "--model", "m", "--data", "d", "--out", "o"]
        ).task
        == "conll2003-pos"
    )
    args = parser.parse_args(
        ["-v", "evaluate", "--model", "m", "--data", "d", "--split", "validation"]
    )
    assert from_flags(args, EvaluateConfig).split == "dev" and args.verbose  # the dev split
    assert EvaluateConfig(split="Validation").split == "dev"  # from Python too
    assert not parser.parse_args(["evaluate", "--model", "m", "--data", "d"]).verbose
    # a setting's flag is its field's name; the README's short spellings stay
    for flag in ("--learning-rate", "--lr"):
        args = parser.parse_args(["finetune", "mrpc", "--data", "d", "--out", "o", flag, "2e-5"])
        assert args.learning_rate == 2e-5
        pretrain = parser.parse_args(["pretrain", "--data", "d", "--out", "o", flag, "2e-5"])
        assert pretrain.learning_rate == 2e-5
    for argv, says in (
        (
            ["finetune", "mrpc", "--data", "d", "--out", "o", "--epoch", "1"],
            "--epoch → --epochs",
        ),  # no abbreviations
        (
            ["finetune", "mrpc", "--data", "d", "--out", "o", "--learning_rate", "1e-4"],
            "--learning_rate → --lr",
        ),
        (
            ["finetune", "mrpc", "--data", "d", "--out", "o", "--num-train-epochs", "3"],
            "--num-train-epochs → --epochs",
        ),
        (["pretrain", "--data", "d", "--out", "o", "--batch", "32"], "--batch → --batch-size"),
    ):
        with pytest.raises(SystemExit):
            main(argv)
        err = capsys.readouterr().err
        assert says in err and f"usage: bertkit {argv[0]}" in err, err


def test_vocab_reads_wikiextractor_files_as_prepare_does(tmp_path):
    doc = '<doc id="{n}" url="https://en.wikipedia.org/wiki?curid={n}" title="T{n}">\nT{n}\n\n{text}\n</doc>\n'
    text = "The cat sat on the mat. A dog barked at the cat near the river bank."
    (tmp_path / "wiki_00").write_text("".join(doc.format(n=n, text=text) for n in range(20)))
    assert (
        main(
            [
                "vocab",
                str(tmp_path),
                "--size",
                "200",
                "--num-unused",
                "0",
                "--out",
                str(tmp_path / "v"),
            ]
        )
        == 0
    )
    tokens = set((tmp_path / "v" / "vocab.txt").read_text().split())
    assert {"cat", "dog", "river"} <= tokens
    assert not tokens & {"doc", "url", "curid", "title", "https", "wikipedia"}  # markup, not text


def test_a_fatal_error_starts_its_own_line_after_a_progress_bar(monkeypatch, capsys):
    from tqdm import tqdm

    def fails(args):
        bar = tqdm(total=100, desc="train")
        bar.update(40)  # a bar cut short: no newline after its figures
        raise ValueError("the disk is full")

    monkeypatch.setattr(use, "_viz", fails)
    assert cli.main(["viz", "log.jsonl"]) == 2
    err = capsys.readouterr().err
    assert "train" in err and "\nbertkit viz: error: the disk is full\n" in err
