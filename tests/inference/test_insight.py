"""Fill-mask, similarity and attention (issue 11): checked against transformers where it has
the same thing, and against what must hold (symmetry, rows summing to 1) where it does not."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertkit.cli import main


def test_similarity_is_symmetric_with_ones_on_the_diagonal(mlm_dir, tmp_path):
    from bertkit.inference.insight import similarity

    texts = ["i sat on the river bank .", "the bank raised its rates .", "one more bank ."]
    result = similarity(mlm_dir, texts, layer="all", word="bank")
    assert result.layers == [0, 1, 2]
    pieces = sum(len(p) for p in result.pieces)
    assert result.pieces[0] == ["i", "sat", "on", "the", "river", "bank", "."]  # no [CLS]/[SEP]
    for matrix in [*result.tokens.values(), result.sentences]:
        assert np.allclose(matrix, matrix.T, atol=1e-6)
        assert np.allclose(np.diag(matrix), 1.0, atol=1e-5)
    assert result.tokens[2].shape == (pieces, pieces) and result.sentences.shape == (3, 3)
    assert sorted(result.word_curves) == ["1-2", "1-3", "2-3"]
    for curve in result.word_curves.values():  # the piece embedding is one row for every context
        assert len(curve) == 4 and curve[0] == pytest.approx(1.0) and curve[1] < 1.0 - 1e-4
    # the sentence vectors at the last layer are the mean of the pieces (or [CLS])
    last = similarity(mlm_dir, texts[:2], pooling="cls")
    assert last.layers == [2] and last.sentence_layer == 2
    png = result.save_png(tmp_path / "s.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="occurs in 1 of the texts"):
        similarity(mlm_dir, texts, word="river")
    with pytest.raises(ValueError, match="layer 5 does not exist: this model has 0..2"):
        similarity(mlm_dir, texts, layer=5)


def test_attention_rows_sum_to_one_and_match_transformers(mlm_dir, tmp_path):
    from bertkit.inference.insight import attention

    result = attention(mlm_dir, "the cat sat on the mat .", "it was happy .")
    assert result.pieces[0] == "[CLS]" and result.pieces.count("[SEP]") == 2
    layers, heads, count, _ = result.maps.shape
    assert (layers, heads, count) == (2, 4, len(result.pieces))
    assert np.allclose(result.maps.sum(-1), 1.0, atol=1e-5)
    transformers = pytest.importorskip("transformers")
    reference = transformers.BertModel.from_pretrained(mlm_dir, attn_implementation="eager").eval()
    tokenizer = transformers.BertTokenizerFast.from_pretrained(mlm_dir)
    encoded = tokenizer("the cat sat on the mat .", "it was happy .", return_tensors="pt")
    with torch.no_grad():
        theirs = reference(**encoded, output_attentions=True).attentions
    assert np.allclose(result.maps, torch.stack([a[0] for a in theirs]).numpy(), atol=1e-5)
    assert result.save_png(tmp_path / "grid.png").stat().st_size > 0
    assert result.save_png(tmp_path / "one.png", layer=2, head=3).stat().st_size > 0
    with pytest.raises(ValueError, match="layer must be 1..2 and head 0..3"):
        result.save_png(tmp_path / "x.png", layer=3, head=0)
    page = result.save_html(tmp_path / "a.html").read_text()
    assert "http" not in page.replace("http-equiv", "") and "<script src" not in page
    assert '"maps"' in page and "[SEP]" in page


@pytest.mark.slow
def test_attention_page_renders_in_a_headless_browser(mlm_dir, tmp_path):
    import shutil
    import subprocess

    from bertkit.inference.insight import attention

    browser = next(
        (
            shutil.which(b)
            for b in ("chromium", "chromium-browser", "google-chrome")
            if shutil.which(b)
        ),
        None,
    )
    if browser is None:
        pytest.skip("no Chromium installed (apt-get install chromium)")
    page = attention(mlm_dir, "a </script> b").save_html(tmp_path / "a.html")
    dom = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    count = len(attention(mlm_dir, "a </script> b").pieces)
    assert f'data-rendered="{count * count}"' in dom  # the script ran and drew every cell


def test_similarity_and_attention_commands(mlm_dir, tmp_path, capsys):
    out = tmp_path / "s.png"
    args = ["similarity", "--model", str(mlm_dir), "a bank .", "the bank", "--word", "bank"]
    assert main([*args, "--out", str(out), "--layer", "-1"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["sentence_layer"] == 2 and list(printed["word_curves"]) == ["1-2"]
    assert out.exists()
    for name in ("a.png", "a.html"):
        assert (
            main(["attention", "--model", str(mlm_dir), "a b c", "--out", str(tmp_path / name)])
            == 0
        )
        assert (tmp_path / name).exists()
    assert main(["attention", "--model", str(mlm_dir), "a", "--layer", "1", "--out", str(out)]) == 2
    assert "give both layer and head" in capsys.readouterr().err
