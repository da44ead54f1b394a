"""What the one path from text to vectors (`inference.embedder.Embedder`) takes: a text, a pair
of texts, or the model's own token ids (`Ids`) — kept apart from the embedder so that the
server's request parsing names them without loading a model's code."""

from __future__ import annotations


class Ids(tuple):
    """A text given as the model's own token ids (its [CLS] and [SEP] included, as the model's
    tokenizer writes them), run as they are (cut to the length).

    >>> Ids([101, 7592, 102])
    (101, 7592, 102)
    """


Text = str | tuple[str, str] | Ids  # a text, a pair of texts, or the model's token ids
