"""SQuAD v1.1 dev as a retrieval benchmark in BEIR's layout: every paragraph a document (its
article's title beside it), the first question asked of each paragraph a query, judged
relevant to that paragraph alone. What `bertkit evaluate --retrieval` scores dense, full-text,
hybrid and late-interaction retrieval on (docs/results/retrieval).

    BERTKIT_DATA=../shared/data python benchmarks/squad_as_beir.py runs/squad-beir
    bertkit evaluate --retrieval --model sentence-transformers/all-MiniLM-L6-v2 \\
        --data runs/squad-beir --full-text --out runs/squad-hybrid
"""

from __future__ import annotations

import json
from pathlib import Path

from _args import DATA, arguments


def write(out: Path, limit: int | None = None) -> tuple[int, int]:
    """The folder (corpus.jsonl, queries.jsonl, qrels/test.tsv); returns (documents, queries)."""
    data = DATA
    articles = json.loads((data / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))["data"]
    paragraphs = [(a["title"].replace("_", " "), p) for a in articles for p in a["paragraphs"]]
    paragraphs = paragraphs[:limit]
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    with (out / "corpus.jsonl").open("w", encoding="utf-8") as corpus, \
            (out / "queries.jsonl").open("w", encoding="utf-8") as queries:  # fmt: skip
        qrels = ["query-id\tcorpus-id\tscore"]
        for n, (title, paragraph) in enumerate(paragraphs):
            corpus.write(json.dumps({"_id": f"p{n}", "title": title,
                                     "text": paragraph["context"]}) + "\n")  # fmt: skip
            question = paragraph["qas"][0]
            queries.write(json.dumps({"_id": question["id"], "text": question["question"]}) + "\n")
            qrels.append(f"{question['id']}\tp{n}\t1")
    (out / "qrels" / "test.tsv").write_text("\n".join(qrels) + "\n", encoding="utf-8")
    return len(paragraphs), len(paragraphs)


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("out", type=Path, help="the folder to write")
    parser.add_argument("--limit", type=int, help="the first N paragraphs only")
    args = parser.parse_args()
    documents, queries = write(args.out, args.limit)
    print(f"wrote {args.out}: {documents:,} documents, {queries:,} queries")


if __name__ == "__main__":
    main()
