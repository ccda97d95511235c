"""Sequence packing for an update: the whole sequences of a mini-batch's rows, put back to
back into as few rows as hold them, so the forward and backward run on fewer padding
tokens.

A mini-batch of B right-padded rows of T positions becomes B / f rows of f T positions
(`row_factor`: f = 2 where it divides a device's share of a micro-batch, else 1). Rows
twice as long hold any two sequences (a sequence is at most T), so they pack well even
when most sequences pass T / 2; attention, quadratic in the row, is a small share of the
FLOPs at these lengths. The shape is static per row length: it compiles as the unpacked
one does. The sequences are placed first-fit decreasing; each row numbers its sequences
1, 2, ... in `segment_ids` (0: padding), so attention stays within a sequence and
positions restart at each one (`rljax.models.transformer.Decoder`). The filled rows go to
the first micro-batches (`rljax.train.steps.split_micro_batches` gives micro-batch m the
rows m, M + m, ...), spread evenly over the data-parallel devices, and the micro-batches
left with no token are skipped by the train step (`make_train_step(live=...)`). The
update therefore runs as many micro-batches as the packed rows fill instead of M.

Per-token arrays move with their tokens (`pack`); an output per packed row comes back per
sequence with `unpack`. The loss is unchanged exactly when every term of the objective is
a sum of per-token values over a mini-batch-wide denominator
(`rljax.rl.actor_critic.packs_sequences`). verl's `use_remove_padding` with a dynamic
batch size does the same under dynamic shapes; here the shapes stay static and only the
count of micro-batches that run varies.
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


ROW_FACTOR = 2  # a packed row is this many source rows long, where a micro-batch's rows allow it


def row_factor(micro_rows: int, devices: int) -> int:
    """The length of a packed row in source rows (`ROW_FACTOR`), for micro-batches of
    `micro_rows` rows over `devices` data-parallel devices: each device must keep a whole
    number of packed rows per micro-batch, else 1."""
    return ROW_FACTOR if (micro_rows // devices) % ROW_FACTOR == 0 else 1


@dataclass(frozen=True)
class Packing:
    """Where each of N sequences sits in the packed rows."""

    row: np.ndarray  # [N] int the packed row of sequence i
    start: np.ndarray  # [N] int its first column in that row
    length: np.ndarray  # [N] int its tokens: columns [0, length) of its own row
    segment: np.ndarray  # [N] int its segment id in the packed row (1, 2, ...)
    source_shape: tuple[int, int]  # (N, T) of the source rows
    shape: tuple[int, int]  # (N / f, f T) of the packed rows
    micro_batches: int  # the micro-batches that hold a token (the ones the train step runs)

    def token_index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(source row, source column, packed row, packed column) of every real token."""
        sequence = np.repeat(np.arange(len(self.row)), self.length)  # [tokens]
        column = np.arange(len(sequence)) - np.repeat(np.cumsum(self.length) - self.length, self.length)
        return sequence, column, self.row[sequence], self.start[sequence] + column


def plan_packing(attention_mask: np.ndarray, micro_rows: int, devices: int = 1, factor: int = 1) -> Packing:
    """First-fit-decreasing packing of `[N, T]` right-padded rows (their real tokens are
    a prefix) into N / `factor` rows of `factor` T, placed for micro-batches of
    `micro_rows` source rows (N / micro_rows of them) split over `devices` data-parallel
    devices. Deterministic: every process computes the same packing from the same batch."""
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
    num_micro, per_micro = n // micro_rows, micro_rows // factor
    per_device, capacity = per_micro // devices, factor * t
    used: list[int] = []  # tokens placed in each packed row so far
    segments: list[int] = []  # sequences placed in each packed row so far
    bin_of, start, segment = (np.zeros(n, np.int64) for _ in range(3))
    for i in np.argsort(-length, kind="stable"):
        b = next((b for b, u in enumerate(used) if u + length[i] <= capacity), len(used))
        if b == len(used):
            used.append(0)
            segments.append(0)
        bin_of[i], start[i] = b, used[b]
        used[b] += int(length[i])
        segments[b] += 1
        segment[i] = segments[b]
    # packed row j: micro-batch j // per_micro, its (j % per_micro)-th slot in an order that
    # deals slots to the devices in turn; global row = slot * M + micro-batch
    k = np.arange(per_micro)
    slot = (k % devices) * per_device + k // devices
    row = slot[bin_of % per_micro] * num_micro + bin_of // per_micro
    return Packing(row, start, length, segment, (n, t), (n // factor, capacity), -(-len(used) // per_micro))


def pack(view: V, packing: Packing) -> V:
    """`view` (a dataclass of `[N, T, ...]` host arrays and a `segment_ids` field) with
    its sequences in the packed rows; padding holds 0 (`PAD_VALUES` for some fields)."""
    src_row, src_col, dst_row, dst_col = packing.token_index()
    out = {}
    for name, x in present(view).items():
        x = np.asarray(x)
        if x.shape[:2] != packing.source_shape:
            raise ValueError(f"packing: field {name!r} is {x.shape}, not per token {packing.source_shape}")
        packed = np.full((*packing.shape, *x.shape[2:]), PAD_VALUES.get(name, 0), x.dtype)
        packed[dst_row, dst_col] = x[src_row, src_col]
        out[name] = packed
    segment_ids = np.zeros(packing.shape, np.int32)
    segment_ids[dst_row, dst_col] = packing.segment[src_row]
    return dataclasses.replace(view, **out, segment_ids=segment_ids)


def unpack(x: np.ndarray, packing: Packing) -> np.ndarray:
    """A per-token output of the packed rows `[N / f, f T, ...]` -> per source row `[N, T,
    ...]`, each sequence's tokens where they were, 0 at padding."""
    src_row, src_col, dst_row, dst_col = packing.token_index()
    out = np.zeros((*packing.source_shape, *x.shape[2:]), x.dtype)
    out[src_row, src_col] = x[dst_row, dst_col]
    return out
