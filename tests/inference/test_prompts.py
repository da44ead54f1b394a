"""Prompts a sentence-transformers folder declares (config_sentence_transformers.json), put
before each text by `Embedder` as `SentenceTransformer.encode(prompt_name=...)` puts them,
with the pooling's `include_prompt` honoured."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from bertkit.inference.embedder import Embedder

st = pytest.importorskip("sentence_transformers")

TEXTS = ["how many people live in paris", "a short one", "the cat sat on the mat " * 5]
PROMPTS = {"query": "query: ", "document": "passage: "}


def prompted(minilm_dir, tmp_path, default=None, include_prompt=True):
    folder = tmp_path / "prompted"
    shutil.copytree(minilm_dir, folder)
    config = json.loads((folder / "config_sentence_transformers.json").read_text())
    config |= {"prompts": PROMPTS, "default_prompt_name": default}
    (folder / "config_sentence_transformers.json").write_text(json.dumps(config))
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    pooling["include_prompt"] = include_prompt
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return folder


@pytest.mark.parametrize("include_prompt", [True, False])
def test_prompts_as_sentence_transformers_puts_them(minilm_dir, tmp_path, include_prompt):
    folder = prompted(minilm_dir, tmp_path, include_prompt=include_prompt)
    theirs = st.SentenceTransformer(str(folder), device="cpu")
    plain = Embedder(folder, precision="fp32")(TEXTS)
    np.testing.assert_allclose(plain, theirs.encode(TEXTS), atol=1e-5)
    for name in PROMPTS:
        expected = theirs.encode(TEXTS, prompt_name=name)
        got = Embedder(folder, precision="fp32", prompt_name=name)(TEXTS)
        np.testing.assert_allclose(got, expected, atol=1e-5)
        assert np.abs(got - plain).max() > 1e-3  # the prompt changed the vectors


def test_the_default_prompt_applies_and_an_unknown_name_is_refused(minilm_dir, tmp_path):
    folder = prompted(minilm_dir, tmp_path, default="query")
    theirs = st.SentenceTransformer(str(folder), device="cpu")
    embedder = Embedder(folder, precision="fp32")
    assert embedder.prompt_name == "query"
    np.testing.assert_allclose(embedder(TEXTS), theirs.encode(TEXTS), atol=1e-5)
    with pytest.raises(ValueError, match=r"no prompt named 'question' \(the folder declares "
                                         r"document, query"):  # fmt: skip
        Embedder(folder, precision="fp32", prompt_name="question")
    with pytest.raises(ValueError, match="declares none"):
        Embedder(minilm_dir, precision="fp32", prompt_name="query")
