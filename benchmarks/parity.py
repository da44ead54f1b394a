"""Numerical parity figures for the README: bertkit against the references, max |difference|.

    BERTKIT_DATA=../shared/data python benchmarks/parity.py

1. Google's TF checkpoint (../shared/data/checkpoints/google_tf_tiny, written by TensorFlow)
   read without TensorFlow, against the outputs transformers computed from it (reference.npz).
2. all-MiniLM-L6-v2 real weights against transformers.BertModel on a padded batch of real
   sentences (SQuAD dev questions and contexts), over real tokens and over every position.
"""

from __future__ import annotations

import json

import numpy as np
import torch
from _args import DATA, minilm

from bertkit import BertForPreTraining, BertModel, BertTokenizer


def main() -> None:
    data = DATA
    tiny = data / "checkpoints" / "google_tf_tiny"
    reference = np.load(tiny / "reference.npz")
    model = BertForPreTraining.from_pretrained(tiny)
    inputs = {
        k: torch.from_numpy(reference[k]).long()
        for k in ("input_ids", "token_type_ids", "attention_mask")
    }
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True)
        pooled = model.bert.pooler(out.hidden_states[-1])
    print("Google TF tiny checkpoint vs transformers' outputs (reference.npz):")
    for name, got in (
        ("sequence_output", out.hidden_states[-1]),
        ("pooled_output", pooled),
        ("mlm_logits", out.mlm_logits),
        ("nsp_logits", out.nsp_logits),
    ):
        print(f"  {name:<16} max |d| = {np.abs(got.numpy() - reference[name]).max():.1e}")

    import transformers

    path = minilm()
    squad = json.loads((data / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    texts = []
    for article in squad["data"][:4]:
        for paragraph in article["paragraphs"][:4]:
            texts.append(paragraph["context"])
            texts.append(paragraph["qas"][0]["question"])
    tok = BertTokenizer.from_pretrained(path)
    batch = tok(texts, max_length=256, padding=True, return_tensors="pt")
    ours = BertModel.from_pretrained(path)
    theirs = transformers.BertModel.from_pretrained(str(path)).eval()
    with torch.no_grad():
        a, b = ours(**batch).last_hidden_state, theirs(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    print(
        f"all-MiniLM-L6-v2 vs transformers.BertModel, batch {tuple(batch['input_ids'].shape)}, "
        f"{real.float().mean():.0%} real tokens:"
    )
    print(
        f"  last_hidden_state max |d| = {(a - b).abs().max():.1e} (all positions), "
        f"{(a - b)[real].abs().max():.1e} (real tokens)"
    )


if __name__ == "__main__":
    main()
