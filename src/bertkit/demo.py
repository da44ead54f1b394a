"""`bertkit demo`: the main job on an embedded default corpus, offline, in a minute or two.

The default corpus is the docstrings of the Python standard library installed with the running
interpreter, read with `ast` (never by importing a module), so every Python installation has it.
"""

from __future__ import annotations

import ast
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import torch


def docstring_documents(
    roots: list[Path] | None = None, max_files: int | None = None
) -> Iterator[list[str]]:
    """Documents of paragraphs: one per Python source file, one paragraph per docstring
    (module, class, function), whitespace-normalised. Files that do not parse are skipped."""
    if roots is None:
        roots = [Path(sysconfig.get_paths()["stdlib"])]
    count = 0
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if "test" in path.parts or "tests" in path.parts or "site-packages" in path.parts:
                continue
            try:
                tree = ast.parse(path.read_bytes(), filename=str(path))
            except (SyntaxError, ValueError, OSError, UnicodeDecodeError):
                continue
            paragraphs = []
            for node in ast.walk(tree):
                if isinstance(
                    node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
                ):
                    doc = ast.get_docstring(node, clean=True)
                    if doc:
                        paragraphs.extend(
                            " ".join(block.split()) for block in doc.split("\n\n") if block.strip()
                        )
            if paragraphs:
                yield paragraphs
                count += 1
                if max_files is not None and count >= max_files:
                    return


def write_docstring_corpus(path: Path, holdout_every: int = 20) -> tuple[Path, Path, int]:
    """The default corpus in Google's format (a sentence per line, a blank line between
    documents), one document in `holdout_every` kept apart for evaluation."""
    from bertkit.pretraining.corpus import split_sentences

    path.mkdir(parents=True, exist_ok=True)
    train, held_out = path / "train.txt", path / "eval.txt"
    count = 0
    with open(train, "w", encoding="utf-8") as a, open(held_out, "w", encoding="utf-8") as b:
        for number, paragraphs in enumerate(docstring_documents()):
            sentences = [s for p in paragraphs for s in split_sentences(p)]
            (b if number % holdout_every == 0 else a).write("\n".join(sentences) + "\n\n")
            count += 1
    return train, held_out, count


def run_demo(
    out_dir: str | Path = "runs/demo",
    *,
    corpus: list[str] | None = None,
    max_steps: int = 600,
    batch_size: int = 32,
    learning_rate: float = 1e-3,
) -> Path:
    """Pre-train a BERT-tiny from scratch on the default corpus (or `corpus` files) and show what
    it learnt: vocabulary -> shards -> MLM + NSP pre-training -> fill-mask. About 2 minutes on 2
    CPU cores."""
    from bertkit import BertForPreTraining, BertTokenizer, train_vocab
    from bertkit.pretraining.shards import prepare_shards
    from bertkit.pretraining.train import run_pretraining

    out_dir = Path(out_dir)
    started = time.perf_counter()
    work = out_dir / "data"
    if corpus:
        train_files, eval_files = [Path(c) for c in corpus], [Path(c) for c in corpus]
        source = ", ".join(corpus)
    else:
        train_file, eval_file, count = write_docstring_corpus(work / "corpus")
        train_files, eval_files = [train_file], [eval_file]
        source = f"docstrings of {count:,} modules of the Python {sys.version.split()[0]} standard library"
    size = sum(f.stat().st_size for f in train_files) / 1e6
    print(f"1. corpus: {source} ({size:.1f} MB)")

    tokenizer = train_vocab(
        train_files, vocab_size=8000, out_dir=work / "vocab", show_progress=False
    )
    print(
        f"2. vocabulary: {tokenizer.vocab_size:,} WordPiece tokens, e.g. "
        f"{tokenizer.tokenize('Return the hexadecimal representation of an integer.')}"
    )

    fmt = "google" if not corpus else "auto"
    train_meta = prepare_shards(
        train_files, tokenizer, work / "train", format=fmt, overwrite=True, progress=False
    )
    prepare_shards(eval_files, tokenizer, work / "eval", format=fmt, overwrite=True, progress=False)
    print(
        f"3. shards: {train_meta['num_documents']:,} documents, {train_meta['num_sentences']:,} "
        f"sentences, {train_meta['num_tokens']:,} tokens"
    )

    print(
        f"4. pre-training BERT-tiny (L=2, H=128, A=2) with MLM + NSP, {max_steps} steps of "
        f"{batch_size} sequences of up to 128 tokens:"
    )
    entries = run_pretraining(
        work / "train",
        out_dir,
        config="tiny",
        max_steps=max_steps,
        batch_size=batch_size,
        seq_len=128,
        eval_data=work / "eval",
        eval_batches=10,
        learning_rate=learning_rate,
        warmup_steps=max_steps // 10,
        log_every=50,
        eval_every=max_steps // 6,
        save_every=max_steps,
        resume=(out_dir / "trainer_state.pt").exists(),
        progress=False,
    )
    print(f"   {'step':>6} {'held-out MLM loss':>18} {'MLM accuracy':>13} {'NSP accuracy':>13}")
    for entry in entries:
        if entry.get("split") == "eval":
            print(
                f"   {entry['step']:>6} {entry['mlm_loss']:>18.3f} {entry['mlm_accuracy']:>13.1%} "
                f"{entry['nsp_accuracy']:>13.1%}"
            )

    model = BertForPreTraining.from_pretrained(out_dir)
    tokenizer = BertTokenizer.from_pretrained(out_dir)
    print("5. fill-mask with the pre-trained model (top 5 for each [MASK]):")
    for sentence in (
        "Return the [MASK] of the list.",
        "Raise a [MASK] if the argument is not a string.",
        "This module provides functions for working with [MASK] files.",
        "If the [MASK] is None, the default value is used.",
    ):
        print(f"   {sentence}")
        for guesses in fill_mask(model, tokenizer, sentence):
            print(f"      -> {', '.join(guesses)}")
    print(
        f"6. saved to {out_dir} (config.json, model.safetensors, vocab.txt, log.jsonl); "
        f"{time.perf_counter() - started:.0f} s in all"
    )
    return out_dir


def fill_mask(model, tokenizer, text: str, top: int = 5) -> list[list[str]]:
    """The `top` most likely tokens at each [MASK] of `text`."""
    encoded = tokenizer(text, return_tensors="pt")
    positions = (encoded["input_ids"][0] == tokenizer.mask_token_id).nonzero().view(1, -1)
    with torch.no_grad():
        logits = model(**encoded, masked_positions=positions).mlm_logits[0]  # (P, V)
    return [tokenizer.convert_ids_to_tokens(row.topk(top).indices.tolist()) for row in logits]
