"""SQuAD v1.1 and v2.0: span extraction with the paper's start and end vectors.

Reading: the official JSON (`data` → articles → `paragraphs` → `context`, `qas` → `id`,
`question`, `answers` [`text`, `answer_start`], v2.0 `is_impossible`). Features: the question
(at most `max_query_length` pieces) and a window of the context, `[CLS] question [SEP] window
[SEP]`; windows of at most `max_seq_length` tokens start every `doc_stride` context pieces, so a
long paragraph gives several. Each context token remembers its character offsets, so answers
come back as slices of the original text, and whether this window gives it the most context
(Google's rule: max of min(left, right) + 0.01 · length) — only there may an answer start.

Answers: the `n_best` best start and end positions of each window, every pair with start <=
end, length <= `max_answer_length`, both in the context; the best sum of logits over the
example's windows wins. v2.0: the null answer scores start+end at [CLS] (the lowest over the
windows); "no answer" when null − best-span exceeds a threshold, chosen on dev as the one that
maximises F1 (the official script's `best_f1_thresh`). Scores are the official scripts'.
"""

from __future__ import annotations

import collections
import copy
import json
import logging
import math
import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertkit._io import atomic_path
from bertkit.core.losses import PAD_LOGIT, span_loss
from bertkit.rows import json_records
from bertkit.tasks import metrics
from bertkit.tasks.base import DataError, Feature, Task, read_text, require_file, run_model

logger = logging.getLogger("bertkit")


@dataclass(frozen=True)
class SquadExample:
    qid: str
    question: str
    context: str
    answers: tuple[tuple[str, int], ...]  # (text, character start); () when unanswerable
    is_impossible: bool = False
    title: str = ""


def squad_layout(path: Path, encoding: str) -> bool:
    """Whether a JSON file is SQuAD's `{"data": [articles with "paragraphs"]}`."""
    for _, item in json_records(path, encoding):
        return isinstance(item, dict) and "paragraphs" in item
    return False


def read_squad(path: str | os.PathLike, require_answers: bool = True) -> list[SquadExample]:
    """Questions of an official SQuAD JSON file (v1.1 or v2.0); with `require_answers=False`
    a question without answers (and not marked impossible) is taken unlabelled."""
    path = Path(path)
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as err:
        raise DataError(
            path, err.lineno, f"not valid JSON: {err.msg} (column {err.colno})"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise DataError(path, None, 'expected an object with a "data" list of articles')
    examples = []
    seen: dict[str, str] = {}  # question id -> where it is
    for a, article in enumerate(data["data"]):
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs", []), list):
            raise DataError(
                path, None, f'data[{a}]: not an article object with a "paragraphs" list'
            )
        for p, paragraph in enumerate(article.get("paragraphs", [])):
            where = f"data[{a}].paragraphs[{p}]"
            if not isinstance(paragraph, dict):
                raise DataError(path, None, f"{where}: not an object")
            context = paragraph.get("context")
            if not isinstance(context, str) or not context.strip():
                raise DataError(path, None, f"{where}: no context text")
            questions = paragraph.get("qas", [])
            if not isinstance(questions, list):
                raise DataError(path, None, f"{where}.qas: not a list of questions")
            for q, qa in enumerate(questions):
                at = f"{where}.qas[{q}]"
                qid, question, impossible, answers = _question(path, at, qa, context)
                if qid in seen:  # evaluation keys predictions on the id: one would be lost
                    raise DataError(path, None, f"{at}: id {qid!r} is also the id of {seen[qid]}")
                seen[qid] = at
                if not impossible and not answers and require_answers:
                    raise DataError(path, None, f"{at} ({qid}): no answers")
                examples.append(
                    SquadExample(
                        qid,
                        question,
                        context,
                        () if impossible else answers,
                        impossible,
                        article.get("title", ""),
                    )
                )
    if not examples:
        raise DataError(path, None, "no questions")
    return examples


def _question(path: Path, at: str, qa: Any, context: str) -> tuple[str, str, bool, tuple]:
    """(id, question, is_impossible, answers) of one entry of a paragraph's "qas", checked
    field by field, each fault named by its JSON path."""
    if not isinstance(qa, dict):
        raise DataError(path, None, f"{at}: not an object (a {_json_kind(qa)})")
    for key in ("id", "question", "answers"):
        if key not in qa:
            raise DataError(path, None, f"{at}: no {key!r}")
    qid, question, answers = qa["id"], qa["question"], qa["answers"]
    if not isinstance(qid, (str, int)) or isinstance(qid, bool) or str(qid) == "":
        raise DataError(path, None, f"{at}.id: not a text or number ({qid!r})")
    qid = str(qid)
    if not isinstance(question, str) or not question.strip():
        raise DataError(path, None, f"{at} ({qid}).question: empty" if isinstance(question, str)
                        else f"{at} ({qid}).question: a {_json_kind(question)}, not a text")  # fmt: skip
    impossible = qa.get("is_impossible", False)
    if not isinstance(impossible, bool):
        raise DataError(path, None, f"{at} ({qid}).is_impossible: {impossible!r}, not true/false")
    if not isinstance(answers, list):
        raise DataError(path, None, f"{at} ({qid}).answers: a {_json_kind(answers)}, not a list")
    found = []
    for n, answer in enumerate(answers):
        where = f"{at} ({qid}).answers[{n}]"
        if not isinstance(answer, dict) or "text" not in answer or "answer_start" not in answer:
            raise DataError(path, None, f'{where}: not an object with "text" and "answer_start"')
        text, start = answer["text"], answer["answer_start"]
        if not isinstance(text, str) or not text.strip():
            raise DataError(path, None, f"{where}.text: empty" if isinstance(text, str)
                            else f"{where}.text: a {_json_kind(text)}, not a text")  # fmt: skip
        if isinstance(start, bool) or not isinstance(start, int):
            raise DataError(path, None, f"{where}.answer_start: {start!r} (a {_json_kind(start)}), "
                            "not a whole number of characters")  # fmt: skip
        if start < 0 or context[start : start + len(text)] != text:
            raise DataError(path, None, f"{where}: {text!r} is not at character {start} of "
                            "the context")  # fmt: skip
        found.append((text, start))
    return qid, question, impossible, tuple(found)


def _json_kind(value: Any) -> str:
    """What a JSON value is, in JSON's words."""
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "number with a decimal point" if isinstance(value, float) else "number"
    return {str: "string", list: "list", dict: "object", type(None): "null"}.get(
        type(value), "value"
    )


def to_dataset(examples: Sequence[SquadExample]) -> list[dict]:
    """The official JSON's `data` list for these examples (what the evaluation scripts read)."""
    articles: dict[str, dict[str, list]] = collections.OrderedDict()
    for e in examples:
        paragraphs = articles.setdefault(e.title, collections.OrderedDict())
        qa: dict[str, Any] = {
            "id": e.qid,
            "question": e.question,
            "answers": [{"text": t, "answer_start": s} for t, s in e.answers],
        }
        if e.is_impossible:
            qa["is_impossible"] = True
        paragraphs.setdefault(e.context, []).append(qa)
    return [
        {"title": title, "paragraphs": [{"context": c, "qas": q} for c, q in paragraphs.items()]}
        for title, paragraphs in articles.items()
    ]


def split_by_article(path: str | os.PathLike, out_dir: str | os.PathLike, version: str = "1.1"):
    """Two disjoint halves of a SQuAD file by article (the first half of the articles to
    `train-v{version}.json`, the rest to `dev-v{version}.json`): a train/dev pair when only the
    official dev file is at hand."""
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    articles = data["data"]
    half = len(articles) // 2
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, part in (("train", articles[:half]), ("dev", articles[half:])):
        target = out_dir / f"{name}-v{version}.json"
        with atomic_path(target) as tmp:
            tmp.write_text(json.dumps({"version": version, "data": part}))
        written.append(target)
    return written


def with_unanswerable(
    dataset: list[dict], fraction: float = 0.33, seed: int = 0, prefix: str = "noans"
) -> list[dict]:
    """A v2.0-style dataset: besides every original question, a `fraction` of them asked again
    of a paragraph from another article, marked `is_impossible` (the question's answer is not
    there, which is what SQuAD 2.0's unanswerable questions are)."""
    rng = random.Random(seed)
    out = json.loads(json.dumps(dataset))
    if len(out) < 2:
        raise ValueError("need at least two articles to borrow paragraphs from")
    for article in out:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                qa["is_impossible"] = False
    for a, article in enumerate(dataset):
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                if rng.random() >= fraction:
                    continue
                other = rng.choice([i for i in range(len(out)) if i != a])
                target = rng.choice(out[other]["paragraphs"])
                target["qas"].append(
                    {
                        "id": f"{prefix}-{qa['id']}",
                        "question": qa["question"],
                        "answers": [],
                        "is_impossible": True,
                    }
                )
    return out


class SquadTask(Task):
    head = "BertForQuestionAnswering"
    default_max_seq_length = 384
    doc_stride = 128
    max_query_length = 64
    n_best = 20
    max_answer_length = 30

    def __init__(self, version: int) -> None:
        if version not in (1, 2):
            raise ValueError(f"SQuAD version must be 1 or 2, got {version}")
        self.version = version
        self.name = f"squad{version}"
        self.files = {1: "v1.1", 2: "v2.0"}[version]
        self.metrics = ("exact_match", "f1")
        if version == 2:
            self.default_epochs, self.default_batch_size = 2, 48  # the paper's SQuAD 2.0 values
        self.null_threshold = 0.0

    def read(self, data_dir, split: str) -> list[SquadExample]:
        if split not in ("train", "dev"):
            raise ValueError(f"{self.name} has no split {split!r}; it has ['dev', 'train']")
        path = Path(data_dir) / f"{split}-{self.files}.json"
        return read_squad(require_file(path, f"SQuAD {self.files}"))

    # ----------------------------------------------------------------- features
    def featurize(self, examples, tokenizer, max_seq_length: int) -> list[Feature]:
        questions = tokenizer.encode_ids([e.question for e in examples])
        contexts: dict[str, tuple[list[int], list[tuple[int, int]]]] = {}
        unique = list(dict.fromkeys(e.context for e in examples))
        encoded = tokenizer(unique, add_special_tokens=False, truncation=False, return_offsets=True)
        for text, ids, offsets in zip(
            unique, encoded["input_ids"], encoded["offset_mapping"], strict=True
        ):
            contexts[text] = (ids, [tuple(o) for o in offsets])
        specials = tokenizer.special_tokens_added(True)  # [CLS] Q [SEP] C [SEP]: 3
        features = []
        for n, example in enumerate(examples):
            question = questions[n][: self.max_query_length]
            ids, offsets = contexts[example.context]
            room = max_seq_length - len(question) - specials
            if room < 1:
                raise ValueError(f"max_seq_length {max_seq_length} leaves no room for a context")
            windows = _windows(len(ids), room, self.doc_stride)
            answer = self._answer_span(example, offsets)
            first = tokenizer.second_start(len(question))  # where the window's pieces start
            for w, (start, length) in enumerate(windows):
                input_ids, types = tokenizer.with_specials(question, ids[start : start + length])
                feature = {
                    "input_ids": input_ids,
                    "token_type_ids": types,
                    "attention_mask": [1] * len(input_ids),
                    "_example": n,
                    "_context_start": first,  # position of the window's first piece
                    "_window_start": start,  # that piece's index in the context
                    "_offsets": offsets[start : start + length],  # characters of each piece
                    "_max_context": [_is_max_context(windows, w, start + i) for i in range(length)],
                }
                if answer is not None:
                    begin, last = answer
                    if start <= begin and last < start + length:
                        feature["start_positions"] = begin - start + first
                        feature["end_positions"] = last - start + first
                    else:  # no answer in this window (or none at all): point at [CLS]
                        feature["start_positions"] = feature["end_positions"] = 0
                features.append(feature)
        return features

    def _answer_span(self, example: SquadExample, offsets) -> tuple[int, int] | None:
        """The (first, last) context pieces of the first gold answer; (−1, −1) when there is
        none; None for unlabelled examples."""
        if example.is_impossible:
            return (-1, -1)
        if not example.answers:
            return None
        text, start = example.answers[0]
        end = start + len(text)
        pieces = [i for i, (s, e) in enumerate(offsets) if s < end and e > start]
        if not pieces:  # an answer of whitespace only; treated as unanswerable
            return (-1, -1)
        return pieces[0], pieces[-1]

    # ----------------------------------------------------------------- training
    def _forward(self, model, batch):
        return run_model(model, batch)

    def loss(self, model, batch):
        out = self._forward(model, batch)
        total = span_loss(
            out.start_logits,
            out.end_logits,
            batch["start_positions"],
            batch["end_positions"],
            batch["attention_mask"],
            reduction="sum",
        )
        return total, torch.tensor(len(out.start_logits))

    def outputs(self, model, batch):
        # Padding is no candidate answer (span_loss leaves it out of the softmax too).
        out = self._forward(model, batch)
        pad = batch["attention_mask"] == 0
        return {
            "start_logits": out.start_logits.float().masked_fill(pad, PAD_LOGIT),
            "end_logits": out.end_logits.float().masked_fill(pad, PAD_LOGIT),
        }

    # ----------------------------------------------------------------- answers
    def candidates(self, examples, features, outputs) -> list[dict[str, Any]]:
        """Per example: the n-best spans (text, score, probability) and the null score."""
        by_example = collections.defaultdict(list)
        for f, feature in enumerate(features):
            by_example[feature["_example"]].append(f)
        results = []
        for n, example in enumerate(examples):
            spans = []
            null = math.inf
            for f in by_example[n]:
                feature = features[f]
                starts = outputs["start_logits"][f]
                ends = outputs["end_logits"][f]
                null = min(null, float(starts[0] + ends[0]))
                spans += self._spans(example, feature, starts, ends)
            spans.sort(key=lambda s: -s["score"])
            kept, seen = [], set()
            for span in spans:
                if span["text"] not in seen:
                    seen.add(span["text"])
                    kept.append(span)
                if len(kept) == self.n_best:
                    break
            if kept:
                scores = np.array([s["score"] for s in kept])
                probs = np.exp(scores - scores.max())
                for span, p in zip(kept, probs / probs.sum(), strict=True):
                    span["probability"] = float(p)
            results.append({"n_best": kept, "null_score": null})
        return results

    def _spans(self, example, feature, starts, ends) -> list[dict[str, Any]]:
        first, count = feature["_context_start"], len(feature["_max_context"])
        context_starts = starts[first : first + count]
        context_ends = ends[first : first + count]
        top_starts = np.argsort(-context_starts, kind="stable")[: self.n_best]
        top_ends = np.argsort(-context_ends, kind="stable")[: self.n_best]
        ids_offsets = feature["_offsets"]
        spans = []
        for s in top_starts:
            if not feature["_max_context"][s]:
                continue
            for e in top_ends:
                if e < s or e - s + 1 > self.max_answer_length:
                    continue
                char_start = ids_offsets[s][0]
                char_end = ids_offsets[e][1]
                spans.append(
                    {
                        "text": example.context[char_start:char_end],
                        "start": int(char_start),
                        "score": float(context_starts[s] + context_ends[e]),
                    }
                )
        return spans

    def predictions(self, examples, features, outputs) -> dict[str, Any]:
        candidates = self.candidates(examples, features, outputs)
        best = {}
        null_odds = {}
        for example, found in zip(examples, candidates, strict=True):
            top = found["n_best"][0] if found["n_best"] else None
            best[example.qid] = top["text"] if top else ""
            null_odds[example.qid] = found["null_score"] - (top["score"] if top else -math.inf)
        return {"best": best, "null_odds": null_odds, "candidates": candidates}

    def answers(self, predictions, threshold: float | None = None) -> dict[str, str]:
        """The official predictions.json: question id -> answer text ("" = no answer, v2.0)."""
        if self.version == 1:
            return dict(predictions["best"])
        threshold = self.null_threshold if threshold is None else threshold
        return {
            qid: "" if predictions["null_odds"][qid] > threshold else text
            for qid, text in predictions["best"].items()
        }

    def score(self, examples, predictions) -> dict[str, float]:
        dataset = to_dataset(examples)
        if self.version == 1:
            return metrics.squad_v1(dataset, predictions["best"])
        # exact/f1 answer "no answer" where null beats the best span (threshold 0); best_* are
        # at the threshold that maximises dev F1 (`dev_settings`: what predictions then use).
        official = metrics.squad_v2(
            dataset, predictions["best"], predictions["null_odds"], threshold=0.0
        )
        return {"exact_match": official.pop("exact"), **official}

    def dev_settings(self, examples, predictions, figures):
        # predictions answer "no answer" where null beats the best span by more than this
        return {"null_threshold": figures["best_f1_thresh"]} if self.version == 2 else {}

    def with_settings(self, settings):
        task = copy.copy(self)
        task.null_threshold = float(settings.get("null_threshold", self.null_threshold))
        return task

    def prediction_file(self, split: str) -> str:
        return "predictions.json" if split == "dev" else f"predictions_{split}.json"

    # ----------------------------------------------------------------- raw inputs
    def file_rows(self, path, kind, options) -> Iterator[tuple[int, dict[str, Any]]] | None:
        """A SQuAD JSON file's questions in order (numbered from 1: the file has no line of
        each), with their gold `answers` (texts; [] where unanswerable) where it has them."""
        if kind != "json" or not squad_layout(path, options.encoding):
            return None
        return (
            (n, {"id": e.qid, "question": e.question, "context": e.context}
             | ({"answers": [t for t, _ in e.answers]} if e.answers or e.is_impossible else {}))
            for n, e in enumerate(read_squad(path, require_answers=False), start=1)
        )  # fmt: skip

    def example_of(self, item: Any, n: int) -> SquadExample:
        """{"question": ..., "context": ...} or (question, context)."""
        if isinstance(item, dict):
            question, context = item.get("question"), item.get("context")
        elif isinstance(item, (list, tuple)) and len(item) == 2:
            question, context = item
        else:
            raise ValueError(f'item {n}: {{"question": ..., "context": ...}} expected')
        if not isinstance(question, str) or not isinstance(context, str) or not context.strip():
            raise ValueError(f"item {n}: a question and a non-empty context expected")
        return SquadExample(str(n), question, context, ())

    def answer(self, examples, features, outputs) -> list[dict[str, Any]]:
        """The answer text with its character `start`/`end` in the context and `score` (the
        span's start+end logits); `no_answer` when the model abstains (SQuAD 2.0)."""
        found = self.predictions(examples, features, outputs)
        answers = self.answers(found)
        results = []
        for example, candidates in zip(examples, found["candidates"], strict=True):
            top = candidates["n_best"][0] if candidates["n_best"] else None
            answer = answers[example.qid]
            results.append(
                {
                    "answer": answer,
                    "start": top["start"] if top and answer else None,
                    "end": top["start"] + len(answer) if top and answer else None,
                    "score": top["score"] if top else None,
                    "no_answer": answer == "",
                    "null_odds": found["null_odds"][example.qid],
                }
            )
        return results

    def items_of(self, texts, question, context) -> list:
        if not (question and context) or texts:
            raise ValueError(f"{self.name} takes --question and --context (or --input FILE.jsonl)")
        return [{"question": question, "context": context}]

    def write_predictions(self, examples, predictions, path: Path) -> Path:
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(self.answers(predictions), indent=1, ensure_ascii=False))
        if self.version == 2:
            odds = path.with_name("null_odds.json")
            with atomic_path(odds) as tmp:
                tmp.write_text(json.dumps(predictions["null_odds"], indent=1))
        nbest = path.with_name("nbest_predictions.json")
        with atomic_path(nbest) as tmp:
            tmp.write_text(
                json.dumps(
                    {
                        e.qid: c["n_best"]
                        for e, c in zip(examples, predictions["candidates"], strict=True)
                    },
                    ensure_ascii=False,
                )
            )
        return path


def _windows(total: int, room: int, stride: int) -> list[tuple[int, int]]:
    """(start, length) of the context windows, Google's way:
    _windows(10, 4, 3) -> [(0, 4), (3, 4), (6, 4)]"""
    windows, start = [], 0
    while True:
        length = min(total - start, room)
        windows.append((start, length))
        if start + length >= total:
            return windows
        start += min(length, stride)


def _is_max_context(windows: list[tuple[int, int]], current: int, position: int) -> bool:
    """Whether window `current` gives the context piece at `position` its most context: the
    largest min(left, right) + 0.01 · window length over the windows holding it."""
    best_score, best = None, None
    for w, (start, length) in enumerate(windows):
        if not start <= position < start + length:
            continue
        score = min(position - start, start + length - 1 - position) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best = score, w
    return best == current
