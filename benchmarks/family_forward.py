"""Each family's encoder forward, bertkit against transformers, side by side in one run.

    BERTKIT_DATA=../shared/data python benchmarks/family_forward.py --rounds 5 \
        --out docs/results/family/forward.json

For every family bertkit reads (BERT, RoBERTa, XLM-RoBERTa, MPNet, ELECTRA, DistilBERT, ModernBERT):
a model of its base size (L12 H768 A12; DistilBERT's 6 layers; XLM-R's 250k vocabulary;
ModernBERT-base's 22 layers and intermediate 1152) with random weights
made by transformers and saved as it saves them, then loaded by both. The inputs are batches of
32 with the lengths of SST-2's first training sentences (WordPiece pieces of the uncased BERT
vocabulary, random ids of each model's vocabulary: the cost depends on the lengths, not the
words), the same ids and masks on both sides. bertkit: `BertModel` in inference mode at its
default precision (`auto`: bf16 where the CPU runs it natively, else fp32), unpadded;
transformers: `AutoModel` (sdpa attention) in fp32, and under bf16 autocast where the CPU runs
bf16 natively. Alternated rounds, medians; printed per family: milliseconds per batch of 32 and
bertkit's ratio to transformers at the precision `auto` chooses, with the machine's line.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
from _args import arguments, minilm
from _harness import add_timing_arguments, alternate, emit, medians, start
from embedder_vs_st import sentences

BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
SMALL = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256)


def reference_models(small: bool = False):
    """(family, transformers model) pairs at base size (`small`: 2 layers of H128 A4, ModernBERT
    3 with a 16-piece window), random weights."""
    import transformers as T

    base = SMALL if small else BASE
    yield "bert", T.BertModel(T.BertConfig(**base))
    yield "roberta", T.RobertaModel(T.RobertaConfig(**base, vocab_size=50265,
                                                    max_position_embeddings=514, type_vocab_size=1))  # fmt: skip
    yield "xlm-roberta", T.XLMRobertaModel(T.XLMRobertaConfig(**base, vocab_size=250002,
                                                              max_position_embeddings=514,
                                                              type_vocab_size=1))  # fmt: skip
    yield "mpnet", T.MPNetModel(T.MPNetConfig(**base, vocab_size=30527))
    yield "electra", T.ElectraModel(T.ElectraConfig(**base, embedding_size=base["hidden_size"]))
    yield "distilbert", T.DistilBertModel(
        T.DistilBertConfig(dim=128, n_layers=2, n_heads=4, hidden_dim=256) if small
        else T.DistilBertConfig()
    )  # fmt: skip
    modern = (dict(hidden_size=128, intermediate_size=192, num_hidden_layers=3,
                   num_attention_heads=4, local_attention=16) if small else
              dict(hidden_size=768, intermediate_size=1152, num_hidden_layers=22,
                   num_attention_heads=12))  # fmt: skip
    yield "modernbert", T.ModernBertModel(T.ModernBertConfig(
        vocab_size=50368, **modern, pad_token_id=50283, bos_token_id=50281, eos_token_id=50282,
        cls_token_id=50281, sep_token_id=50282))  # fmt: skip


def batches(count: int, batch_size: int, vocab: int, seed: int = 0):
    """`count` batches of SST-2's sentence lengths (with two special tokens), random ids."""

    from bertkit import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(minilm())
    lengths = [len(ids) + 2 for ids in tokenizer.encode_ids(sentences(count * batch_size))]
    generator = torch.Generator().manual_seed(seed)
    out = []
    for first in range(0, len(lengths), batch_size):
        chunk = lengths[first : first + batch_size]
        ids = torch.randint(5, vocab, (len(chunk), max(chunk)), generator=generator)
        mask = torch.zeros_like(ids)
        for row, length in enumerate(chunk):
            mask[row, :length] = 1
        out.append((ids, mask))
    return out


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--families", nargs="+", help="only these (default: all)")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON (a file that "
                        "holds other families' figures keeps them)")  # fmt: skip
    add_timing_arguments(parser, rounds=5, threads=None)
    args = parser.parse_args()
    machine = start(args)
    from bertkit.core.model import BertModel
    from bertkit.precision import cast_for_inference, resolve_precision

    report: dict = {"machine": machine, "batch_size": args.batch_size, "families": {}}
    if args.out and args.out.exists() and args.families:  # add to the figures already there
        report["families"] = json.loads(args.out.read_text())["families"]
    for family, reference in reference_models():
        if args.families and family not in args.families:
            continue
        folder = Path(tempfile.mkdtemp(prefix=f"bertkit-{family}-"))
        reference.eval().save_pretrained(folder)
        ours = BertModel.from_pretrained(folder).eval()
        precision = resolve_precision("auto", torch.device("cpu"))
        cast_for_inference(ours, precision)
        inputs = batches(args.batches, args.batch_size, reference.config.vocab_size)
        segments = family in ("bert", "electra")

        def bertkit(model=ours, inputs=inputs, precision=precision) -> None:
            dtype = precision.dtype
            with (
                torch.inference_mode(),
                torch.autocast("cpu", dtype=dtype, enabled=dtype is not None),
            ):
                for ids, mask in inputs:
                    model(ids, None, mask, unpad=True)

        def transformers(model=reference, inputs=inputs, bf16=False, segments=segments) -> None:
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                for ids, mask in inputs:
                    extra = {"token_type_ids": torch.zeros_like(ids)} if segments else {}
                    model(input_ids=ids, attention_mask=mask, **extra)

        sides = {f"bertkit ({precision.name})": bertkit, "transformers (fp32)": transformers}
        if precision.name == "bf16":
            sides["transformers (bf16 autocast)"] = lambda: transformers(bf16=True)
        baseline = (
            "transformers (bf16 autocast)" if precision.name == "bf16" else "transformers (fp32)"
        )
        for run in sides.values():  # warm-up
            run()
        times = alternate(sides, args.rounds)
        middle = medians(times)
        per_batch = {name: 1000 * value / len(inputs) for name, value in middle.items()}
        ratio = middle[baseline] / middle[f"bertkit ({precision.name})"]
        report["families"][family] = {"ms_per_batch": per_batch, "ratio": ratio,
                                      "against": baseline, "rounds_seconds": times}  # fmt: skip
        print(f"{family}: " + ", ".join(f"{n} {v:.0f} ms" for n, v in per_batch.items())
              + f"; bertkit ÷ {baseline} = {ratio:.2f}x", flush=True)  # fmt: skip
        del ours, reference
    emit(report, args.out)


if __name__ == "__main__":
    main()
