"""Unpadding: BERT's dense layers on real tokens only.

A padded batch is a (B, S) grid, and a quarter to a half of it is often padding. Attention needs
the grid (every token attends over its row), but the dense layers — the Q/K/V and output
projections and the feed-forward, nearly all of BERT's FLOPs — act on each token alone, so they
can run on just the real tokens, packed as rows. `TokenLayout` says where those rows sit in the
grid and moves tensors between the two shapes, and draws the dropout masks of its rows: by
default for the rows alone with `bertkit.core.dropout`'s parallel generator; with `parity`, on the
grid with torch's generator and taken at the real tokens, so that a seeded step gives the same
numbers on either path and the numbers transformers gives.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from bertkit._device import to_device
from bertkit.core import dropout as fast
from bertkit.core.rotary import local_attention, rotated


@dataclass
class TokenLayout:
    """Where the token rows a layer computes on sit in the (B, S) grid attention needs.

    Padded: every grid cell is a row, and the rows are kept in the grid's shape (B, S, H), so a
    dense layer is one 3-D matrix product; exported to ONNX that is a `MatMul`, which ONNX Runtime
    runs faster than the `Gemm` that (B*S, H) rows export to (all-MiniLM-L6-v2, 32 x 128 batch:
    docs/results/README.md, serving). Unpadded: only real tokens are rows, (N, H) with N the number
    of ones in the attention mask, so the dense layers, which hold nearly all of BERT's FLOPs,
    never compute on padding; attention scatters rows into the grid and gathers them back.
    """

    batch: int
    seq_len: int
    index: torch.Tensor | None = None  # (N,) positions in the flattened grid; None = all
    # positions among `index` that are rows only to round N up (`row_multiple`): zero in the grid
    added: torch.Tensor | None = None
    parity: bool = False  # dropout masks as transformers draws them (see `dropout`)
    # cells past the grid's end that rows rounding N up may sit in (`unpadded`'s `gather`):
    # `to_grid` drops them, and a gather reads the grid's last cell for them
    spare: int = 0
    # per sequence with rows, (first row, rows, keys): its rows are consecutive, and its first
    # `keys` rows are its real tokens (`unpadded`'s `by_sequence`); attention then runs on each
    # sequence's rows alone (`attend`), without the grid. None: attention takes the grid
    spans: tuple[tuple[int, int, int], ...] | None = None
    # a read layout's (`subset`'s `queries`) rows as cells of a (B, width) grid of queries:
    # each read row in its own sequence's line, so attention on the grid can ask its queries
    # alone (`to_queries`) against every key; None: the queries take the (B, S) grid
    queries: tuple[torch.Tensor, int] | None = None

    @classmethod
    def unpadded(
        cls,
        attention_mask: torch.Tensor,
        multiple: int = 1,
        parity: bool = False,
        gather: bool = False,
        by_sequence: bool = False,
    ) -> TokenLayout:
        """The real tokens' rows; with `multiple` > 1, padding cells are added (first ones
        first) until the row count is a multiple of it or the grid is full, so that the dense
        layers see few distinct shapes (see `row_multiple`). Outputs at real tokens do not
        change (a padding cell is a key no one attends to) and `to_grid` keeps padding zero.
        A mask without padding gives the padded layout (`index` None), unless `gather`.

        `gather`: one structure for every mask, as a compiled forward needs (each structure is
        a graph of its own): the real tokens always gathered, and rows rounding N up to
        `multiple` (below it, to a power of two) sit past the grid's end (`spare`), where
        nothing reads them, instead of in its padding cells (some rows added or none, and a
        grid without room for them).

        `by_sequence`: the layout gets `spans`, so that attention runs sequence by sequence on
        the rows (`attend`), where every sequence's real tokens come first (right padding);
        ignored with `gather`, and where a sequence has a token after padding."""
        flat = attention_mask.reshape(-1)
        index = flat.nonzero().squeeze(1)
        if gather:
            # (a short sentence alone is not 64 rows of work)
            n = len(index)
            extra = -n % multiple if n >= multiple else (1 << (n - 1).bit_length()) - n
            past = torch.arange(extra, device=flat.device) + flat.numel()
            index = torch.cat([index, past])
            batch, seq_len = attention_mask.shape[:2]
            return cls(batch, seq_len, index, None, parity, spare=multiple - 1)
        if len(index) == flat.numel():  # no padding: the grid itself, nothing to gather
            return cls(attention_mask.shape[0], attention_mask.shape[1], parity=parity)
        extra = min(-len(index) % multiple, flat.numel() - len(index))
        added = None
        if extra:
            added = (flat == 0).nonzero().squeeze(1)[:extra]
            index = torch.cat([index, added]).sort().values
        batch, seq_len = attention_mask.shape[:2]
        spans = _spans(attention_mask, index, seq_len) if by_sequence else None
        return cls(batch, seq_len, index, added, parity, spans=spans)

    def to(self, device: torch.device | str) -> TokenLayout:
        """This layout with its positions on `device` (to a GPU through pinned memory: a copy
        the host does not wait for)."""
        queries = None if self.queries is None else (_moved(self.queries[0], device),
                                                     self.queries[1])  # fmt: skip
        return dataclasses.replace(self, index=_moved(self.index, device),
                                   added=_moved(self.added, device), queries=queries)  # fmt: skip

    def to_rows(self, grid: torch.Tensor) -> torch.Tensor:  # (B, S, ...) -> (N, F) or (B, S, F)
        if self.index is None:
            return grid.reshape(self.batch, self.seq_len, -1)
        return _gather(grid.reshape(self.batch * self.seq_len, -1), self.index, self.spare)

    def _sources(self) -> torch.Tensor:
        """The grid cells the rows are read from: `index`, a spare row reading the last."""
        assert self.index is not None
        return self.index.clamp(max=self.batch * self.seq_len - 1) if self.spare else self.index

    @property
    def rows(self) -> int:
        return self.batch * self.seq_len if self.index is None else len(self.index)

    def dropout(
        self, rows: torch.Tensor, p: float, training: bool, within: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Dropout on this layout's rows, or on the rows at positions `within` among them (a
        last layer that computes only the rows read after it: the same masks there as if it
        computed all). By default the mask is drawn for these rows alone (`bertkit.core.dropout`).
        With `parity`, it is the mask the padded grid would draw with torch's generator, taken
        at the rows: a seeded run's random numbers then do not depend on unpadding or on what
        is read, and are what transformers draws for the same batch."""
        if not training or p == 0.0:
            return rows
        if not self.parity:
            if within is None:
                return fast.dropout(rows, p, True)
            mask = fast.mask_like(rows, (self.rows, rows.shape[-1]), p)
            return rows * mask.index_select(0, within)
        index = None if self.index is None else self._sources()
        if within is not None:
            index = within if index is None else index.index_select(0, within)
        if index is None:
            return F.dropout(rows, p, True)
        grid = rows.new_ones(self.batch * self.seq_len, rows.shape[-1])
        return rows * F.dropout(grid, p, True).index_select(0, index)

    def subset(
        self, keep: torch.Tensor, multiple: int = 1, queries: bool = False
    ) -> tuple[torch.Tensor, TokenLayout]:
        """The rows of this layout at the grid cells where `keep` (B, S) is true, and the layout
        of just those rows (with `multiple`: and more of this layout's rows, as `unpadded`,
        which `to_grid` leaves zero; with `queries`: and where they sit in a grid of queries,
        `to_queries`)."""
        flat = keep.reshape(-1)
        sources = None if self.index is None else self._sources()
        chosen = flat if sources is None else flat.index_select(0, sources)
        if self.spare:  # rows past the grid are never chosen, nor added (`multiple` is 1)
            assert multiple == 1, "a layout with spare rows is read without rounding"
            chosen = chosen & (sources == self.index)
        rows = chosen.nonzero().squeeze(1)
        extra = min(-len(rows) % multiple, len(chosen) - len(rows))
        added = None
        if extra:
            more = (~chosen).nonzero().squeeze(1)[:extra]
            rows = torch.cat([rows, more]).sort().values
            added = more if self.index is None else self.index.index_select(0, more)
        index = rows if self.index is None else self.index.index_select(0, rows)
        cells = None
        if queries:
            extras = None if added is None else torch.isin(index, added)
            cells = _query_cells(index, extras, self.batch, self.seq_len)
        return rows, TokenLayout(self.batch, self.seq_len, index, added, self.parity,
                                 queries=cells)  # fmt: skip

    def to_queries(self, rows: torch.Tensor) -> torch.Tensor:  # (R, F) -> (B, width, F)
        """A read layout's rows (`queries`) in their grid of queries, zeros in its free cells."""
        assert self.queries is not None, "a layout without `queries`"
        cells, width = self.queries
        grid = rows.new_zeros(self.batch * width, rows.shape[-1])
        grid.index_copy_(0, cells, rows)
        return grid.view(self.batch, width, -1)

    def drop_queries(self, probs: torch.Tensor, p: float) -> torch.Tensor:
        """Dropout on attention probabilities (B, A, width, S) of the queries in `to_queries`'s
        grid: by default the elements the (B, A, S, S) grid's mask has at those queries' rows
        (`bertkit.core.dropout.mask_at`), so that the masks do not depend on what is read."""
        assert self.queries is not None and self.index is not None, "a layout of read rows"
        batch, heads, width, keys = probs.shape
        cells, seq_len = self.queries[0], self.seq_len
        at = torch.zeros(batch * width, dtype=torch.long, device=cells.device)
        at[cells] = self.index % seq_len  # each query's position in its sequence
        lines = torch.arange(batch * heads, device=cells.device).view(batch, heads, 1, 1)
        rows = lines * seq_len + at.view(batch, 1, width, 1)
        index = rows * keys + torch.arange(keys, device=cells.device)
        return probs * fast.mask_at(probs, (batch, heads, seq_len, keys), index, p)

    def from_queries(self, grid: torch.Tensor) -> torch.Tensor:  # (B, width, ...) -> (R, F)
        assert self.queries is not None, "a layout without `queries`"
        cells, width = self.queries
        return _gather(grid.reshape(self.batch * width, -1), cells)

    def attend(
        self,
        q: torch.Tensor,  # (N, H) rows, heads side by side
        k: torch.Tensor,
        v: torch.Tensor,
        heads: int,
        scale: float,
        dropout_p: float = 0.0,
        within: torch.Tensor | None = None,  # (R,) sorted rows: q holds only their queries
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,  # (cos, sin) (S, D): ModernBERT
        reach: int | None = None,  # a sliding layer's: keys at most this far from the query
    ) -> torch.Tensor:  # (N or R, H): softmax(q k^T scale) v over each sequence's real tokens
        """Attention over each sequence's own rows, by `spans`: no grid to scatter the rows into
        and gather them back from, no padded keys, no mask. On the CPU that takes 0.5-0.7 of the
        time of SDPA's flash kernel on the padded grid (docs/results/embeddings): the kernel's cost
        follows the grid's cells, it computes every padded key, and its small blocks (32 or 64
        queries, head size 32 or 64) run far below the matrix-product rate. Scores and softmax
        in fp32 whatever q's dtype (as SDPA's kernel keeps them), autocast off; the weighted
        sum in v's dtype. `dropout_p` drops probabilities with `bertkit.core.dropout`'s masks.
        `within`: q (R, H) holds the queries of these rows only (a last layer whose output is
        read at a few rows: `BertModel.forward`'s `read_cls_only`, `read_positions`), and only
        their context comes back; keys and values are every row's. `rotary`: queries and keys
        turned by their positions in their own sequence; `reach`: a sliding window, each
        sequence's keys chunk by chunk (`rotary.local_attention`), never a padded grid's
        (ModernBERT's; neither with `within`)."""
        assert self.spans is not None, "a layout without spans attends on the grid"
        assert within is None or (rotary is None and reach is None)
        rows, hidden = q.shape
        size = hidden // heads
        queries = [(first, count) for first, count, _ in self.spans]
        if within is not None:  # each span's rows among `within`: consecutive, as it is sorted
            firsts = torch.tensor([first for first, _ in queries])
            starts = torch.searchsorted(within, firsts).tolist()
            ends = torch.searchsorted(within, firsts + torch.tensor([c for _, c in queries]))
            queries = [(a, b - a) for a, b in zip(starts, ends.tolist(), strict=True)]

        def heads_of(t: torch.Tensor, first: int, n: int) -> torch.Tensor:  # -> (A, n, D)
            return t[first : first + n].view(n, heads, size).transpose(0, 1)

        differentiable = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        with torch.autocast(q.device.type, enabled=False):
            q = q.float() * scale  # once for every row, instead of on every sequence's scores
            k = k.float()
            out = None if differentiable else v.new_empty(rows, hidden)
            pieces = []
            for (first, _, keys), (at, count) in zip(self.spans, queries, strict=True):
                if not count:
                    continue
                asked, known = heads_of(q, at, count), heads_of(k, first, keys)
                if rotary is not None:  # positions 0 .. keys - 1 of this sequence; the rows
                    # added after it (`row_multiple`) have none and are read by nothing
                    turn = (rotary[0][:keys], rotary[1][:keys])
                    asked, known = rotated(asked[:, :keys], turn), rotated(known, turn)
                if reach is not None:
                    context = local_attention(asked[None], known[None],
                                              heads_of(v, first, keys)[None], None, reach, 1.0,
                                              dropout_p, dropout_p > 0.0)[0]  # fmt: skip
                elif keys >= SDPA_FROM and dropout_p == 0.0:  # (A, n, n) scores too big to hold
                    context = F.scaled_dot_product_attention(  # (4-D: its flash kernel)
                        asked[None],
                        known[None],
                        heads_of(v, first, keys).float()[None],
                        scale=1.0,
                    )[0].to(v.dtype)
                else:
                    probs = torch.bmm(asked, known.transpose(1, 2)).softmax(dim=-1)
                    if dropout_p > 0.0:
                        probs = fast.dropout(probs, dropout_p, True)
                    context = torch.bmm(probs.to(v.dtype), heads_of(v, first, keys))
                if context.shape[1] < count:  # (rotary: zeros at the added rows)
                    context = F.pad(context, (0, 0, 0, count - context.shape[1]))
                context = context.transpose(0, 1)  # (n, A, D)
                if out is None:
                    pieces.append(context.reshape(count, hidden))
                else:
                    out[at : at + count].view(count, heads, size).copy_(context)
        return torch.cat(pieces) if out is None else out

    def to_grid(self, rows: torch.Tensor) -> torch.Tensor:  # rows -> (B, S, F), zeros at padding
        if self.index is not None:
            cells = self.batch * self.seq_len
            # in place into the fresh zeros: the out-of-place forms copied the whole grid once
            # more each (three times a layer, for q, k and v); autograd saves neither's input
            grid = rows.new_zeros(cells + self.spare, rows.shape[-1])
            grid.index_copy_(0, self.index, rows)
            if self.added is not None:
                grid.index_fill_(0, self.added, 0)
            rows = grid[:cells] if self.spare else grid
        return rows.view(self.batch, self.seq_len, rows.shape[-1])


def _gather(flat: torch.Tensor, index: torch.Tensor, spare: int = 0) -> torch.Tensor:
    """The rows of `flat` at distinct cells `index` (spare ones past its end reading its last):
    `_Gather` where a gradient flows, a plain select in inference (what ONNX export traces)."""
    if torch.is_grad_enabled() and flat.requires_grad:
        return _Gather.apply(flat, index, spare)
    return flat.index_select(0, index.clamp(max=flat.shape[0] - 1) if spare else index)


class _Gather(torch.autograd.Function):
    """`index_select` of distinct grid cells, whose gradient is a scatter without adding.

    index_select's backward is `index_add`, which adds with atomics because indices may repeat:
    on an H200 it was 4.8% of a compiled BERT-base step (13 calls a step at 178 us each, bf16;
    docs/results/gpu). A layout's cells are distinct, so the gradient is each row's own, copied
    into zeros (`index_copy_`, as `to_grid` does): the same numbers, bit for bit. Spare rows read
    the grid's last cell (`sources`), but their gradient goes past the grid's end (`index`) and
    is dropped, so it cannot overwrite that cell's. (The sources are worked out here, not
    passed: dynamo cannot trace a Function given one tensor twice, as `index` and `sources`
    are without spare rows, and broke the compiled graph there.)"""

    @staticmethod
    def forward(ctx: Any, flat: torch.Tensor, index: torch.Tensor, spare: int) -> torch.Tensor:
        ctx.save_for_backward(index)
        ctx.cells, ctx.spare = flat.shape[0], spare
        return flat.index_select(0, index.clamp(max=flat.shape[0] - 1) if spare else index)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (index,) = ctx.saved_tensors
        cells = grad.new_zeros(ctx.cells + ctx.spare, grad.shape[-1])
        cells.index_copy_(0, index, grad)
        return (cells[: ctx.cells] if ctx.spare else cells), None, None


def _spans(
    attention_mask: torch.Tensor, index: torch.Tensor, seq_len: int
) -> tuple[tuple[int, int, int], ...] | None:
    """`TokenLayout.spans` of rows at grid cells `index` (sorted), or None where a sequence's
    real tokens are not its first cells (a token after padding)."""
    mask = attention_mask.reshape(-1, seq_len).bool()
    keys = mask.sum(1)
    if not torch.equal(mask, torch.arange(seq_len, device=mask.device) < keys[:, None]):
        return None
    counts = torch.bincount(index // seq_len, minlength=mask.shape[0])
    firsts = counts.cumsum(0) - counts
    return tuple((f, c, k) for f, c, k in zip(firsts.tolist(), counts.tolist(), keys.tolist(),
                                                strict=True) if c)  # fmt: skip


def _query_cells(
    index: torch.Tensor, extras: torch.Tensor | None, batch: int, seq_len: int
) -> tuple[torch.Tensor, int]:
    """`TokenLayout.queries` of rows at grid cells `index` (sorted): a read row at its
    sequence's line of a (batch, width) grid, in order; rows that only round the count up
    (`extras`, a mask over the rows: nothing reads them) in the cells left over, so that they
    do not widen the grid."""
    real = index if extras is None else index[~extras]
    lines = real // seq_len
    counts = torch.bincount(lines, minlength=batch)
    width = max(int(counts.max()) if len(real) else 0, -(-len(index) // batch), 1)
    slots = torch.arange(len(real), device=index.device) - (counts.cumsum(0) - counts)[lines]
    placed = lines * width + slots
    if extras is None:
        return placed, width
    cells = torch.empty_like(index)
    cells[~extras] = placed
    free = torch.ones(batch * width, dtype=torch.bool, device=index.device)
    free[placed] = False
    cells[extras] = free.nonzero().squeeze(1)[: int(extras.sum())]
    return cells, width


@dataclass
class Layouts:
    """The token layouts of one forward (`BertModel.layouts`): the layers' `rows`; `read`, the
    last layer's rows and layout when only some positions are read after it (None: all); and
    whether attention takes the padding mask (`masked`; False when there is no padding)."""

    rows: TokenLayout
    read: tuple[torch.Tensor, TokenLayout] | None = None
    masked: bool = True

    def to(self, device: torch.device | str) -> Layouts:
        read = (
            None if self.read is None else (_moved(self.read[0], device), self.read[1].to(device))
        )
        return Layouts(self.rows.to(device), read, self.masked)


def _moved(tensor: Any, device: torch.device | str) -> Any:
    return None if tensor is None else to_device(tensor, device)


def row_multiple(device: torch.device) -> int:
    """What the unpadded row count is rounded up to: 64 under CPU autocast, else 1. On CPU, bf16
    matrix products go through oneDNN, which builds and keeps a kernel for every new shape; with
    a row count that changes every step, memory kept growing (all-MiniLM-L6-v2 fine-tuned on
    MRPC in bf16, `benchmarks/finetune_vs_user.py --sides bertkit-bf16`: 5 GB and 269 s;
    rounded: 2.2 GB at most and 209 s, the same dev scores). A 32 x 128 batch then has at most
    64 row counts, for at most 63 extra rows of work a step."""
    autocast = device.type == "cpu" and torch.is_autocast_enabled("cpu")
    return 64 if autocast else 1


# From this many keys a sequence attends with SDPA's kernel, which holds no (A, n, n) scores:
# 12 heads of 8,192 keys would hold 3.2 GB of them in fp32 (ModernBERT's long inputs).
SDPA_FROM = 1024


def by_sequence_from(device: torch.device) -> int | None:
    """The narrowest (B, S) grid, in S, from which inference attends sequence by sequence on the
    rows (`TokenLayout.attend`) instead of on the grid (SDPA's kernel, or under bf16 batched
    products: `model._attention_by_products`); None: never (not the CPU). The loop over the
    rows costs some 40 us a sequence, which narrow grids do not win back. By
    benchmarks/attention_by_sequence.py (32 sequences of S/2 to S tokens, 12 heads of 32, AMD
    EPYC Zen 5, 2 threads, five runs), against SDPA: in fp32 it won from 48 on, either way at
    32; in bf16 from 96 on, either way at 48 to 80. With lengths of 0.9 S to S (length-sorted
    prediction batches) it still won, 1.11-1.51x from 48 to 384. Under bf16 the grids below it
    now take the batched products, and against them 48 beat 96 end to end (`Embedder`,
    all-MiniLM-L6-v2, 1,024 texts of two to four SST-2 sentences, alternated, medians of 6-10
    rounds: 1.08-1.17x in five runs of six, 0.99x in one; 32 and 64 gained less): one width.

    Training keeps the grid. With the backward (`--training`) the rows' loop won only on wide,
    much padded grids (fp32 from 160, bf16 from 256), and in the fine-tuning loop, whose batches
    are sorted by length in buckets, SQuAD under bf16 autocast trained slower by sequence
    (123-131 s against 101-110 s for the same steps, 6.5 GB resident against 4.5;
    docs/results/embeddings)."""
    return 48 if device.type == "cpu" else None
