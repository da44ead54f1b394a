"""CoNLL-2003: named-entity recognition, and POS tagging and chunking from the same files.

The files have one token per line, `token POS chunk NER`, blank lines between sentences and
`-DOCSTART- -X- -X- O` lines between documents. The original release tags in IOB1 (`I-` opens
an entity unless it follows one of the same type); most copies, ours too, in IOB2 (`B-` opens
every entity). Both are read: tags go through conlleval's chunk rules and come out as IOB2, the
label set the classifier learns. As in the paper, the first WordPiece of each word carries the
word's label and the other pieces are left out of the loss and the predictions. A sentence
longer than the window is cut at word boundaries into several windows. Scores are conlleval's
(entity-level, exact type and span).

The files' other columns are tasks too (`conll2003-pos`, `conll2003-chunk`), labelled the same
way (first piece of each word): POS tags (Penn Treebank, 46 in CoNLL-2003) scored by token
accuracy, chunks (IOB1/IOB2 of NP, VP, PP, ...) by conlleval's chunk F1.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bertkit.heads import IGNORE_INDEX, token_loss
from bertkit.tasks import metrics
from bertkit.tasks.base import DataError, Feature, Task, head_logits, read_text, require_file

ENTITY_TYPES = ("LOC", "MISC", "ORG", "PER")
CHUNK_TYPES = ("ADJP", "ADVP", "CONJP", "INTJ", "LST", "NP", "PP", "PRT", "SBAR", "UCP", "VP")
POS_TAGS = (
    '"', "''", "$", "(", ")", ",", ".", ":", "CC", "CD", "DT", "EX", "FW", "IN", "JJ", "JJR",
    "JJS", "LS", "MD", "NN", "NN|SYM", "NNP", "NNPS", "NNS", "PDT", "POS", "PRP", "PRP$", "RB",
    "RBR", "RBS", "RP", "SYM", "TO", "UH", "VB", "VBD", "VBG", "VBN", "VBP", "VBZ", "WDT", "WP",
    "WP$", "WRB", "``",
)  # fmt: skip
SPLIT_FILES = {"train": "train.txt", "dev": "valid.txt", "test": "test.txt"}


@dataclass(frozen=True)
class TaggedSentence:
    guid: str  # "file:first line"
    words: tuple[str, ...]
    tags: tuple[str, ...]  # as in the file (IOB1 or IOB2); "O" on unlabelled input
    columns: tuple[tuple[str, ...], ...] = ()  # the middle columns (POS, chunk), for writing back


def to_iob2(tags: Sequence[str]) -> list[str]:
    """Any of IOB1/IOB2/IOBES to IOB2, by conlleval's chunks:
    to_iob2(["I-PER", "I-PER", "B-PER", "O"]) -> ["B-PER", "I-PER", "B-PER", "O"]"""
    out = ["O"] * len(tags)
    for kind, start, end in metrics.entities(tags):
        out[start] = f"B-{kind}"
        for i in range(start + 1, end + 1):
            out[i] = f"I-{kind}"
    return out


def read_conll(
    path: str | os.PathLike,
    entity_types: Sequence[str] = ENTITY_TYPES,
    column: int = -1,
    tagset: Sequence[str] | None = None,
):
    """Sentences of a CoNLL-2003 file with the tags of `column` (-1, the last: NER; 1: POS;
    2: chunks): chunks of `entity_types` in IOB1/IOB2/IOBES, or, with `tagset`, plain tags."""
    path = Path(path)
    sentences: list[TaggedSentence] = []
    words: list[str] = []
    tags: list[str] = []
    middle: list[tuple[str, ...]] = []
    first_line = 0
    width = None
    allowed = set(tagset) if tagset else {"O"} | {f"{p}-{t}" for p in "BIES" for t in entity_types}
    what = "one of the POS tags" if tagset else f"O or B-/I-/E-/S- of {', '.join(entity_types)}"

    def close() -> None:
        if words:
            sentences.append(
                TaggedSentence(
                    f"{path.name}:{first_line}", tuple(words), tuple(tags), tuple(middle)
                )
            )
            words.clear()
            tags.clear()
            middle.clear()

    with io.StringIO(read_text(path)) as handle:  # (a BOM before -DOCSTART- is dropped)
        for number, line in enumerate(handle, start=1):
            fields = line.split()
            if not fields:
                close()
                continue
            if fields[0] == "-DOCSTART-":
                close()
                continue
            if width is None:
                width = len(fields)
                if width < 2 or not -width < column < width or column == 0:
                    raise DataError(
                        path, number, f"{width} columns; expected `token POS chunk NER` (4)"
                    )
            elif len(fields) != width:
                raise DataError(
                    path, number, f"{len(fields)} columns, the file's lines have {width}"
                )
            tag = fields[column]
            if tag not in allowed:
                raise DataError(path, number, f"tag {tag!r} is not {what}")
            if not words:
                first_line = number
            words.append(fields[0])
            tags.append(tag)
            index = column % width
            middle.append(tuple(f for i, f in enumerate(fields[1:], start=1) if i != index))
    close()
    if not sentences:
        raise DataError(path, None, "no sentences")
    return sentences


class ConllTask(Task):
    """NER by default; `ConllTask("pos")` / `ConllTask("chunk")` tag the other columns."""

    name = "conll2003"
    head = "BertForTokenClassification"
    metrics: tuple[str, ...] = ("f1", "precision", "recall")
    column: int = -1
    kinds: tuple[str, ...] = ENTITY_TYPES
    tagset: tuple[str, ...] | None = None

    def __init__(self, column: str = "ner") -> None:
        if column == "pos":
            self.name, self.metrics = "conll2003-pos", ("accuracy",)
            self.column, self.kinds, self.tagset = 1, (), POS_TAGS
        elif column == "chunk":
            self.name, self.column, self.kinds = "conll2003-chunk", 2, CHUNK_TYPES
        elif column != "ner":
            raise ValueError(f"CoNLL-2003 columns are ner, pos and chunk, not {column!r}")

    padded_inputs = {
        "input_ids": 0,
        "token_type_ids": 0,
        "attention_mask": 0,
        "labels": IGNORE_INDEX,
    }

    def labels(self) -> list[str]:
        if self.tagset:
            return list(self.tagset)
        return ["O"] + [f"{p}-{t}" for t in self.kinds for p in "BI"]

    def _gold(self, tags):
        return list(tags) if self.tagset else to_iob2(tags)

    def read(self, data_dir, split: str) -> list[TaggedSentence]:
        if split not in SPLIT_FILES:
            raise ValueError(f"{self.name} has no split {split!r}; it has {sorted(SPLIT_FILES)}")
        return read_conll(
            require_file(Path(data_dir) / SPLIT_FILES[split], "CoNLL-2003"),
            self.kinds,
            self.column,
            self.tagset,
        )

    def featurize(self, examples, tokenizer, max_seq_length: int) -> list[Feature]:
        all_words = [w for e in examples for w in e.words]
        pieces = tokenizer.encode_ids(all_words) if all_words else []
        unk = tokenizer.unk_token_id
        cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
        label_ids = {name: i for i, name in enumerate(self.labels())}
        budget = max_seq_length - 2
        features = []
        at = 0
        for n, example in enumerate(examples):
            word_pieces = [p[:budget] or [unk] for p in pieces[at : at + len(example.words)]]
            at += len(example.words)
            tags = self._gold(example.tags)
            start = 0
            while start < len(word_pieces):  # windows of whole words
                end, used = start, 0
                while end < len(word_pieces) and used + len(word_pieces[end]) <= budget:
                    used += len(word_pieces[end])
                    end += 1
                ids, labels, firsts = [cls_id], [IGNORE_INDEX], []
                for w in range(start, end):
                    firsts.append(len(ids))
                    labels += [label_ids[tags[w]]] + [IGNORE_INDEX] * (len(word_pieces[w]) - 1)
                    ids += word_pieces[w]
                ids.append(sep_id)
                labels.append(IGNORE_INDEX)
                features.append(
                    {
                        "input_ids": ids,
                        "token_type_ids": [0] * len(ids),
                        "attention_mask": [1] * len(ids),
                        "labels": labels,
                        "_example": n,
                        "_first_word": start,
                        "_word_positions": firsts,
                    }
                )
                start = end
        return features

    def loss(self, model, batch):
        logits = head_logits(model, batch)
        labels = batch["labels"]
        total = token_loss(logits, labels, reduction="sum")
        return total, (labels != IGNORE_INDEX).sum()

    def units(self, batch) -> int:
        return int((batch["labels"] != IGNORE_INDEX).sum())

    def outputs(self, model, batch):
        return {"logits": head_logits(model, batch)}

    def predictions(self, examples, features, outputs) -> list[list[str]]:
        names = self.labels()
        best = outputs["logits"].argmax(-1)  # (features, S)
        tags = [["O"] * len(e.words) for e in examples]
        for f, feature in enumerate(features):
            row = tags[feature["_example"]]
            for k, position in enumerate(feature["_word_positions"]):
                row[feature["_first_word"] + k] = names[int(best[f, position])]
        return tags

    def score(self, examples, predictions) -> dict[str, float]:
        if self.tagset:  # POS: token accuracy
            return {"accuracy": metrics.accuracy(
                [t for p in predictions for t in p], [t for e in examples for t in e.tags]
            )}  # fmt: skip
        # Both sides in IOB2, so token accuracy compares like with like when the file is IOB1
        # (the entity figures do not depend on the scheme).
        return metrics.entity_scores(
            [to_iob2(p) for p in predictions], [to_iob2(e.tags) for e in examples]
        )

    def write_predictions(self, examples, predictions, path: Path) -> Path:
        """conlleval's input: `token [POS chunk] gold predicted`, a blank line between
        sentences; `perl conlleval < path` gives the same figures as `score`."""
        with open(path, "w", encoding="utf-8") as out:
            for example, tags in zip(examples, predictions, strict=True):
                columns = example.columns or [()] * len(example.words)
                for word, middle, gold, predicted in zip(
                    example.words, columns, example.tags, tags, strict=False
                ):
                    out.write(" ".join([word, *middle, gold, predicted]) + "\n")
                out.write("\n")
        return path
