"""Models fine-tuned elsewhere: the task of a folder transformers or sentence-transformers saved
(no bertkit task record), read off its `config.json` as text-embeddings-inference, transformers'
`pipeline()` and sentence-transformers' `CrossEncoder` read it.

    head = saved_head("cardiffnlp-sentiment")    # SavedHead(head="BertForSequenceClassification",
                                                 #   labels=("negative", "neutral", "positive"),
                                                 #   problem="single-label", function="softmax")
    task, info = task_of_folder("cardiffnlp-sentiment")

What a folder holds is its `architectures[0]` (the family's class: RobertaForTokenClassification
is bertkit's BertForTokenClassification), its labels (`id2label`, which must agree with
`num_labels`), its `problem_type` and, for a cross-encoder, sentence-transformers' activation
(`config_sentence_transformers.json`'s `activation_fn`, older versions' in config.json). Each
head is a small task on the one encoder:

- a sequence classifier (`SavedClassifier`): a text or a pair; scores as `pipeline("text-
  classification")` gives them (regression: the raw output; one label or multi-label: a
  sigmoid; else a softmax); reranked as `CrossEncoder.predict` scores (its activation: the
  folder's, else a sigmoid for one label);
- a token classifier (`SavedTagger`): raw text, entities as `pipeline("token-classification")`
  groups them under each `aggregation_strategy` (none, simple, first, average, max), with
  character offsets;
- an extractive reader (`SavedReader`): a question and its context by the rule transformers'
  question-answering pipeline answered with (context pieces only, end >= start, at most
  `max_answer_len` pieces, score p(start)·p(end) within a window, long contexts in windows
  overlapping by `doc_stride` pieces; with `handle_impossible_answer`, no answer where the
  [CLS] span scores higher).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertkit._io import read_json
from bertkit.settings import Settings, setting
from bertkit.tasks.base import Feature, Task, head_logits
from bertkit.tasks.labels import LabelSet, sigmoid, softmax
from bertkit.tasks.own import DataConfig
from bertkit.tasks.squad import SquadExample, SquadTask
from bertkit.tasks.text_classification import TextClassificationTask, TextExample

# heads of a saved folder bertkit answers with, by bertkit's class name, and the task each is
TASK_HEADS = {
    "BertForSequenceClassification": "text-classification",
    "BertForTokenClassification": "token-classification",
    "BertForQuestionAnswering": "question-answering",
}
# a bare encoder (or a pre-training head): no task, it embeds (and fills masks)
ENCODER_HEADS = ("BertModel", "BertForMaskedLM", "BertForPreTraining")
AGGREGATIONS = ("none", "simple", "first", "average", "max")
# sentence-transformers' activations by the class path it writes
ACTIVATIONS = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "none",
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.activation.Softmax": "softmax",
}
PROBLEMS = {  # config.json's problem_type -> bertkit's problem
    "single_label_classification": "single-label",
    "multi_label_classification": "multi-label",
    "regression": "regression",
}


@dataclass
class HeadConfig(Settings):
    """How the heads of folders saved by transformers answer where `pipeline()` takes a
    setting (`bertkit predict` and `bertkit serve` flags; `Predictor` takes them by name)."""

    aggregation_strategy: str = setting(
        "simple",
        "a token classifier saved by transformers: its pieces grouped into entities as "
        "pipeline() groups them",
        choices=AGGREGATIONS,
    )
    handle_impossible_answer: bool = setting(
        False,
        'an extractive reader saved by transformers: answer "" where no answer scores higher '
        "than its best span (SQuAD 2.0-style readers)",
    )


@dataclass(frozen=True)
class SavedHead:
    """What a saved folder's config says of its head: bertkit's class (`head`), the class as
    written (`architecture`), the label names in output order, the problem, the function
    `pipeline()` applies to the outputs (softmax, sigmoid, none) and, where the folder is a
    cross-encoder, the activation `CrossEncoder.predict` applies (sentence-transformers')."""

    head: str
    architecture: str
    labels: tuple[str, ...]
    problem: str
    function: str
    activation: str | None = None
    saved_by: str = "transformers"

    @property
    def task(self) -> str:
        return TASK_HEADS[self.head]


def saved_head(path: str | os.PathLike) -> SavedHead | None:
    """The task head of a folder transformers or sentence-transformers saved, from its
    config.json; None where it is an encoder (BertModel, a masked LM, no architectures). A
    head bertkit does not run is refused by name, listing those it does; labels that disagree
    with `num_labels` are refused."""
    from bertkit.core.family import family_of_folder

    folder = Path(path)
    file = folder / "config.json"
    if not file.exists():
        return None
    config = read_json(file, object_only=True)
    architectures = config.get("architectures") or []
    if not architectures:
        return None
    written = str(architectures[0])
    head = family_of_folder(folder).bert_class(written)
    if head in ENCODER_HEADS or head == "BertForSentenceEmbedding":
        return None
    if head not in TASK_HEADS:
        runs = ", ".join(f"*{h.removeprefix('Bert')}" for h in TASK_HEADS)
        raise ValueError(
            f"{file}: architectures names {written}, a head bertkit does not run; it runs "
            f"{runs} (a classifier, a tagger, an extractive reader) and the encoders"
        )
    labels = _labels(file, config, head)
    problem_type = config.get("problem_type")
    if problem_type is not None and problem_type not in PROBLEMS:
        raise ValueError(f"{file}: problem_type {problem_type!r} is not one of {list(PROBLEMS)}")
    problem = PROBLEMS.get(problem_type or "", "")
    # transformers' text-classification pipeline: regression as it is, one label or
    # multi-label a sigmoid, several labels a softmax
    if problem == "regression":
        function = "none"
    elif problem == "multi-label" or len(labels) == 1:
        function, problem = "sigmoid", "multi-label"
    else:
        function, problem = "softmax", "single-label"
    activation, saved_by = _activation(folder, config)
    if head == "BertForSequenceClassification" and activation is None and len(labels) == 1:
        activation = "sigmoid"  # CrossEncoder's default for one label
    return SavedHead(head, written, labels, problem, function, activation, saved_by)


def _labels(file: Path, config: dict[str, Any], head: str) -> tuple[str, ...]:
    """The label names in output order: id2label (keys 0..n-1), checked against num_labels."""
    given = config.get("id2label")
    count = config.get("num_labels", config.get("_num_labels"))
    if not given:
        if head == "BertForQuestionAnswering":
            return ()
        return tuple(f"LABEL_{i}" for i in range(int(count if count is not None else 2)))
    try:
        ids = sorted(int(k) for k in given)
    except (TypeError, ValueError):
        raise ValueError(f"{file}: id2label's keys must be the outputs' numbers 0, 1, ..., "
                         f"not {list(given)[:5]}") from None  # fmt: skip
    if ids != list(range(len(ids))):
        raise ValueError(f"{file}: id2label numbers the outputs {ids[:8]}, not 0..{len(ids) - 1}")
    if count is not None and int(count) != len(ids) and head != "BertForQuestionAnswering":
        raise ValueError(
            f"{file}: num_labels is {count} but id2label names {len(ids)} labels: which is "
            "the classifier's? (the weights hold one; make the two agree)"
        )
    return tuple(str(given[str(i)] if str(i) in given else given[i]) for i in ids)


def _activation(folder: Path, config: dict[str, Any]) -> tuple[str | None, str]:
    """sentence-transformers' cross-encoder activation (by the version that saved it: its own
    config file, config.json's `sentence_transformers`, or the <4 key), and who saved it."""
    path = None
    saved_by = "transformers"
    own = folder / "config_sentence_transformers.json"
    if own.exists():
        data = read_json(own, object_only=True)
        if data.get("model_type") == "CrossEncoder" or "activation_fn" in data:
            path, saved_by = data.get("activation_fn"), "sentence-transformers"
    if path is None and isinstance(config.get("sentence_transformers"), dict):
        path = config["sentence_transformers"].get("activation_fn")
        saved_by = "sentence-transformers"
    if path is None and config.get("sbert_ce_default_activation_function"):
        path, saved_by = config["sbert_ce_default_activation_function"], "sentence-transformers"
    if path is None:
        return None, saved_by
    if path not in ACTIVATIONS:
        raise ValueError(
            f"{folder}: the cross-encoder's activation {path} is not one bertkit applies "
            f"({', '.join(ACTIVATIONS)})"
        )
    return ACTIVATIONS[path], saved_by


def has_task(path: str | os.PathLike) -> bool:
    """Whether a folder answers a task: a bertkit task record, or a saved task head."""
    from bertkit._io import TASK_FILE

    folder = Path(path)
    return (folder / TASK_FILE).exists() or saved_head(folder) is not None


def task_of_folder(path: str | os.PathLike, **options: Any) -> tuple[Task, dict[str, Any]]:
    """The task of a saved folder without a task record, and its task info (as a task record
    would say it: task, head, saved_by). `options`: the tagger's `aggregation_strategy`, the
    reader's `handle_impossible_answer`, `max_answer_len` and `doc_stride`."""
    head = saved_head(path)
    if head is None:
        raise FileNotFoundError(
            f"{path}: no task head (its config.json names an encoder, no classifier, tagger "
            "or reader) and no bertkit task record: it embeds texts; fine-tune it for a task"
        )
    task: Task
    if head.head == "BertForSequenceClassification":
        task = SavedClassifier(head)
    elif head.head == "BertForTokenClassification":
        task = SavedTagger(head, options.get("aggregation_strategy") or "simple")
    else:
        task = SavedReader(
            bool(options.get("handle_impossible_answer")),
            int(options.get("max_answer_len") or 15),
            int(options.get("doc_stride") or 128),
        )
    info = {"task": head.task, "head": head.head, "saved_by": head.saved_by,
            "architecture": head.architecture}  # fmt: skip
    return task, info


# --------------------------------------------------------------------------- classifier
class SavedClassifier(TextClassificationTask):
    """A sequence classifier saved elsewhere: a text, a pair (`(a, b)` or {"text",
    "text_pair"}) or either; its answer as `pipeline()` scores it (`label`, `score`, every
    label's score in `probabilities`; multi-label also the `labels` at 0.5 or over; regression
    the raw `score` under its label)."""

    def __init__(self, head: SavedHead) -> None:
        super().__init__(DataConfig(text_pair_column="text_pair"))
        self.saved = head
        self.label_set = LabelSet(head.problem, head.labels)

    def example_of(self, item: Any, n: int) -> TextExample:
        if isinstance(item, dict):  # a row: its "text" (and "text_pair"), other columns kept
            if "text" not in item:
                raise ValueError(f'item {n}: {{"text": ...[, "text_pair": ...]}} expected, got '
                                 f"keys {sorted(item)}")  # fmt: skip
            text, pair = item["text"], item.get("text_pair")
        elif isinstance(item, (list, tuple)):
            if len(item) != 2:
                raise ValueError(f"item {n}: a pair is two texts, got {len(item)}")
            text, pair = item
        else:
            text, pair = item, None
        for value in (text, pair):
            if value is not None and not isinstance(value, str):
                raise ValueError(f"item {n}: {type(value).__name__}, expected a text")
        if not text or not text.strip():
            raise ValueError(f"item {n}: an empty text")
        return TextExample("<input>", n + 1, text, pair or None)

    def items_of(self, texts, question, context) -> list:
        if question or context:
            raise ValueError(f"{self.name} takes texts, not --question/--context")
        if self.saved.activation is not None and len(self.saved.labels) == 1:
            if len(texts) != 2:  # a cross-encoder reads a query and a text
                raise ValueError("a cross-encoder scores a pair: give two texts, or --input FILE")
            return [tuple(texts)]
        return list(texts)

    def scores(self, logits: np.ndarray, function: str | None = None) -> np.ndarray:
        """The outputs through `function` (default: pipeline()'s for this head)."""
        return _apply(logits, function or self.saved.function)

    def relevance(self, logits: np.ndarray, raw: bool = False) -> np.ndarray:
        """A cross-encoder's score of each pair: its first output through the folder's
        activation (CrossEncoder.predict's), or raw."""
        return _apply(logits, "none" if raw else self.saved.activation or "none")[:, 0]

    def _answers(self, logits: np.ndarray) -> list[dict[str, Any]]:
        names = self.labels()
        scores = self.scores(logits)
        answers = []
        for row in scores:
            best = int(row.argmax())
            answer: dict[str, Any] = {"label": names[best], "score": float(row[best])}
            if self.saved.function == "none":
                if len(names) > 1:
                    answer["scores"] = {n: float(s) for n, s in zip(names, row, strict=True)}
            else:
                answer["probabilities"] = {n: float(s) for n, s in zip(names, row, strict=True)}
            if self.problem == "multi-label" and len(names) > 1:
                answer["labels"] = [n for n, s in zip(names, row, strict=True) if s >= 0.5]
            answers.append(answer)
        return answers


def _apply(logits: np.ndarray, function: str) -> np.ndarray:
    if function == "sigmoid":
        return sigmoid(logits)
    if function == "softmax":
        return softmax(logits)
    if function == "tanh":
        return np.tanh(logits)
    return logits


# --------------------------------------------------------------------------- tagger
@dataclass(frozen=True, slots=True)
class TextToTag:
    line: int
    text: str


class SavedTagger(Task):
    """A token classifier saved elsewhere, on raw text: each piece's label probabilities
    (softmax), grouped into entities as `pipeline("token-classification",
    aggregation_strategy=...)` groups them — `none`: each piece not tagged "O" with its
    `index`; `simple`: adjacent pieces of one type (B- starts a new one) with the mean of their
    scores; `first` / `average` / `max`: pieces grouped into words first (a word's label: its
    first piece's, the mean of its pieces' probabilities, its most confident piece's), then
    grouped as `simple`. Each entity: `type`, `score`, `text` (the text's own characters),
    `start`, `end`; texts over the model's length are cut, as the pipeline cuts them."""

    name = "token-classification"
    head = "BertForTokenClassification"
    metrics = ()
    default_file_format = "jsonl"

    def __init__(self, head: SavedHead, aggregation: str = "simple") -> None:
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation_strategy must be one of {', '.join(AGGREGATIONS)}, "
                             f"not {aggregation!r}")  # fmt: skip
        self.saved, self.aggregation = head, aggregation
        self._names = list(head.labels)

    def labels(self) -> list[str]:
        return list(self._names)

    def with_aggregation(self, aggregation: str) -> SavedTagger:
        return SavedTagger(self.saved, aggregation)

    def example_of(self, item: Any, n: int) -> TextToTag:
        if isinstance(item, list) and all(isinstance(w, str) for w in item):
            item = " ".join(item)  # a list of words: the text they make
        if isinstance(item, dict) and "text" in item:  # a row: its "text"
            item = item["text"]
        if not isinstance(item, str):
            raise ValueError(f"item {n}: {type(item).__name__}, expected a text to tag")
        if not item.strip():
            raise ValueError(f"item {n}: an empty text")
        return TextToTag(n + 1, item)

    def featurize(self, examples, tokenizer, max_seq_length: int) -> list[Feature]:
        encoded = tokenizer([e.text for e in examples], max_length=max_seq_length,
                            return_offsets=True, return_special_tokens_mask=True)  # fmt: skip
        features = []
        continuing = tokenizer.continuing_subword_prefix
        unk = tokenizer.convert_tokens_to_ids(tokenizer.unk_token)
        for n, ids in enumerate(encoded["input_ids"]):
            features.append({
                "input_ids": ids,
                "token_type_ids": encoded["token_type_ids"][n],
                "attention_mask": encoded["attention_mask"][n],
                "_example": n,
                "_offsets": encoded["offset_mapping"][n],
                "_special": encoded["special_tokens_mask"][n],
                "_tokens": tokenizer.convert_ids_to_tokens(ids),
                "_prefixed": continuing is not None,
                "_unk": unk,
            })  # fmt: skip
        return features

    def outputs(self, model, batch):
        return {"logits": head_logits(model, batch)}

    def answer(self, examples, features, outputs) -> list[dict[str, Any]]:
        results = []
        for example, feature, logits in zip(examples, features, outputs["logits"], strict=True):
            probs = softmax(logits[: len(feature["input_ids"])].astype(np.float64))
            pieces = self._pieces(example.text, feature, probs)
            results.append({"entities": self._group(example.text, pieces)})
        return results

    def _pieces(self, text: str, feature: Feature, probs: np.ndarray) -> list[dict[str, Any]]:
        """Each piece of the text (no special tokens): its probabilities, characters, index,
        and whether it continues a word (the pipeline's rule: a piece that is not the text it
        covers, where the vocabulary marks continuations; else no space before it)."""
        pieces = []
        for i, (token, (start, end)) in enumerate(zip(feature["_tokens"], feature["_offsets"],
                                                      strict=True)):  # fmt: skip
            if feature["_special"][i]:
                continue
            covered = text[start:end]
            if feature["_prefixed"]:
                inside = len(token) != len(covered)
            else:
                inside = start > 0 and " " not in text[start - 1 : start + 1]
            if feature["input_ids"][i] == feature["_unk"]:
                inside = False
            pieces.append({"scores": probs[i], "start": int(start), "end": int(end), "index": i,
                           "inside": inside})  # fmt: skip
        return pieces

    def _group(self, text: str, pieces: list[dict[str, Any]]) -> list[dict[str, Any]]:
        names, strategy = self._names, self.aggregation
        if strategy in ("none", "simple"):
            tagged = []
            for piece in pieces:
                best = int(piece["scores"].argmax())
                tagged.append({"entity": names[best], "score": float(piece["scores"][best]),
                               "start": piece["start"], "end": piece["end"],
                               "index": piece["index"]})  # fmt: skip
        else:
            tagged = [self._word(group) for group in _words(pieces)]
        if strategy == "none":
            return [
                {"type": t["entity"], "score": t["score"], "text": text[t["start"] : t["end"]],
                 "start": t["start"], "end": t["end"], "index": t["index"]}
                for t in tagged if t["entity"] != "O"
            ]  # fmt: skip
        groups: list[list[dict[str, Any]]] = []
        for entity in tagged:
            mark, kind = _mark(entity["entity"])
            if groups and mark != "B" and _mark(groups[-1][-1]["entity"])[1] == kind:
                groups[-1].append(entity)
            else:
                groups.append([entity])
        found = []
        for group in groups:
            kind = group[0]["entity"].split("-", 1)[-1]
            if kind == "O" or group[0]["entity"] == "O":
                continue
            start, end = group[0]["start"], group[-1]["end"]
            found.append({"type": kind, "score": float(np.mean([e["score"] for e in group])),
                          "text": text[start:end], "start": start, "end": end})  # fmt: skip
        return found

    def _word(self, group: list[dict[str, Any]]) -> dict[str, Any]:
        """A word's label and score from its pieces (first, max, average)."""
        names = self._names
        if self.aggregation == "first":
            scores = group[0]["scores"]
        elif self.aggregation == "max":
            scores = max(group, key=lambda p: p["scores"].max())["scores"]
        else:
            scores = np.nanmean(np.stack([p["scores"] for p in group]), axis=0)
        best = int(scores.argmax())
        return {"entity": names[best], "score": float(scores[best]), "start": group[0]["start"],
                "end": group[-1]["end"]}  # fmt: skip

    def items_of(self, texts, question, context) -> list:
        if question or context:
            raise ValueError(f"{self.name} takes texts, not --question/--context")
        return list(texts)


def _mark(label: str) -> tuple[str, str]:
    """(B or I, type) of a tag, as the pipeline reads it: a tag without B-/I- continues."""
    if label.startswith("B-"):
        return "B", label[2:]
    if label.startswith("I-"):
        return "I", label[2:]
    return "I", label


def _words(pieces: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    words: list[list[dict[str, Any]]] = []
    for piece in pieces:
        if words and piece["inside"]:
            words[-1].append(piece)
        else:
            words.append([piece])
    return words


# --------------------------------------------------------------------------- reader
class SavedReader(SquadTask):
    """An extractive reader saved elsewhere, answering as transformers' question-answering
    pipeline did: the question whole, the context in windows of the model's length (384 at
    most) overlapping by `doc_stride` pieces; in each window a softmax over the context pieces
    and [CLS]; the best span of context pieces (end >= start, at most `max_answer_len`) by
    p(start)·p(end), over all windows; with `handle_impossible_answer`, no answer ("") where
    the [CLS] span's p·p (the least over the windows) is higher."""

    default_max_seq_length = 384

    def __init__(self, handle_impossible: bool = False, max_answer_len: int = 15,
                 doc_stride: int = 128) -> None:  # fmt: skip
        super().__init__(2 if handle_impossible else 1)
        self.name = "question-answering"
        self.handle_impossible = handle_impossible
        self.max_answer_length, self.doc_stride = max_answer_len, doc_stride

    def featurize(self, examples, tokenizer, max_seq_length: int) -> list[Feature]:
        questions = tokenizer.encode_ids([e.question for e in examples])
        unique = list(dict.fromkeys(e.context for e in examples))
        encoded = tokenizer(unique, add_special_tokens=False, truncation=False, return_offsets=True)
        contexts = {text: (ids, offsets) for text, ids, offsets in
                    zip(unique, encoded["input_ids"], encoded["offset_mapping"], strict=True)}  # fmt: skip
        specials = tokenizer.special_tokens_added(True)
        cls = tokenizer.convert_tokens_to_ids(tokenizer.cls_token)
        features = []
        for n, example in enumerate(examples):
            question = questions[n]
            ids, offsets = contexts[example.context]
            room = max_seq_length - len(question) - specials
            if room < 1:
                raise ValueError(f"item {n}: the question fills the model's {max_seq_length} "
                                 "pieces: no room for the context")  # fmt: skip
            # pipeline()'s: at most half the length, and less than the context's room
            stride = max(min(self.doc_stride, max_seq_length // 2, room - 1), 0)
            first = tokenizer.second_start(len(question))
            for start in _overlapping(len(ids), room, stride):
                window = ids[start : start + room]
                input_ids, types = tokenizer.with_specials(question, window)
                features.append({
                    "input_ids": input_ids, "token_type_ids": types,
                    "attention_mask": [1] * len(input_ids), "_example": n,
                    "_context_start": first, "_offsets": offsets[start : start + room],
                    "_cls": [i for i, t in enumerate(input_ids) if t == cls],
                })  # fmt: skip
        return features

    def answer(self, examples, features, outputs) -> list[dict[str, Any]]:
        best: dict[int, dict[str, Any]] = {}
        null: dict[int, float] = {}
        for f, feature in enumerate(features):
            n = feature["_example"]
            span, nothing = self._window(feature, outputs["start_logits"][f],
                                         outputs["end_logits"][f])  # fmt: skip
            null[n] = min(null.get(n, 1.0), nothing)
            if span is not None and (n not in best or span["score"] > best[n]["score"]):
                best[n] = span
        results = []
        for n, example in enumerate(examples):
            top = best.get(n)
            if top is None or (self.handle_impossible and null[n] > top["score"]):
                score = null[n] if self.handle_impossible else 0.0
                results.append({"answer": "", "start": None, "end": None, "score": score,
                                "no_answer": True})  # fmt: skip
                continue
            results.append({"answer": example.context[top["start"] : top["end"]],
                            "start": top["start"], "end": top["end"], "score": top["score"],
                            "no_answer": False})  # fmt: skip
        return results

    def _window(self, feature: Feature, starts: np.ndarray, ends: np.ndarray
                ) -> tuple[dict[str, Any] | None, float]:  # fmt: skip
        """The window's best span (character start and end, p·p) and its [CLS] span's p·p."""
        length = len(feature["input_ids"])
        first, count = feature["_context_start"], len(feature["_offsets"])
        allowed = np.zeros(length, dtype=bool)
        allowed[first : first + count] = True
        allowed[feature["_cls"]] = True
        s = _masked_softmax(starts[:length], allowed)
        e = _masked_softmax(ends[:length], allowed)
        nothing = float(s[0] * e[0])
        s, e = s[first : first + count], e[first : first + count]
        scores = np.triu(np.outer(s, e)) - np.triu(np.outer(s, e), self.max_answer_length)
        if not scores.size:
            return None, nothing
        i, j = np.unravel_index(int(scores.argmax()), scores.shape)
        offsets = feature["_offsets"]
        return {"start": int(offsets[i][0]), "end": int(offsets[j][1]),
                "score": float(scores[i, j])}, nothing  # fmt: skip

    def example_of(self, item: Any, n: int) -> SquadExample:
        if isinstance(item, dict) and not str(item.get("context") or "").strip():
            raise ValueError(f"item {n}: no context (a question is answered from a context: "
                             '{"question": ..., "context": ...})')  # fmt: skip
        return super().example_of(item, n)

    def with_settings(self, settings) -> SavedReader:
        return copy.copy(self)


def _masked_softmax(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    values = np.where(allowed, logits.astype(np.float64), -10000.0)
    values = np.exp(values - values.max())
    return values / values.sum()


def _overlapping(total: int, room: int, stride: int) -> list[int]:
    """Where windows of `room` pieces start when consecutive ones share `stride` pieces (the
    tokenizers library's overflow): _overlapping(10, 4, 1) -> [0, 3, 6]"""
    starts, start = [], 0
    while True:
        starts.append(start)
        if start + room >= total:
            return starts
        start += room - stride
