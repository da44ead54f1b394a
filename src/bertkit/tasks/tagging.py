"""Tagging words, shared by CoNLL-2003 and `token-classification`: the first WordPiece of each
word carries the word's label (the paper, Sec. 4.3), the other pieces are left out of the loss
and the predictions. A sentence longer than the window is cut at word boundaries into several
windows; with a `stride` consecutive windows share about that many pieces and each word takes
its tag from the window where it has the most context (the larger of its pieces on either side,
as SQuAD picks answer windows).

Tag schemes: entity chunks in IOB1 (`I-` opens an entity unless it follows one of its type),
IOB2 (`B-` opens every entity) or IOBES, read with conlleval's chunk rules and learnt as IOB2;
or plain labels per word (POS tags), scored by accuracy.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from tokenizers.pre_tokenizers import BertPreTokenizer

from bertkit.core.losses import IGNORE_INDEX, token_loss
from bertkit.rows import ColumnSentence, FileConfig, read_conll_columns
from bertkit.tasks import metrics
from bertkit.tasks.base import DataError, Feature, Task, head_logits
from bertkit.tasks.labels import softmax

_BASIC_SPLIT = BertPreTokenizer()  # whitespace, then punctuation: BERT's basic split
_PREFIXED = re.compile(r"^([BIES])-(.+)$")


@dataclass(frozen=True)
class TaggedSentence:
    guid: str  # "file:first line"
    words: tuple[str, ...]
    tags: tuple[str, ...]  # as in the file (IOB1, IOB2, IOBES or plain); () when unlabelled
    columns: tuple[tuple[str, ...], ...] = ()  # the middle columns (POS, chunk), for writing back
    offsets: tuple[tuple[int, int], ...] | None = None  # raw text: each word's characters
    text: str | None = None  # the raw text the words were split from
    lines: tuple[int, ...] = ()  # each word's line in its file (for errors)


def to_iob2(tags: Sequence[str]) -> list[str]:
    """Any of IOB1/IOB2/IOBES to IOB2, by conlleval's chunks:
    to_iob2(["I-PER", "I-PER", "B-PER", "O"]) -> ["B-PER", "I-PER", "B-PER", "O"]"""
    out = ["O"] * len(tags)
    for kind, start, end in metrics.entities(tags):
        out[start] = f"B-{kind}"
        for i in range(start + 1, end + 1):
            out[i] = f"I-{kind}"
    return out


def iob_labels(types: Sequence[str]) -> list[str]:
    """The IOB2 label set of entity types: iob_labels(["LOC"]) -> ["O", "B-LOC", "I-LOC"]"""
    return ["O"] + [f"{p}-{t}" for t in types for p in "BI"]


def split_words(text: str) -> tuple[tuple[str, ...], tuple[tuple[int, int], ...]]:
    """Raw text as BERT's basic tokenizer splits it (whitespace, then punctuation), with each
    word's character offsets: split_words("Paris.") -> (("Paris", "."), ((0, 5), (5, 6)))"""
    found = _BASIC_SPLIT.pre_tokenize_str(text)
    return tuple(w for w, _ in found), tuple(tuple(o) for o in (s for _, s in found))  # type: ignore[misc]


# --------------------------------------------------------------------------- tag schemes
def _where(sentence: TaggedSentence, i: int) -> tuple[str, int | None]:
    path, _, first = sentence.guid.rpartition(":")
    if sentence.lines:
        return path, sentence.lines[i]
    return (path or sentence.guid), int(first) if first.isdigit() else None


def detect_scheme(sentences: Sequence[TaggedSentence], given: str = "auto") -> str:
    """The tag scheme of training sentences: `given` if not "auto", else plain (no tag has a
    B-/I-/E-/S- prefix), IOBES (E-/S- tags), IOB2 (some B- opens an entity) or IOB1. Tags mixing
    prefixed and bare names raise DataError at the first bare one."""
    first_prefixed = first_bare = None
    ends = opens = False
    for s in sentences:
        previous = "O"
        for i, tag in enumerate(s.tags):
            match = _PREFIXED.match(tag)
            if tag == "O":
                pass
            elif match is None:
                first_bare = first_bare or (s, i)
            else:
                first_prefixed = first_prefixed or (s, i)
                prefix, kind = match.groups()
                ends = ends or prefix in "ES"
                if prefix == "B" and previous not in (f"B-{kind}", f"I-{kind}"):
                    opens = True
            previous = tag
    if given == "plain":
        return "plain"
    if first_bare is not None and (first_prefixed is not None or given != "auto"):
        s, i = first_bare
        path, line = _where(s, i)
        other = ""
        if first_prefixed is not None:
            ps, pi = first_prefixed
            other = f" while others do ({ps.tags[pi]!r} on line {_where(ps, pi)[1]})"
        raise DataError(
            path, line, f"tag {s.tags[i]!r} has no B-/I- prefix{other}: IOB tags are O or "
            "B-TYPE / I-TYPE (--tag-scheme plain reads every tag as a label of its own)"
        )  # fmt: skip
    if first_bare is not None:
        return "plain"
    if first_prefixed is None:
        raise DataError(Path(sentences[0].guid.rpartition(":")[0]), None,
                        "every tag is O: no entity to learn")  # fmt: skip
    if given != "auto":
        return given
    return "iobes" if ends else "iob2" if opens else "iob1"


def check_scheme(sentence: TaggedSentence, scheme: str) -> None:
    """DataError at the first tag the scheme does not allow: in IOB2 an I- tag continues an
    entity of its type; in IOB1 a B- tag follows one of its type; in IOBES I-/E- continue."""
    if scheme == "plain":
        return
    previous = "O"
    for i, tag in enumerate(sentence.tags):
        match = _PREFIXED.match(tag)
        if tag != "O" and match is None:
            path, line = _where(sentence, i)
            raise DataError(path, line, f"tag {tag!r} is not O or B-/I-TYPE")
        if match is not None:
            prefix, kind = match.groups()
            continuing = previous in (f"B-{kind}", f"I-{kind}")
            wrong = None
            if scheme == "iob2" and prefix == "I" and not continuing:
                wrong = "in IOB2 an I- tag continues an entity of its type (B- opens one)"
            elif scheme == "iob1" and prefix == "B" and not continuing:
                wrong = "in IOB1 a B- tag only separates two entities of one type"
            elif scheme == "iobes" and prefix in "IE" and not continuing:
                wrong = "in IOBES I- and E- tags continue an entity of their type"
            elif scheme in ("iob1", "iob2") and prefix in "ES":
                wrong = f"an {prefix}- tag in an {scheme.upper()} file"
            if wrong:
                path, line = _where(sentence, i)
                after = f"after {previous!r}" if i else "at the start of a sentence"
                raise DataError(
                    path, line, f"tag {tag!r} {after}: {wrong} (fix the tag, or say the file's "
                    "scheme with --tag-scheme iob1|iob2|iobes)"
                )  # fmt: skip
        previous = tag if scheme != "iobes" or not tag.startswith(("E-", "S-")) else "O"


def entity_types(sentences: Sequence[TaggedSentence]) -> collections.Counter:
    """Entities per type in IOB-family sentences (conlleval's chunks)."""
    counts: collections.Counter = collections.Counter()
    for s in sentences:
        counts.update(kind for kind, _, _ in metrics.entities(s.tags))
    return counts


# --------------------------------------------------------------------------- windows
def word_windows(lengths: Sequence[int], budget: int, stride: int | None) -> list[tuple[int, int]]:
    """(first, end) word ranges of the windows over words of these piece counts, at most
    `budget` pieces each; with a `stride`, each window starts so that it shares at most that many
    pieces (whole words) with the previous one, and always moves on.
    word_windows([2, 2, 2, 2], 4, None) -> [(0, 2), (2, 4)];
    word_windows([2, 2, 2, 2], 4, 2) -> [(0, 2), (1, 3), (2, 4)]"""
    windows: list[tuple[int, int]] = []
    start, n = 0, len(lengths)
    while start < n:
        end, used = start, 0
        while end < n and used + lengths[end] <= budget:
            used += lengths[end]
            end += 1
        end = max(end, start + 1)
        windows.append((start, end))
        if end >= n:
            break
        following, overlap = end, 0
        while stride and following - 1 > start and overlap + lengths[following - 1] <= stride:
            following -= 1
            overlap += lengths[following]
        start = following
    return windows


def max_context(windows: list[tuple[int, int]], lengths: Sequence[int]) -> list[list[bool]]:
    """Per window, per word in it: whether this window gives the word its most context (the
    larger min(pieces before, pieces after) + 0.01 · window pieces; the first such window)."""
    if len(windows) == 1:
        return [[True] * (windows[0][1] - windows[0][0])]
    starts = np.concatenate([[0], np.cumsum(lengths)])
    best: dict[int, tuple[float, int]] = {}
    for w, (first, end) in enumerate(windows):
        size = starts[end] - starts[first]
        for word in range(first, end):
            left = starts[word] - starts[first]
            right = starts[end] - starts[word + 1]
            score = min(left, right) + 0.01 * size
            if word not in best or score > best[word][0]:
                best[word] = (score, w)
    return [
        [best[word][1] == w for word in range(first, end)] for w, (first, end) in enumerate(windows)
    ]


class WordTagger(Task):
    """A label per word, from the first piece's logits. Subclasses read the files and give the
    label set (`labels`) and the scheme (`scheme`: "plain" or an IOB family)."""

    head = "BertForTokenClassification"
    # Random batches: length-sorted ones cost tagging 1.6 F1 against a transformers user's
    # loop on CoNLL-2003 (5,000 sentences, 3 seeds), random ones are level with it. Not the
    # per-word weighting of short batches alone (dividing every batch by the mean word count
    # recovered 0.4 of it): batches of one length are of one kind (CoNLL's short lines are
    # headlines and score lines). docs/results/own_data
    default_bucket_batches: int = 1
    default_file_format = "conll"  # CoNLL-2003's files are .txt
    scheme: str = "iob2"
    stride: int | None = None
    weights: list[float] | None = None
    padded_inputs: ClassVar[dict[str, int]] = {
        "input_ids": 0,
        "token_type_ids": 0,
        "attention_mask": 0,
        "labels": IGNORE_INDEX,
    }

    def gold(self, sentence: TaggedSentence) -> list[str]:
        """The sentence's tags as the classifier's labels (IOB2 for entity schemes)."""
        return list(sentence.tags) if self.scheme == "plain" else to_iob2(sentence.tags)

    def check_labels(self, sentence: TaggedSentence, tags: list[str], index: dict) -> None:
        """Called on every labelled sentence featurised; DataError where it cannot be learnt."""

    def conll_columns(
        self, path: Path, found: Sequence[ColumnSentence], width: int, options: FileConfig
    ) -> tuple[int, int | None]:
        """Where the lines of a CoNLL-style file of `width` fields hold the word and this
        task's tag (None: the file has no tag column): the first field and the last."""
        return 0, (width - 1 if width > 1 else None)

    def file_rows(self, path, kind, options) -> Iterator[tuple[int, dict[str, Any]]] | None:
        return self.conll_rows(path, options) if kind == "conll" else None

    def conll_rows(self, path: Path, options: FileConfig) -> Iterator[tuple[int, dict[str, Any]]]:
        """A CoNLL-style file's sentences as rows to tag (`predict --input`): (the first
        word's line, {"words": [...]}, with the file's own "tags" where it has a tag column).
        Each of those is checked to be a tag, for a file of raw text, a sentence a line, reads
        as a sentence of words whose tags are other words."""
        found, width = read_conll_columns(path, options, min_fields=1)
        word_at, tag_at = self.conll_columns(path, found, width, options)
        known = set(self.labels() or ())
        for sentence in found:
            values: dict[str, Any] = {"words": [fields[word_at] for fields in sentence.rows]}
            if tag_at is not None:
                tags = [fields[tag_at] for fields in sentence.rows]
                for tag, line in zip(tags, sentence.lines, strict=True):
                    if self.scheme == "plain" and tag not in known:
                        names = sorted(known)
                        listed = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "")
                        what = f"not one of this model's tags ({listed})"
                    elif self.scheme != "plain" and tag != "O" and not _PREFIXED.match(tag):
                        what = "not O or B-/I-TYPE"
                    else:
                        continue
                    raise DataError(
                        path, line,
                        f"tag {tag!r} is {what}: a CoNLL file holds a word a line, its tag "
                        "last, a blank line between sentences. Raw text, a sentence a line, "
                        "reads from stdin (--input -), JSON Lines or a CSV column",
                    )  # fmt: skip
                values["tags"] = tags
            yield sentence.line, values

    def featurize(self, examples, tokenizer, max_seq_length: int) -> list[Feature]:
        all_words = [w for e in examples for w in e.words]
        pieces = tokenizer.encode_words(all_words) if all_words else []
        unk = tokenizer.unk_token_id
        cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
        label_ids = {name: i for i, name in enumerate(self.labels() or [])}
        budget = max_seq_length - 2
        features = []
        at = 0
        for n, example in enumerate(examples):
            word_pieces = [p[:budget] or [unk] for p in pieces[at : at + len(example.words)]]
            at += len(example.words)
            tags = None
            if example.tags:
                tags = self.gold(example)
                self.check_labels(example, tags, label_ids)
            lengths = [len(p) for p in word_pieces]
            windows = word_windows(lengths, budget, self.stride)
            flags = max_context(windows, lengths)
            for (start, end), best in zip(windows, flags, strict=True):
                ids, labels, firsts = [cls_id], [IGNORE_INDEX], []
                for w in range(start, end):
                    firsts.append(len(ids))
                    label = label_ids[tags[w]] if tags is not None else IGNORE_INDEX
                    labels += [label] + [IGNORE_INDEX] * (len(word_pieces[w]) - 1)
                    ids += word_pieces[w]
                ids.append(sep_id)
                labels.append(IGNORE_INDEX)
                feature = {
                    "input_ids": ids,
                    "token_type_ids": [0] * len(ids),
                    "attention_mask": [1] * len(ids),
                    "labels": labels,
                    "_example": n,
                    "_first_word": start,
                    "_word_positions": firsts,
                }
                if len(windows) > 1:
                    feature["_max_context"] = best
                features.append(feature)
        return features

    def loss(self, model, batch):
        logits = head_logits(model, batch)
        labels = batch["labels"]
        weight = None
        if self.weights is not None:
            weight = torch.tensor(self.weights, dtype=torch.float32, device=logits.device)
        total = token_loss(logits, labels, reduction="sum", weight=weight)
        return total, (labels != IGNORE_INDEX).sum()

    def units(self, batch) -> int:
        return int((batch["labels"] != IGNORE_INDEX).sum())

    def outputs(self, model, batch):
        return {"logits": head_logits(model, batch)}

    def _word_outputs(self, examples, features, outputs) -> list[np.ndarray]:
        """Per example, (words, labels) logits: each word's from its most-context window."""
        logits = outputs["logits"]
        rows = [np.zeros((len(e.words), logits.shape[-1]), dtype=np.float32) for e in examples]
        for f, feature in enumerate(features):
            row = rows[feature["_example"]]
            best = feature.get("_max_context")
            for k, position in enumerate(feature["_word_positions"]):
                if best is None or best[k]:
                    row[feature["_first_word"] + k] = logits[f, position]
        return rows

    def predictions(self, examples, features, outputs) -> list[list[str]]:
        names = self.labels() or []
        return [
            [names[i] for i in row.argmax(-1)]
            for row in self._word_outputs(examples, features, outputs)
        ]

    def item_keys(self) -> tuple[str, ...]:
        """The keys of a dict item that hold its text or words, in the order tried."""
        return ("text", "words", "tokens")

    def example_of(self, item: Any, n: int) -> TaggedSentence:
        """Raw text (split as BERT's basic tokenizer does, with character offsets) or a list
        of words (taken as they are), or a dict holding either (`item_keys`)."""
        if isinstance(item, dict):
            key = next((k for k in self.item_keys() if k in item), None)
            if key is None:
                from bertkit.rows import missing_column

                raise ValueError(f"item {n}: " + missing_column(self.item_keys()[0], list(item),
                                                                 "item's keys are"))  # fmt: skip
            item = item[key]
        if isinstance(item, str):
            words, offsets = split_words(item)
            sentence = TaggedSentence(str(n), words, (), offsets=offsets, text=item)
        elif isinstance(item, (list, tuple)) and all(isinstance(w, str) for w in item):
            sentence = TaggedSentence(str(n), tuple(item), ())
        else:
            raise ValueError(f"item {n}: a text or a list of words, not {type(item).__name__}")
        if not sentence.words:
            raise ValueError(f"item {n}: no words to tag")
        return sentence

    def answer(self, examples, features, outputs) -> list[dict[str, Any]]:
        """Per word its tag and the tag's probability (and, for raw text, its character
        `offsets`); entity schemes also as entities with the words they span, their text,
        character `start`/`end` in a raw-text item, and a `score` (the mean probability of
        their words' tags, as transformers' "simple" aggregation)."""
        names = self.labels() or []
        results = []
        for example, logits in zip(examples, self._word_outputs(examples, features, outputs),
                                   strict=True):  # fmt: skip
            probs = softmax(logits)
            tags = [names[i] for i in probs.argmax(-1)]
            scores = [float(p) for p in probs.max(-1)]
            result: dict[str, Any] = {"words": list(example.words), "tags": tags, "scores": scores}
            if example.offsets is not None:
                result["offsets"] = [list(span) for span in example.offsets]
            if self.scheme != "plain":
                found = []
                for kind, first, last in metrics.entities(tags):
                    entity = {
                        "type": kind,
                        "text": " ".join(example.words[first : last + 1]),
                        "words": [first, last],
                        "score": float(np.mean(scores[first : last + 1])),
                    }
                    if example.offsets is not None and example.text is not None:
                        entity["start"] = example.offsets[first][0]
                        entity["end"] = example.offsets[last][1]
                        entity["text"] = example.text[entity["start"] : entity["end"]]
                    found.append(entity)
                result["entities"] = found
            results.append(result)
        return results

    def tag_figures(self, examples, predictions) -> dict[str, float]:
        """conlleval's figures (entity schemes) or token accuracy (plain tags)."""
        if self.scheme == "plain":
            return {"accuracy": metrics.accuracy(
                [t for p in predictions for t in p], [t for e in examples for t in e.tags]
            )}  # fmt: skip
        # Both sides in IOB2, so token accuracy compares like with like when the file is IOB1
        # (the entity figures do not depend on the scheme).
        return metrics.entity_scores(
            [to_iob2(p) for p in predictions], [to_iob2(e.tags) for e in examples]
        )
