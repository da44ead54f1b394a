"""Raw text in, labels / spans / tags out, from a checkpoint `bertkit finetune` wrote.

    predictor = Predictor("runs/mrpc")
    predictor(["The cat sat.", "A cat was sitting."])           # one pair (a pair task)
    Predictor("runs/sst2")(["a gripping, funny film"])          # single sentences
    Predictor("runs/squad1")([{"question": "Who?", "context": "Ann did."}])
    Predictor("runs/conll")(["EU rejects German call"])         # words split on whitespace
    Predictor("runs/swag")([{"context": "She opens the door.", "endings": ["...", ...]}])

Each item gets a dict (JSON-ready). The task, its label names, `max_seq_length` and, for SQuAD
2.0, the dev-chosen null threshold come from the checkpoint (`bertkit_task.json`, config.json).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers.pre_tokenizers import BertPreTokenizer

from bertkit._io import read_jsonl
from bertkit.checkpoint import read_config
from bertkit.heads import MODEL_CLASSES
from bertkit.tasks import get_task
from bertkit.tasks.base import read_task_info, run_outputs
from bertkit.tasks.glue import SentenceExample
from bertkit.tasks.metrics import entities
from bertkit.tasks.ner import ConllTask, TaggedSentence
from bertkit.tasks.squad import SquadExample, SquadTask
from bertkit.tasks.swag import ChoiceExample
from bertkit.tokenizer import BertTokenizer

_BASIC_SPLIT = BertPreTokenizer()  # whitespace, then punctuation: BERT's basic split

PAIR_TASKS = ("mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")


class Predictor:
    def __init__(
        self,
        model: str | os.PathLike,
        *,
        device: str | None = None,
        batch_size: int = 32,
        backend: str = "torch",
    ) -> None:
        """`backend="onnx"`: run `model/model.onnx` (written by `bertkit export --onnx`) with
        ONNX Runtime on the CPU instead of PyTorch; everything else is the same."""
        if backend not in ("torch", "onnx"):
            raise ValueError(f"backend must be torch or onnx, not {backend!r}")
        info = read_task_info(model)
        self.task = get_task(info["task"]).with_settings(info)
        self.max_seq_length = int(info.get("max_seq_length", self.task.default_max_seq_length))
        self.tokenizer = BertTokenizer.from_pretrained(model)
        if backend == "onnx":
            from bertkit.serving import OnnxModel

            self.device = torch.device("cpu")
            self.model: torch.nn.Module | OnnxModel = OnnxModel(model)
            config = read_config(Path(model))
        else:
            self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
            head = MODEL_CLASSES[info.get("head", self.task.head)]
            net = head.from_pretrained(model).to(self.device).eval()
            self.model = net
            config = net.config
        self.batch_size = batch_size
        labels = config.id2label
        self.labels = [labels[i] for i in sorted(labels)] if labels else None

    def items_from(
        self,
        path: str | os.PathLike | None = None,
        texts: Sequence[str] = (),
        question: str | None = None,
        context: str | None = None,
    ) -> list[Any]:
        """What `bertkit predict` reads, as items for this model's task: a JSON-lines file, or
        a question and its context (SQuAD), or two texts (a pair task), or texts."""
        name = self.task.name
        if path is not None:
            return read_jsonl(path)
        if name.startswith("squad"):
            if not (question and context):
                raise ValueError(f"{name} takes --question and --context (or --input FILE.jsonl)")
            return [{"question": question, "context": context}]
        if name in PAIR_TASKS:
            if len(texts) != 2:
                raise ValueError(f"{name} takes two texts: bertkit predict --model DIR 'A' 'B'")
            return [tuple(texts)]
        return list(texts)

    def __call__(self, items: Sequence[Any]) -> list[dict[str, Any]]:
        items = [_plain(item) for item in items]
        if not items:
            return []
        # raw text to tag is split as BERT's basic tokenizer does ("Paris." -> "Paris", "."),
        # keeping each word's character offsets; pre-split words are taken as they are
        tagging = self.task.name.startswith("conll2003")
        splits = [
            _BASIC_SPLIT.pre_tokenize_str(item) if tagging and isinstance(item, str) else None
            for item in items
        ]
        examples = [self._example(item, n, splits[n]) for n, item in enumerate(items)]
        features = self.task.featurize(examples, self.tokenizer, self.max_seq_length)
        outputs = run_outputs(self.task, self.model, features, self.batch_size, self.device)
        name = self.task.name
        if name.startswith("squad"):
            return self._spans(examples, features, outputs)
        if name.startswith("conll2003"):
            return self._tags(items, splits, examples, features, outputs)
        logits = outputs["logits"]
        if name == "stsb":
            return [{"score": float(v)} for v in logits[:, 0]]
        probs = _softmax(logits)
        if name == "swag":
            return [
                {"choice": int(p.argmax()), "probabilities": [float(x) for x in p]} for p in probs
            ]
        assert self.labels is not None  # a classifier's config names its labels
        return [
            {
                "label": self.labels[int(p.argmax())],
                "probability": float(p.max()),
                "probabilities": {k: float(x) for k, x in zip(self.labels, p, strict=True)},
            }
            for p in probs
        ]

    def _example(self, item: Any, n: int, split: list | None = None):
        name = self.task.name
        if name.startswith("squad"):
            question, context = (
                (item["question"], item["context"]) if isinstance(item, dict) else item
            )
            return SquadExample(str(n), question, context, ())
        if name.startswith("conll2003"):
            words = [w for w, _ in split] if split is not None else list(item)
            if not words:
                raise ValueError(f"item {n}: no words to tag")
            assert isinstance(self.task, ConllTask)
            filler = self.task.labels()[0] if self.task.tagset else "O"
            return TaggedSentence(str(n), tuple(words), (filler,) * len(words))
        if name == "swag":
            endings = tuple(item["endings"])
            return ChoiceExample(str(n), item["context"], item.get("start", ""), endings, None)
        if name in PAIR_TASKS:
            if isinstance(item, str) or len(item) != 2:
                raise ValueError(f"item {n}: {name} takes sentence pairs (a, b)")
            return SentenceExample(str(n), item[0], item[1], None)
        if not isinstance(item, str):
            raise ValueError(f"item {n}: {name} takes single sentences")
        return SentenceExample(str(n), item, None, None)

    def _tags(self, items, splits, examples, features, outputs) -> list[dict[str, Any]]:
        """Per word: its tag and the tag's probability (and, for raw text, its character
        `offsets`); NER and chunks also as entities with the words they span, their text,
        character `start`/`end` in a raw-text item, and a `score` (the mean probability of their
        words' tags, as transformers' "simple" aggregation)."""
        tags = self.task.predictions(examples, features, outputs)
        probs = _softmax(outputs["logits"])  # (features, S, C)
        word_probs = [[0.0] * len(e.words) for e in examples]
        for f, feature in enumerate(features):
            row = word_probs[feature["_example"]]
            for k, position in enumerate(feature["_word_positions"]):
                row[feature["_first_word"] + k] = float(probs[f, position].max())
        results = []
        for item, split, example, row_tags, row_probs in zip(
            items, splits, examples, tags, word_probs, strict=True
        ):
            spans = [offsets for _, offsets in split] if split is not None else None
            result = {"words": list(example.words), "tags": row_tags, "scores": row_probs}
            if spans is not None:
                result["offsets"] = [list(span) for span in spans]
            if self.task.name != "conll2003-pos":
                found = []
                for kind, first, last in entities(row_tags):
                    entity = {
                        "type": kind,
                        "text": " ".join(example.words[first : last + 1]),
                        "words": [first, last],
                        "score": float(np.mean(row_probs[first : last + 1])),
                    }
                    if spans is not None:
                        entity["start"], entity["end"] = spans[first][0], spans[last][1]
                        entity["text"] = item[entity["start"] : entity["end"]]
                    found.append(entity)
                result["entities"] = found
            results.append(result)
        return results

    def _spans(self, examples, features, outputs) -> list[dict[str, Any]]:
        assert isinstance(self.task, SquadTask)
        found = self.task.predictions(examples, features, outputs)
        answers = self.task.answers(found)
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


def _plain(item: Any) -> Any:
    """The JSONL shape of `predict --input` ({"text": a[, "text_pair": b]}) as a text or pair."""
    if isinstance(item, dict) and "text" in item:
        return (item["text"], item["text_pair"]) if "text_pair" in item else item["text"]
    return item


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(-1, keepdims=True))
    return shifted / shifted.sum(-1, keepdims=True)
