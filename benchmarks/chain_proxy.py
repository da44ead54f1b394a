"""A fast proxy for the MLM plateau: how soon a BERT learns to read its neighbours when they
decide the masked word completely.

    python benchmarks/chain_proxy.py --out runs/chain [--variants base seq32 lr3e-3]

Corpus: 3,000 documents of 3-19 sentences; a sentence is a chain of 5-24 words over 400 words,
each word fixing the next (w -> (7w + 3) mod 400). A masked word is then given by either
neighbour, so a model that attends to position i-1 or i+1 gets it right; one that does not
scores ~0.3%. BERT-tiny (no dropout), MLM + NSP, batch 64 x 128, lr 1e-3 after 20 warm-up steps,
300 steps, one thread; the held-out accuracy (every chosen piece [MASK]) every 50 steps.
Each variant changes one thing. Prints one line per variant.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch
from _args import arguments
from _harness import synthetic_tokenizer

from bertkit.core.config import BertConfig
from bertkit.core.heads import BertForMaskedLM, BertForPreTraining
from bertkit.pretraining.dataset import MaskingConfig
from bertkit.pretraining.init_schemes import (
    local_attention_,
    mimetic_attention_,
    sinusoidal_positions_,
)
from bertkit.pretraining.shards import chunk_from_token_documents, write_shards
from bertkit.pretraining.train import run_pretraining

VARIANTS = {
    "base": {},
    "sinusoidal": {"pos": 0.02},
    "sinusoidal-x5": {"pos": 0.1},
    "positions-x5": {"posstd": 0.1},
    "lr3e-3": {"learning_rate": 3e-3},
    "init0.05": {"cfg": {"initializer_range": 0.05}},
    "mlm-only": {"objective": "mlm"},
    "mask40": {"masking": MaskingConfig(mask_prob=0.4, max_predictions=52)},
    "seq64": {"seq_len": 64, "batch_size": 128},
    "seq32": {"seq_len": 32, "batch_size": 256},
    "seq16": {"seq_len": 16, "batch_size": 512},
    "seq32-lr3e-3": {"seq_len": 32, "batch_size": 256, "learning_rate": 3e-3},
    "mimetic": {"mimetic": ((0.7, 0.7), (0.4, 0.4))},
    "mimetic-qk": {"mimetic": ((0.7, 0.7), None)},
    "mimetic-sin": {"mimetic": ((0.7, 0.7), (0.4, 0.4)), "pos": 0.02},
    "mimetic-qk-sin": {"mimetic": ((0.7, 0.7), None), "pos": 0.02},
    "local": {"local": True},
}


def corpus(root: Path, tokenizer) -> Path:
    if (root / "shards" / "meta.json").exists():
        return root / "shards"
    words = np.asarray([i for t, i in tokenizer.vocab.items() if t.startswith("w")])
    rng = np.random.default_rng(0)
    documents = []
    for _ in range(3000):
        document = []
        for _ in range(int(rng.integers(3, 20))):
            chain = [int(rng.integers(0, len(words)))]
            for _ in range(int(rng.integers(5, 25)) - 1):
                chain.append((chain[-1] * 7 + 3) % len(words))
            document.append(words[np.asarray(chain)])
        documents.append(document)
    write_shards([chunk_from_token_documents(documents)], tokenizer, root / "shards")
    return root / "shards"


def run(name: str, options: dict, root: Path, shards: Path, tokenizer) -> list[float]:
    options = dict(options)
    overrides = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    overrides.update(options.pop("cfg", {}))
    config = BertConfig.from_preset("tiny", vocab_size=tokenizer.vocab_size, **overrides)
    objective = options.pop("objective", "mlm+nsp")
    torch.manual_seed(0)
    model = (BertForPreTraining if objective == "mlm+nsp" else BertForMaskedLM)(config)
    positions = model.bert.embeddings.position_embeddings
    if "pos" in options:
        sinusoidal_positions_(positions, options.pop("pos"))
    if "mimetic" in options:
        qk, vo = options.pop("mimetic")
        for layer in model.bert.encoder.layer:
            mimetic_attention_(layer, qk, vo)
    if options.pop("local", False):
        local_attention_(model)
    if "posstd" in options:
        torch.nn.init.normal_(positions.weight, 0.0, options.pop("posstd"))
    shutil.rmtree(root / name, ignore_errors=True)
    settings = dict(
        config=config,
        max_steps=300,
        batch_size=64,
        eval_data=shards,
        eval_batches=5,
        learning_rate=1e-3,
        warmup_steps=20,
        log_every=20,
        eval_every=50,
        progress=False,
        model=model,
        objective=objective,
    )
    settings.update(options)
    entries = run_pretraining(shards, root / name, **settings)
    return [e["mlm_accuracy"] for e in entries if e["split"] == "eval"]


def main() -> None:
    parser = arguments(__doc__, out="runs/chain")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = synthetic_tokenizer()
    shards = corpus(args.out, tokenizer)
    for name in args.variants:
        accuracies = run(name, VARIANTS[name], args.out, shards, tokenizer)
        steps = " ".join(f"{100 * a:5.1f}" for a in accuracies)
        print(f"{name:14s} held-out accuracy (%) at steps 50..300: {steps}", flush=True)


if __name__ == "__main__":
    main()
