"""`bertkit demo`: the embedded corpus and the demo run end to end."""

import pytest

from bertkit.cli.demo import docstring_documents, run_demo


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


@pytest.mark.slow
def test_demo_pretrains_on_a_given_corpus(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    documents = [
        " ".join(f"Sentence {i} of document {d} is about the quick brown fox." for i in range(8))
        for d in range(40)
    ]
    corpus.write_text("\n\n".join(documents))
    run_demo(
        tmp_path / "out", corpus=[str(corpus)], budget_seconds=None, max_steps=12, batch_size=8
    )
    printed = capsys.readouterr().out
    assert "MLM accuracy" in printed and "fill-mask" in printed
    assert printed.count("\n       12 ") == 1  # the last evaluation, printed as it came
    for name in ("model.safetensors", "vocab.txt", "config.json", "log.jsonl"):
        assert (tmp_path / "out" / name).exists()
