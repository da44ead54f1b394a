"""Inference where users serve BERT on a CPU: a realistic padded batch and single
requests, transformers eager against bertkit eager (padded and unpadded), ONNX Runtime on
transformers' graph, and bertkit's ONNX export in fp32 and int8. All in one process, alternated
round by round, medians; ratios against transformers eager measured in the same run.

    BERTKIT_DATA=../shared/data python benchmarks/serving_throughput.py --models minilm-l6 base

Batch: 32 SQuAD dev contexts (whole, or their first sentence or two) tokenised to at most 128
pieces, padded to the longest (the batch of forward_throughput.py). Single requests: one sentence
of about 20 pieces, one at a time: p50 and p99 latency over `--requests`. ONNX Runtime runs with
torch's thread count and no spinning worker threads (they would slow the PyTorch call that
follows). "ORT on transformers' graph" exports transformers' BertModel with the same exporter
(what optimum does for BERT, without optimum's graph fusions).
"""

from __future__ import annotations

import copy
import functools
import tempfile
from pathlib import Path

import numpy as np
import torch
from _args import arguments
from _harness import add_timing_arguments, alternate, medians, start
from forward_throughput import models, texts_for_benchmark

from bertkit.inference.export import export_onnx
from bertkit.inference.loader import OnnxModel


def export_transformers(model, directory: Path) -> Path:
    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, token_type_ids, attention_mask):
            out = self.model(
                input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask
            )
            return out.last_hidden_state

    shape = (2, 16)
    example = tuple(torch.ones(shape, dtype=torch.long) for _ in range(3))
    axes = {0: "batch", 1: "length"}
    directory.mkdir(parents=True, exist_ok=True)
    import warnings

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Wrapped(),
            example,
            str(directory / "model.onnx"),
            input_names=["input_ids", "token_type_ids", "attention_mask"],
            output_names=["last_hidden_state"],
            dynamic_axes={
                "input_ids": axes,
                "token_type_ids": axes,
                "attention_mask": axes,
                "last_hidden_state": axes,
            },
            opset_version=17,
            dynamo=False,
        )
    return directory


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--models", nargs="+", default=["minilm-l6", "base"])
    parser.add_argument("--requests", type=int, default=200)
    add_timing_arguments(parser, rounds=7, threads=2)
    args = parser.parse_args()
    print(start(args))
    for name in args.models:
        ours, theirs, tokenizer = models(name, "cpu")
        texts = texts_for_benchmark(32)
        batch = tokenizer(texts, max_length=128, truncation=True, padding=True, return_tensors="pt")
        single = tokenizer(
            ["The quick brown fox jumps over the lazy dog near the river bank today."],
            return_tensors="pt",
        )
        real = int(batch["attention_mask"].sum())
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            ours.save_pretrained(tmp / "model", tokenizer=tokenizer)
            export_onnx(tmp / "model", tmp / "fp32")
            export_onnx(tmp / "model", tmp / "int8", quantize="int8")
            # from a copy: tracing leaves transformers' model slower in eager mode afterwards
            # (this script without the copy: 2,048 vs 4,124 real tok/s on MiniLM), which would
            # flatter every other row
            export_transformers(copy.deepcopy(theirs), tmp / "hf")
            runners = {
                "transformers eager": lambda b, m=theirs: m(**b),
                "bertkit eager (padded)": lambda b, m=ours: m(**b),
                "bertkit eager (unpadded)": lambda b, m=ours: m(**b, unpad=True),
                "ORT on transformers' graph": _ort(OnnxModel(tmp / "hf", args.threads)),
                "bertkit ONNX fp32": _ort(OnnxModel(tmp / "fp32", args.threads)),
                "bertkit ONNX int8": _ort(OnnxModel(tmp / "int8", args.threads)),
            }
            with torch.inference_mode():
                for run in runners.values():  # warm-up
                    run(batch), run(single)
                on_batch = {k: functools.partial(run, batch) for k, run in runners.items()}
                batch_times = alternate(on_batch, args.rounds)
                on_single = {k: functools.partial(run, single) for k, run in runners.items()}
                single_times = alternate(on_single, args.requests // 10, calls=10, each=True)
        reference = medians(batch_times)["transformers eager"]
        reference_single = medians(single_times)["transformers eager"]
        print(
            f"\n{name}: batch 32 x {batch['input_ids'].shape[1]} ({real} real tokens), "
            f"{args.threads} threads, {args.rounds} alternated rounds; single requests of "
            f"{single['input_ids'].shape[1]} pieces x {args.requests}"
        )
        print(
            "| runner | batch: real tok/s | × transformers | single: p50 ms | p99 ms | × transformers (p50) |"
        )
        print("|---|---|---|---|---|---|")
        for label in runners:
            median = medians(batch_times)[label]
            p50 = float(np.percentile(single_times[label], 50))
            p99 = float(np.percentile(single_times[label], 99))
            print(
                f"| {label} | {real / median:,.0f} | {reference / median:.2f} | "
                f"{1000 * p50:.2f} | {1000 * p99:.2f} | {reference_single / p50:.2f} |"
            )


def _ort(model: OnnxModel):
    return lambda b: model(**b)


if __name__ == "__main__":
    main()
