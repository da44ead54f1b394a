"""What the benchmarks share: the alternated rounds, medians and ratios of an A/B; the arguments
every timing takes (--rounds, --threads) and the line naming the machine; transformers' classes
loaded with bertkit's weights (the reference of the parity and speed comparisons).

Benchmarks import it as a sibling module (`python benchmarks/NAME.py` puts benchmarks/ first on
the import path); nothing here is imported by bertkit or the tests.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
from machine import line as machine_line

from bertkit import BertConfig, BertTokenizer
from bertkit.core.heads import gather_positions


# --------------------------------------------------------------------------- timing
def add_timing_arguments(parser: argparse.ArgumentParser, rounds: int, threads: int | None) -> None:
    """--rounds (alternated rounds, each timing every variant) and --threads (torch's; None:
    torch's default)."""
    parser.add_argument("--rounds", type=int, default=rounds, help="alternated rounds")
    parser.add_argument("--threads", type=int, default=threads, help="torch threads")


def start(args: argparse.Namespace) -> str:
    """Set torch's threads from --threads and return the machine's line (CPU model, its vector
    extensions, threads, torch), to print beside every figure."""
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    return machine_line()


def gemm_peak(size: int = 2048, repeats: int = 5) -> float:
    """GFLOP/s of this machine's fastest fp32 matrix product at torch's threads: the best of
    `repeats` products of two (size x size) matrices (what a step's FLOP rate is held against)."""
    return products_rate([(size, size, size, 1)], torch.float32, repeats)


def products_rate(
    shapes: list[tuple[int, int, int, int]],
    dtype: torch.dtype,
    repeats: int = 3,
    backward: bool = False,
) -> float:
    """GFLOP/s of this machine's matrix products at a model's own shapes, in `dtype`: each
    (m, k, n, count) an (m x k) @ (k x n) product a forward runs `count` times, timed by itself
    (best of `repeats`, after a warm-up) and weighted by its count. `backward`: each with the
    two products of its backward too (the input's and the weight's gradient)."""
    flops = seconds = 0.0
    for m, k, n, count in shapes:
        pairs = [((m, k), (k, n))]
        if backward:
            pairs += [((m, n), (n, k)), ((k, m), (m, n))]
        for a_shape, b_shape in pairs:
            a, b = torch.randn(a_shape, dtype=dtype), torch.randn(b_shape, dtype=dtype)
            torch.mm(a, b)  # warm-up
            best = min(_timed(lambda a=a, b=b: torch.mm(a, b)) for _ in range(repeats))
            flops, seconds = flops + count * 2 * m * k * n, seconds + count * best
    return flops / seconds / 1e9


def _timed(run: Callable[[], Any]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def alternate(
    runners: dict[str, Callable[[], Any]], rounds: int, calls: int = 1, each: bool = False
) -> dict[str, list[float]]:
    """Seconds a call of each runner takes: `rounds` rounds, each running every runner `calls`
    times in turn, so a machine whose speed drifts slows every variant alike. One figure per
    round (the mean of its calls), or with `each` one per call (for percentiles). A runner that
    returns a number returns the seconds it measured itself (leaving out set-up inside it)."""
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name, run in runners.items():
            spent = []
            for _ in range(calls):
                started = time.perf_counter()
                own = run()
                spent.append(
                    own if isinstance(own, (int, float)) else time.perf_counter() - started
                )
            times[name].extend(spent) if each else times[name].append(sum(spent) / calls)
    return times


def emit(report: dict, out) -> None:
    """Print a benchmark's figures as JSON and, where `out` (a path) is given, write them
    there."""
    import json

    print(json.dumps(report, indent=1))
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1) + "\n")


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in times.items()}


def ratios(times: dict[str, list[float]], reference: str) -> dict[str, float]:
    """How many times faster than `reference` each runner is, by medians (above 1: faster)."""
    middle = medians(times)
    return {name: middle[reference] / value for name, value in middle.items()}


# --------------------------------------------------------------------------- transformers
def transformers_config(config: BertConfig):
    """transformers' BertConfig with the same fields as ours."""
    import transformers

    fields = config.to_dict()
    fields.pop("model_type", None)
    return transformers.BertConfig(**fields)


class TransformersHead(torch.nn.Module):
    """transformers' head class of the same name as `ours`, loaded with its weights."""

    def __init__(self, ours) -> None:
        super().__init__()
        import transformers

        self.hf = getattr(transformers, type(ours).__name__)(transformers_config(ours.config))
        missing, unexpected = self.hf.load_state_dict(ours.state_dict(), strict=False)
        assert not missing and not unexpected, (missing, unexpected)
        self.config = ours.config

    def forward(self, **inputs):
        return self.hf(**inputs)

    def save_pretrained(self, directory, tokenizer=None) -> None:
        self.hf.save_pretrained(directory)
        if tokenizer is not None:
            tokenizer.save_pretrained(directory)


class TransformersPreTraining(torch.nn.Module):
    """transformers' BertForPreTraining behind bertkit's pre-training interface."""

    def __init__(self, hf_model, tokenizer) -> None:
        super().__init__()
        self.hf, self.tokenizer = hf_model, tokenizer

    def forward(self, input_ids, token_type_ids, attention_mask, masked_positions):
        out = self.hf(
            input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask
        )
        return SimpleNamespace(
            mlm_logits=gather_positions(out.prediction_logits, masked_positions),
            nsp_logits=out.seq_relationship_logits,
        )

    def save_pretrained(self, directory, tokenizer=None) -> None:
        self.hf.save_pretrained(directory)
        (tokenizer or self.tokenizer).save_pretrained(directory)


def transformers_copy(config: BertConfig, state_dict: dict, tokenizer) -> TransformersPreTraining:
    """transformers' BertForPreTraining with these weights, behind bertkit's interface."""
    import transformers

    hf = transformers.BertForPreTraining(transformers_config(config))
    missing, _ = hf.load_state_dict(state_dict, strict=False)
    assert not [m for m in missing if "decoder" not in m], missing
    hf.tie_weights()
    return TransformersPreTraining(hf, tokenizer)


# --------------------------------------------------------------------------- data
def synthetic_tokenizer(words: int = 400, pieces: int = 60) -> BertTokenizer:
    """A vocabulary of `words` words w0, w1, ... and `pieces` continuations ##p0, ...: for
    synthetic corpora whose statistics a benchmark controls."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"[unused{i}]" for i in range(5)]
    vocab += [f"w{i}" for i in range(words)] + [f"##p{i}" for i in range(pieces)]
    return BertTokenizer(vocab=vocab, lowercase=True)
