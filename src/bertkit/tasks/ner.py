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
from pathlib import Path

from bertkit.tasks.base import DataError, read_text, require_file
from bertkit.tasks.tagging import TaggedSentence, WordTagger, iob_labels, to_iob2

__all__ = ["ConllTask", "TaggedSentence", "read_conll", "to_iob2"]

ENTITY_TYPES = ("LOC", "MISC", "ORG", "PER")
CHUNK_TYPES = ("ADJP", "ADVP", "CONJP", "INTJ", "LST", "NP", "PP", "PRT", "SBAR", "UCP", "VP")
POS_TAGS = (
    '"', "''", "$", "(", ")", ",", ".", ":", "CC", "CD", "DT", "EX", "FW", "IN", "JJ", "JJR",
    "JJS", "LS", "MD", "NN", "NN|SYM", "NNP", "NNPS", "NNS", "PDT", "POS", "PRP", "PRP$", "RB",
    "RBR", "RBS", "RP", "SYM", "TO", "UH", "VB", "VBD", "VBG", "VBN", "VBP", "VBZ", "WDT", "WP",
    "WP$", "WRB", "``",
)  # fmt: skip
SPLIT_FILES = {"train": "train.txt", "dev": "valid.txt", "test": "test.txt"}


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


class ConllTask(WordTagger):
    """NER by default; `ConllTask("pos")` / `ConllTask("chunk")` tag the other columns."""

    name = "conll2003"
    metrics: tuple[str, ...] = ("f1", "precision", "recall")
    column: int = -1
    kinds: tuple[str, ...] = ENTITY_TYPES
    tagset: tuple[str, ...] | None = None

    def __init__(self, column: str = "ner") -> None:
        if column == "pos":
            self.name, self.metrics = "conll2003-pos", ("accuracy",)
            self.column, self.kinds, self.tagset = 1, (), POS_TAGS
            self.scheme = "plain"
        elif column == "chunk":
            self.name, self.column, self.kinds = "conll2003-chunk", 2, CHUNK_TYPES
        elif column != "ner":
            raise ValueError(f"CoNLL-2003 columns are ner, pos and chunk, not {column!r}")

    def labels(self) -> list[str]:
        return list(self.tagset) if self.tagset else iob_labels(self.kinds)

    def read(self, data_dir, split: str) -> list[TaggedSentence]:
        if split not in SPLIT_FILES:
            raise ValueError(f"{self.name} has no split {split!r}; it has {sorted(SPLIT_FILES)}")
        return read_conll(
            require_file(Path(data_dir) / SPLIT_FILES[split], "CoNLL-2003"),
            self.kinds,
            self.column,
            self.tagset,
        )

    def conll_columns(self, path, found, width, options) -> tuple[int, int | None]:
        """CoNLL-2003's layout (word POS chunk NER): this task's column; a file of a word and
        one tag a line: that tag, for NER; else no tags."""
        if width >= 4 or (self.column == -1 and width > 1):
            return 0, self.column % width
        return 0, None

    def score(self, examples, predictions) -> dict[str, float]:
        return self.tag_figures(examples, predictions)

    def prediction_file(self, split: str) -> str:
        return f"predictions_{split}.conll"

    def write_predictions(self, examples, predictions, path: Path) -> Path:
        """conlleval's input: `token [POS chunk] gold predicted`, a blank line between
        sentences; `perl conlleval < path` gives the same figures as `score`."""
        with open(path, "w", encoding="utf-8") as out:
            for example, tags in zip(examples, predictions, strict=True):
                columns = example.columns or [()] * len(example.words)
                gold = example.tags or ["O"] * len(example.words)
                for word, middle, gold_tag, predicted in zip(
                    example.words, columns, gold, tags, strict=False
                ):
                    out.write(" ".join([word, *middle, gold_tag, predicted]) + "\n")
                out.write("\n")
        return path
