import pytest

from bertkit.cli import build_parser, main
from bertkit.demo import docstring_documents, run_demo


def test_docstring_corpus_reads_source_without_importing(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "mod.py").write_text(
        '"""Module doc.\n\nSecond paragraph."""\nraise SystemExit("imported!")\n'
        'def f():\n    """Function doc."""\n'
    )
    (package / "broken.py").write_text("def (:\n")
    docs = list(docstring_documents([package]))
    assert docs == [["Module doc.", "Second paragraph.", "Function doc."]]
    stdlib = list(docstring_documents(max_files=3))
    assert len(stdlib) == 3 and all(stdlib)


def test_demo_runs_on_a_given_corpus(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "\n".join(f"Sentence number {i} about the quick brown fox." for i in range(300))
    )
    run_demo(tmp_path / "out", corpus=[str(corpus)])
    printed = capsys.readouterr().out
    assert "max |difference| of MLM logits = 0.0e+00" in printed
    assert (tmp_path / "out" / "model.safetensors").exists()
    assert (tmp_path / "out" / "vocab.txt").exists()


def test_vocab_command(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("alpha beta gamma delta\n" * 20)
    assert main(["vocab", str(corpus), "--size", "200", "--out", str(tmp_path / "v")]) == 0
    assert "vocab.txt" in capsys.readouterr().out
    assert main(["vocab", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "v")]) == 2
    assert "corpus file not found" in capsys.readouterr().err


def test_every_subcommand_has_help():
    parser = build_parser()
    for command in ("vocab", "convert", "demo"):
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args([command, "--help"])
        assert exit_info.value.code == 0
