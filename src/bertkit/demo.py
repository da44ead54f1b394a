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


def run_demo(out_dir: str | Path = "runs/demo", *, corpus: list[str] | None = None) -> Path:
    """Train a WordPiece vocabulary, encode text, run and save a tiny BERT, reload it, compare."""
    from bertkit import BertConfig, BertForPreTraining, BertTokenizer, train_vocab

    out_dir = Path(out_dir)
    torch.manual_seed(0)
    started = time.perf_counter()
    if corpus:
        texts = []
        for file in corpus:
            texts.extend(
                line.strip() for line in Path(file).read_text(encoding="utf-8").splitlines()
            )
        texts = [t for t in texts if t]
        source = ", ".join(corpus)
    else:
        texts = [p for doc in docstring_documents() for p in doc]
        source = f"docstrings of the Python {sys.version.split()[0]} standard library"
    print(f"corpus: {source}: {len(texts):,} paragraphs, {sum(map(len, texts)) / 1e6:.1f} MB")

    tokenizer = train_vocab(
        texts=texts, vocab_size=8000, lowercase=True, out_dir=out_dir, show_progress=False
    )
    print(f"vocabulary: {tokenizer.vocab_size:,} WordPiece tokens -> {out_dir / 'vocab.txt'}")

    sentence = "Return the number of items in a container."
    pair = "Raise ValueError if the argument is not a string."
    encoded = tokenizer(sentence, pair, return_offsets=True)
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"])
    print("\n[CLS] A [SEP] B [SEP] with segment ids and character offsets:")
    for token, segment, (start, end) in zip(
        tokens, encoded["token_type_ids"], encoded["offset_mapping"], strict=True
    ):
        text = (sentence if segment == 0 else pair)[start:end] if end > start else ""
        print(f"  {token:>14}  segment {segment}  {text!r}")

    config = BertConfig.from_preset("tiny", vocab_size=tokenizer.vocab_size)
    model = BertForPreTraining(config).eval()
    print(
        f"\nmodel: BERT-tiny (L={config.num_hidden_layers}, H={config.hidden_size}, "
        f"A={config.num_attention_heads}), {model.num_parameters / 1e6:.2f}M parameters"
    )
    batch = tokenizer(texts[:64], max_length=128, padding=True, return_tensors="pt")
    with torch.no_grad():
        model(**batch)  # warm-up: the first call pays for kernel selection
        tick = time.perf_counter()
        out = model(**batch)
        elapsed = time.perf_counter() - tick
    real_tokens = int(batch["attention_mask"].sum())
    print(
        f"forward on {tuple(batch['input_ids'].shape)}: mlm_logits {tuple(out.mlm_logits.shape)}, "
        f"nsp_logits {tuple(out.nsp_logits.shape)}, {real_tokens / elapsed:,.0f} real tokens/s"
    )

    model.save_pretrained(out_dir, tokenizer=tokenizer)
    reloaded = BertForPreTraining.from_pretrained(out_dir)
    reloaded_tokenizer = BertTokenizer.from_pretrained(out_dir)
    assert (
        reloaded_tokenizer(texts[:64], max_length=128, padding=True)["input_ids"]
        == batch["input_ids"].tolist()
    )
    with torch.no_grad():
        difference = (reloaded(**batch).mlm_logits - out.mlm_logits).abs().max().item()
    print(f"saved to {out_dir} and reloaded: max |difference| of MLM logits = {difference:.1e}")
    print(f"done in {time.perf_counter() - started:.1f} s")
    return out_dir
