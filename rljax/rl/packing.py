"""Sequence packing for an update: the whole sequences of a mini-batch's rows, put back to
back into as few rows as hold them, so the forward and backward run on fewer padding
tokens; and the samples of one prompt packed as one prompt and their continuations, so
the prompt's tokens run once instead of once per sample.

A mini-batch of B right-padded rows of T positions becomes B / f rows of f T positions
(`row_factor`: f = 2 where it divides a device's share of a micro-batch, else 1). Rows
twice as long hold any two sequences (a sequence is at most T), so they pack well even
when most sequences pass T / 2; attention, quadratic in the row, is a small share of the
FLOPs at these lengths. The shape is static per row length: it compiles as the unpacked
one does.

Each packed row numbers its segments 1, 2, ... in `segment_ids` (0: padding), so
attention stays within a segment, and `positions` are each token's position in its own
sequence (`rljax.models.transformer.Decoder`). A segment is one sequence, or with
`share_prompts` samples of one prompt (rows with the same tokens before their first
response token, at P): the prompt's first P - 1 tokens once (branch 0), then per row its
tokens from P - 1 on (branches 1, 2, ...) in `branch_ids`. Each branch sees the prompt
and itself (`rljax.models.attention.branch_mask`); it repeats the prompt's last token,
whose hidden state predicts the branch's first response token.

Placement is first-fit decreasing, largest prompt group first, row by row (longest
first): a row goes to the first packed row that already holds its prompt and has room for
its tail, else to the first with room for the prompt and its tail, else to a new one. A
prompt's samples may so spread over several packed rows, each holding the prompt once.

The filled rows go to the first micro-batches (`rljax.train.steps.split_micro_batches`
gives micro-batch m the rows m, M + m, ...), spread evenly over the data-parallel
devices, and the micro-batches left with no token are skipped by the train step
(`make_train_step(live=...)`). The update therefore runs as many micro-batches as the
packed rows fill instead of M.

Per-token arrays move with their tokens (`pack`; a shared prompt token takes one of its
rows' values: they agree on the tokens and the recorded routing, and no other field
enters the loss at a prompt position); an output per packed token comes back to every
source token that maps to it (`unpack`). The loss is unchanged exactly when every term of the objective is a sum of
per-token values over a mini-batch-wide denominator and the prompt positions carry no
loss (`rljax.rl.actor_critic.packs_sequences`). verl's `use_remove_padding` with a
dynamic batch size packs the same way under dynamic shapes; here the shapes stay static
and only the count of micro-batches that run varies.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from rljax.rl.batch import present

V = TypeVar("V")

# the value of a packed row's padding per field; 0 for every other field
PAD_VALUES = {"expert_ids": -1}  # no recorded routing: the router's own top-k


PACKED_FIELDS = ("segment_ids", "positions")  # what packing adds to a view; and "branch_ids" with shared prompts

ROW_FACTOR = 2  # a packed row is this many source rows long, where a micro-batch's rows allow it


def row_factor(micro_rows: int, devices: int) -> int:
    """The length of a packed row in source rows (`ROW_FACTOR`), for micro-batches of
    `micro_rows` rows over `devices` data-parallel devices: each device must keep a whole
    number of packed rows per micro-batch, else 1."""
    return ROW_FACTOR if (micro_rows // devices) % ROW_FACTOR == 0 else 1


@dataclass(frozen=True)
class Packing:
    """Where every real token of N source rows sits in the packed rows."""

    source: tuple[np.ndarray, np.ndarray]  # (row, column) of every real source token
    dest: tuple[np.ndarray, np.ndarray]  # (row, column) of its packed token; prompt tokens of one prompt share one
    segment: np.ndarray  # per source token, its item's segment id in the packed row (1, 2, ...)
    branch: np.ndarray  # per source token, its branch (0: one sequence, or a shared prompt)
    source_shape: tuple[int, int]  # (N, T) of the source rows
    shape: tuple[int, int]  # (N / f, f T) of the packed rows
    micro_batches: int  # the micro-batches that hold a token (the ones the train step runs)
    shared: bool  # prompts may be shared: the packed batch carries `branch_ids`


def row_prompts(input_ids: np.ndarray, response_mask: np.ndarray, expert_ids: np.ndarray | None = None
                ) -> list[list[int]]:
    """Rows grouped by prompt: the same tokens (and recorded routing) before their first
    response token, with at least 2 of them; rows without a response token stand alone."""
    groups: dict[tuple, list[int]] = {}
    for i, mask in enumerate(np.asarray(response_mask) > 0):
        first = int(np.argmax(mask)) if mask.any() else 0
        if first < 2:
            groups[("row", i)] = [i]
            continue
        key = (first, input_ids[i, :first].tobytes(), b"" if expert_ids is None else expert_ids[i, :first].tobytes())
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def plan_packing(attention_mask: np.ndarray, micro_rows: int, devices: int = 1, factor: int = 1,
                 prompts: list[list[int]] | None = None, response_mask: np.ndarray | None = None) -> Packing:
    """First-fit-decreasing packing (see the module) of `[N, T]` right-padded rows (their
    real tokens are a prefix) into N / `factor` rows of `factor` T, placed for micro-batches of
    `micro_rows` source rows (N / micro_rows of them) split over `devices` data-parallel
    devices. `prompts` (`row_prompts`, with the `response_mask` it read): share each
    group's prompt among its rows. Deterministic: every process computes the same packing
    from the same batch."""
    mask = np.asarray(attention_mask) > 0
    n, t = mask.shape
    length = mask.sum(axis=1)
    prefix = np.arange(t)[None, :] < length[:, None]
    if not np.array_equal(mask, prefix):
        bad = int(np.flatnonzero((mask != prefix).any(axis=1))[0])
        raise ValueError(f"packing: row {bad} is not right-padded (its attention_mask has a gap)")
    if n % micro_rows or micro_rows % (devices * factor):
        raise ValueError(f"packing: {n} rows do not split into micro-batches of {micro_rows} rows over "
                         f"{devices} devices, {factor} rows to a packed row")
    capacity = factor * t
    # a group: rows whose first `shared` tokens are held once per packed row (0: a row alone)
    groups = [(rows, _shared_tokens(rows, response_mask) if len(rows) > 1 else 0)
              for rows in (prompts or [[i] for i in range(n)])]
    sizes = [shared + sum(int(length[r]) - shared for r in rows) for rows, shared in groups]
    used: list[int] = []  # tokens placed in each packed row so far
    segments: list[dict[int, list[int]]] = []  # per packed row: group -> its rows there, in placement order
    for g in np.argsort(-np.asarray(sizes), kind="stable"):
        rows, shared = groups[g]
        for r in sorted(rows, key=lambda r: -int(length[r])):
            tail = int(length[r]) - shared
            b = next((b for b, u in enumerate(used) if g in segments[b] and u + tail <= capacity), None)
            if b is None:  # a packed row with room for the shared tokens too, else a new one
                b = next((b for b, u in enumerate(used) if u + shared + tail <= capacity), len(used))
                if b == len(used):
                    used.append(0)
                    segments.append({})
                segments[b][g] = []
                used[b] += shared
            segments[b][g].append(r)
            used[b] += tail
    # packed row b: micro-batch b // per_micro, its (b % per_micro)-th slot in an order that
    # deals slots to the devices in turn; global row = slot * M + micro-batch
    num_micro, per_micro = n // micro_rows, micro_rows // factor
    k = np.arange(per_micro)
    slot = (k % devices) * (per_micro // devices) + k // devices
    src_row, src_col, dst_row, dst_col, segment, branch = ([] for _ in range(6))

    def place(rows, begin, end, dest_row, column, seg, br):
        span = np.arange(begin, end)
        for row in rows:
            src_row.append(np.full(len(span), row))
            src_col.append(span)
            dst_row.append(np.full(len(span), dest_row))
            dst_col.append(column + span - begin)
            segment.append(np.full(len(span), seg))
            branch.append(np.full(len(span), br))
        return column + len(span)

    for b, held in enumerate(segments):
        dest_row, column = slot[b % per_micro] * num_micro + b // per_micro, 0
        for seg, (g, rows) in enumerate(held.items(), start=1):
            shared = groups[g][1]
            if not shared:  # one sequence
                column = place(rows, 0, int(length[rows[0]]), dest_row, column, seg, 0)
                continue
            column = place(rows, 0, shared, dest_row, column, seg, 0)  # the prompt once for these rows
            for br, r in enumerate(rows, start=1):
                column = place([r], shared, int(length[r]), dest_row, column, seg, br)
    src_row, src_col, dst_row, dst_col, segment, branch = (np.concatenate(x) for x in (
        src_row, src_col, dst_row, dst_col, segment, branch))
    return Packing((src_row, src_col), (dst_row, dst_col), segment, branch, (n, t), (n // factor, capacity),
                   -(-len(used) // per_micro), prompts is not None)


def _shared_tokens(rows: list[int], response_mask: np.ndarray) -> int:
    """The tokens a group of rows holds once: its prompt but the prompt's last token."""
    return int(np.argmax(np.asarray(response_mask)[rows[0]] > 0)) - 1


def pack_rows(view: V, micro_rows: int, devices: int, factor: int, share_prompts: bool) -> tuple[V, Packing]:
    """`view` (host arrays) packed for micro-batches of `micro_rows` rows over `devices`
    devices into rows `factor` rows long, prompts shared among their rows when
    `share_prompts`; and its `Packing`."""
    prompts = None
    if share_prompts:
        prompts = row_prompts(np.asarray(view.input_ids), view.response_mask, getattr(view, "expert_ids", None))
    packing = plan_packing(view.attention_mask, micro_rows, devices, factor, prompts, view.response_mask)
    return pack(view, packing), packing


def pack(view: V, packing: Packing) -> V:
    """`view` (a dataclass of `[N, T, ...]` host arrays with `segment_ids`, `positions`
    and `branch_ids` fields) with its tokens in the packed rows; padding holds 0
    (`PAD_VALUES` for some fields); `branch_ids` only where prompts may be shared."""
    (src_row, src_col), dest = packing.source, packing.dest
    out = {}
    for name, x in present(view).items():
        x = np.asarray(x)
        if x.shape[:2] != packing.source_shape:
            raise ValueError(f"packing: field {name!r} is {x.shape}, not per token {packing.source_shape}")
        packed = np.full((*packing.shape, *x.shape[2:]), PAD_VALUES.get(name, 0), x.dtype)
        packed[dest] = x[src_row, src_col]
        out[name] = packed
    for name, values in (("segment_ids", packing.segment), ("positions", src_col), ("branch_ids", packing.branch)):
        if name != "branch_ids" or packing.shared:
            out[name] = np.zeros(packing.shape, np.int32)
            out[name][dest] = values
    return dataclasses.replace(view, **out)


def unpack(x: np.ndarray, packing: Packing) -> np.ndarray:
    """A per-token output of the packed rows `[N / f, f T, ...]` -> per source row `[N, T,
    ...]`: every source token gets its packed token's value (a shared prompt's, each of
    its rows), 0 at padding."""
    out = np.zeros((*packing.source_shape, *x.shape[2:]), x.dtype)
    out[packing.source] = x[packing.dest]
    return out
