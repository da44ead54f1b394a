"""Pre-training instances: NSP segment pairs and MLM masks, as the paper and Google's
`create_pretraining_data.py` make them. Pure functions of numpy arrays and an explicit
`numpy.random.Generator`, so they can be tested by statistics.

An instance is a row of `SPAN_FIELDS`: segment A and segment B as token ranges of the shards
(whole sentences, contiguous, then truncated), and whether B is a random segment. Three changes
to Google's code, each to make the paper's figures hold exactly:

- the random B comes from a document drawn uniformly among the *other* documents (Google tries
  10 draws and may still take A's own document);
- a chunk of a single sentence that draws "IsNext" is split at a token boundary into A and its
  actual continuation B (Google forces it to "NotNext", pulling IsNext below 50%);
- the number of masked tokens is 15% of the maskable ones with stochastic rounding (Google rounds
  15% of a length that counts [CLS] and [SEP]: about 15.4% of the maskable tokens at length 128).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# shard_a, a_start, a_end, shard_b, b_start, b_end, is_random_next (b_start == b_end: no B)
SPAN_FIELDS = ("shard_a", "a_start", "a_end", "shard_b", "b_start", "b_end", "is_random_next")
OBJECTIVES = ("mlm+nsp", "mlm", "ltr")


def special_token_budget(objective: str) -> int:
    """[CLS] A [SEP] B [SEP] with NSP, [CLS] A [SEP] otherwise (BERT's; a tokenizer of the
    family says its own: `PretrainingData`)."""
    return 3 if objective == "mlm+nsp" else 2


def document_instances(
    shard: int,
    bounds: np.ndarray,
    document: int,
    num_documents: int,
    random_document: Callable[[int], tuple[int, np.ndarray]],
    rng: np.random.Generator,
    *,
    max_seq_length: int = 128,
    short_seq_prob: float = 0.1,
    objective: str = "mlm+nsp",
    specials: int | None = None,
) -> list[tuple[int, int, int, int, int, int, int]]:
    """Instances from one document.

    `bounds` holds the token offsets of the document's sentences (start of each, then the end);
    `random_document(d)` returns (shard, bounds) of document d. Segments are runs of whole
    sentences up to a target length (`max_seq_length` minus the `specials` tokens, default
    `special_token_budget(objective)`, or with
    probability `short_seq_prob` a random shorter one); with NSP, A is a random prefix of the run
    and B is the rest (IsNext) or, with probability 0.5, a run from another document (NotNext),
    the unused sentences being put back.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    nsp = objective == "mlm+nsp"
    if nsp and num_documents < 2:
        raise ValueError("next-sentence prediction needs at least 2 documents")
    max_tokens = max_seq_length - (
        special_token_budget(objective) if specials is None else specials
    )
    if max_tokens < 2:
        raise ValueError(f"max_seq_length {max_seq_length} leaves no room for segments")
    lengths = np.diff(bounds).tolist()
    starts = bounds.tolist()
    count = len(lengths)
    target = max_tokens
    if rng.random() < short_seq_prob:
        target = int(rng.integers(2, max_tokens + 1))
    out = []
    chunk_start = 0
    current = 0
    i = 0
    while i < count:
        current += lengths[i]
        if i == count - 1 or current >= target:
            chunk = i - chunk_start + 1
            if not nsp:
                a_start, a_end = _truncate_one(starts[chunk_start], starts[i + 1], max_tokens, rng)
                out.append((shard, a_start, a_end, shard, a_end, a_end, 0))
            else:
                a_sentences = int(rng.integers(1, chunk)) if chunk >= 2 else 1
                a_start, a_end = starts[chunk_start], starts[chunk_start + a_sentences]
                random_next = rng.random() < 0.5
                if not random_next and chunk == 1:
                    if a_end - a_start >= 2:  # split the lone sentence: B is its actual rest
                        cut = a_start + int(rng.integers(1, a_end - a_start))
                        b_shard, b_start, b_end, a_end = shard, cut, a_end, cut
                    else:
                        random_next = True
                elif not random_next:
                    b_shard, b_start, b_end = shard, a_end, starts[i + 1]
                if random_next:
                    other = int(rng.integers(num_documents - 1))
                    other += other >= document  # uniform over the other documents
                    b_shard, other_bounds = random_document(other)
                    first = int(rng.integers(len(other_bounds) - 1))
                    wanted = target - (a_end - a_start)
                    reach = other_bounds[first + 1 :] - other_bounds[first]
                    last = min(int(np.searchsorted(reach, wanted)), len(reach) - 1)
                    b_start, b_end = int(other_bounds[first]), int(other_bounds[first + 1 + last])
                    i -= chunk - a_sentences  # put the unused sentences back
                a_start, a_end, b_start, b_end = truncate_pair(
                    a_start, a_end, b_start, b_end, max_tokens, rng
                )
                out.append((shard, a_start, a_end, b_shard, b_start, b_end, int(random_next)))
            chunk_start = i + 1
            current = 0
        i += 1
    return out


def truncate_pair(
    a_start: int, a_end: int, b_start: int, b_end: int, max_tokens: int, rng: np.random.Generator
) -> tuple[int, int, int, int]:
    """Google's `truncate_seq_pair`: while too long, drop one token from the longer segment
    (B on a tie), from its front or its back at random.

    >>> a0, a1, b0, b1 = truncate_pair(0, 6, 10, 12, 6, np.random.default_rng(0))
    >>> (a1 - a0, b1 - b0)
    (4, 2)
    """
    len_a, len_b = a_end - a_start, b_end - b_start
    excess = len_a + len_b - max_tokens
    if excess <= 0:
        return a_start, a_end, b_start, b_end
    # Closed form of the one-token-at-a-time loop: the longer shrinks to the other's length,
    # then B and A alternate, B first (a tie takes from B).
    gap = min(excess, abs(len_a - len_b))
    from_a = (gap if len_a > len_b else 0) + (excess - gap) // 2
    front = rng.random(excess) < 0.5
    a_front = int(front[:from_a].sum())
    b_front = int(front[from_a:].sum())
    a_start, a_end = a_start + a_front, a_end - (from_a - a_front)
    b_start, b_end = b_start + b_front, b_end - (excess - from_a - b_front)
    return a_start, a_end, b_start, b_end


def _truncate_one(
    start: int, end: int, max_tokens: int, rng: np.random.Generator
) -> tuple[int, int]:
    excess = end - start - max_tokens
    if excess <= 0:
        return start, end
    front = int((rng.random(excess) < 0.5).sum())
    return start + front, end - (excess - front)


def mask_tokens(
    ids: np.ndarray,
    maskable: np.ndarray,
    rng: np.random.Generator,
    *,
    mask_id: int,
    random_ids: np.ndarray,
    mask_prob: float = 0.15,
    max_predictions: int = 20,
    word_starts: np.ndarray | None = None,
    mask_token_prob: float = 0.8,
    random_token_prob: float = 0.1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Masked-LM corruption of one sequence: returns (corrupted ids, positions, original ids).

    `mask_prob` of the `maskable` positions (never [CLS], [SEP] or padding), at most
    `max_predictions`, are chosen (a fractional count rounds up or down at random, so the
    expected count is exact); each becomes [MASK] with probability `mask_token_prob` (the
    paper's 0.8), a token drawn from `random_ids` with `random_token_prob` (0.1), and stays itself
    otherwise (0.1). Held-out evaluation uses 1.0 / 0.0: every chosen piece is [MASK]. With
    `word_starts` (whole-word masking) the pieces of a word are chosen together, a word being a
    maskable start followed by its `##` pieces, as Google's `do_whole_word_mask`.

    >>> out, pos, labels = mask_tokens(np.array([2, 7, 8, 9, 3]), np.array([0, 1, 1, 1, 0], bool),
    ...     np.random.default_rng(0), mask_id=4, random_ids=np.arange(5, 10), mask_prob=2 / 3)
    >>> len(pos), bool(np.all(labels == np.array([2, 7, 8, 9, 3])[pos]))
    (2, True)
    """
    candidates = np.flatnonzero(maskable)
    if len(candidates) == 0:
        return ids.copy(), np.zeros(0, np.int64), np.zeros(0, ids.dtype)
    expected = len(candidates) * mask_prob
    wanted = int(expected) + int(rng.random() < expected - int(expected))
    wanted = max(1, min(wanted, max_predictions, len(candidates)))
    if word_starts is None:
        chosen = np.sort(rng.choice(candidates, wanted, replace=False))
    else:
        # a word starts at a maskable start piece, or wherever a maskable run begins
        begins = word_starts[candidates] | np.r_[True, np.diff(candidates) != 1]
        word_of = np.cumsum(begins) - 1
        sizes = np.bincount(word_of)
        first = np.flatnonzero(begins)
        picked, total = [], 0
        for word in rng.permutation(len(sizes)).tolist():
            if total >= wanted:
                break
            if total + sizes[word] > wanted:
                continue
            picked.append(word)
            total += sizes[word]
        chosen = np.sort(
            np.concatenate([candidates[first[w] : first[w] + sizes[w]] for w in picked])
        )
    labels = ids[chosen]
    roll = rng.random(len(chosen))
    corrupted = ids.copy()
    corrupted[chosen[roll < mask_token_prob]] = mask_id
    replace = chosen[(roll >= mask_token_prob) & (roll < mask_token_prob + random_token_prob)]
    corrupted[replace] = random_ids[rng.integers(len(random_ids), size=len(replace))]
    return corrupted, chosen.astype(np.int64), labels
