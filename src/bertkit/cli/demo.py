"""`bertkit demo`: the main job on an embedded default corpus, offline, in a minute or two.

The default corpus is the docstrings of the Python standard library installed with the running
interpreter, read with `ast` (never by importing a module), so every Python installation has it.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from bertkit.pretraining.train import PretrainConfig


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
            paragraphs: list[str] = []
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
    budget_seconds: float | None = 120.0,
    max_steps: int | None = None,
    batch_size: int | None = None,
    learning_rate: float | None = None,
) -> Path:
    """Pre-train a BERT from scratch on the default corpus (or `corpus` files) with the laptop
    recipe and show what it learnt: vocabulary -> shards -> pre-training (the recipe's objective,
    MLM + NSP) -> fill-mask.
    Pre-training lasts `budget_seconds` of training time (or `max_steps` steps, whichever ends
    first); progress is printed as it comes."""
    from bertkit.pretraining.recipes import apply_recipe

    given = {
        "batch_size": batch_size,
        "learning_rate": learning_rate,
        "max_steps": max_steps,
        "budget_seconds": budget_seconds,
        "eval_batches": 10,
        "log_every": 10,
        "save_every": 10**9,  # once, at the end
        "resume": (Path(out_dir) / "trainer_state.pt").exists(),
        "progress": False,
    }
    settings = apply_recipe("laptop", given)
    out_dir = Path(out_dir)
    objective = settings.objective or "mlm+nsp"  # (the recipe's; else a BERT's)
    if settings.resume and not _same_objective(out_dir, objective):
        # an earlier demo's run with another objective (the recipe went without NSP on 2026-11-25-26):
        # a demo is a throwaway, so it starts afresh rather than refusing
        say(f"0. {out_dir} holds an earlier demo with another objective: starting afresh")
        (out_dir / "trainer_state.pt").unlink()
        settings = dataclasses.replace(settings, resume=False)
    started = time.perf_counter()
    work = out_dir / "data"
    _demo_data(work, corpus)
    length = "" if budget_seconds is None else f"{budget_seconds:.0f} s of training"
    if max_steps is not None:
        length += (" or " if length else "") + f"{max_steps} steps"
    _demo_pretraining(work, out_dir, settings, length, max_steps)
    _demo_fill_mask(out_dir)
    say(
        f"6. saved to {out_dir} (config.json, model.safetensors, vocab.txt, log.jsonl, "
        f"curves.png); {time.perf_counter() - started:.0f} s in all"
    )
    return out_dir


def _demo_data(work: Path, corpus: list[str] | None) -> None:
    """Steps 1-3: the corpus, its vocabulary, the training and held-out shards in `work`."""
    from bertkit import train_vocab
    from bertkit.pretraining.shards import prepare_shards

    if corpus:
        train_files, eval_files = [Path(c) for c in corpus], [Path(c) for c in corpus]
        source = ", ".join(corpus)
    else:
        train_file, eval_file, count = write_docstring_corpus(work / "corpus")
        train_files, eval_files = [train_file], [eval_file]
        source = f"docstrings of {count:,} modules of the Python {sys.version.split()[0]} standard library"
    size = sum(f.stat().st_size for f in train_files) / 1e6
    say(f"1. corpus: {source} ({size:.1f} MB)")

    tokenizer = train_vocab(
        train_files, vocab_size=8000, out_dir=work / "vocab", show_progress=False
    )
    say(
        f"2. vocabulary: {tokenizer.vocab_size:,} WordPiece tokens, e.g. "
        f"{tokenizer.tokenize('Return the hexadecimal representation of an integer.')}"
    )

    fmt = "google" if not corpus else "auto"
    train_meta = prepare_shards(
        train_files, tokenizer, work / "train", format=fmt, overwrite=True, progress=False
    )
    prepare_shards(eval_files, tokenizer, work / "eval", format=fmt, overwrite=True, progress=False)
    say(
        f"3. shards: {train_meta['num_documents']:,} documents, {train_meta['num_sentences']:,} "
        f"sentences, {train_meta['num_tokens']:,} tokens"
    )


def _demo_pretraining(
    work: Path, out_dir: Path, settings: PretrainConfig, length: str, max_steps: int | None
) -> None:
    """Step 4: pre-training, its held-out figures printed as they come."""
    from bertkit.pretraining.train import run_pretraining

    nsp = settings.objective in (None, "mlm+nsp")  # (None: a BERT's default)
    objective = "MLM + NSP" if nsp else "masked LM (no NSP)"
    say(
        f"4. pre-training BERT-{settings.config} with {objective} (the laptop recipe: batch "
        f"{settings.batch_size}, peak lr {settings.optim.learning_rate:g}, sequences of "
        f"{settings.seq_len}) for {length}; "
        "held-out figures as they come (MLM accuracy: every chosen piece [MASK]):"
    )
    heading = f"   {'step':>6} {'tokens':>10} {'MLM loss':>9} {'MLM accuracy':>13}"
    say(heading + (f" {'NSP accuracy':>13}" if nsp else ""))

    def report(entry: dict) -> None:
        if entry.get("split") == "eval":
            line = (
                f"   {entry['step']:>6} {entry['tokens']:>10,} {entry['mlm_loss']:>9.3f} "
                f"{entry['mlm_accuracy']:>13.1%}"
            )
            say(line + (f" {entry['nsp_accuracy']:>13.1%}" if nsp else ""))

    every = 100 if max_steps is None else max(1, max_steps // 6)
    run_pretraining(
        work / "train",
        out_dir,
        settings,
        eval_data=str(work / "eval"),
        eval_every=every,
        on_entry=report,
    )


def _demo_fill_mask(out_dir: Path) -> None:
    """Step 5: what the pre-trained model puts at each [MASK] of four sentences."""
    from bertkit.inference.loader import load

    loaded = load(out_dir, head="BertForMaskedLM", device="cpu")
    model, tokenizer = loaded.model, loaded.tokenizer
    say("5. fill-mask with the pre-trained model (top 5 for each [MASK]):")
    for sentence in (
        "Return the [MASK] of the list.",
        "Raise a [MASK] if the argument is not a string.",
        "This module provides functions for working with [MASK] files.",
        "If the [MASK] is None, the default value is used.",
    ):
        say(f"   {sentence}")
        for guesses in fill_mask(model, tokenizer, sentence):
            say(f"      -> {', '.join(guesses)}")


def _same_objective(out_dir: Path, objective: str) -> bool:
    """Whether the run in `out_dir` trained the model `objective` builds."""
    try:
        written = json.loads((out_dir / "config.json").read_text()).get("architectures", [])
    except (OSError, ValueError):
        return True  # no finished checkpoint yet: the state says the rest
    return written == ["BertForPreTraining" if objective == "mlm+nsp" else "BertForMaskedLM"]


def say(text: str) -> None:
    """Print now, even when stdout is a pipe (block-buffered otherwise)."""
    print(text, flush=True)


def fill_mask(model, tokenizer, text: str, top: int = 5) -> list[list[str]]:
    """The `top` most likely tokens at each [MASK] of `text`."""
    encoded = tokenizer(text, return_tensors="pt")
    positions = (encoded["input_ids"][0] == tokenizer.mask_token_id).nonzero().view(1, -1)
    with torch.no_grad():
        logits = model(**encoded, masked_positions=positions).logits[0]  # (P, V)
    return [tokenizer.convert_ids_to_tokens(row.topk(top).indices.tolist()) for row in logits]
