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


def test_demo_pretrains_on_a_given_corpus(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    documents = [
        " ".join(f"Sentence {i} of document {d} is about the quick brown fox." for i in range(8))
        for d in range(40)
    ]
    corpus.write_text("\n\n".join(documents))
    run_demo(tmp_path / "out", corpus=[str(corpus)], max_steps=12, batch_size=8)
    printed = capsys.readouterr().out
    assert "held-out MLM loss" in printed and "fill-mask" in printed
    for name in ("model.safetensors", "vocab.txt", "config.json", "log.jsonl"):
        assert (tmp_path / "out" / name).exists()


def test_vocab_command(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("alpha beta gamma delta\n" * 20)
    assert main(["vocab", str(corpus), "--size", "200", "--out", str(tmp_path / "v")]) == 0
    assert "vocab.txt" in capsys.readouterr().out
    assert main(["vocab", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "v")]) == 2
    assert "corpus file not found" in capsys.readouterr().err


def test_every_subcommand_has_help():
    parser = build_parser()
    for command in ("vocab", "prepare", "pretrain", "convert", "demo"):
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args([command, "--help"])
        assert exit_info.value.code == 0
