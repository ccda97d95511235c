"""Sequence packing for an update: the whole sequences of a mini-batch's rows, put back to
back into as few rows as hold them, so the forward and backward run on fewer padding
tokens.

A mini-batch of B right-padded rows of T positions becomes B rows of T positions again
(the train step's shape: nothing recompiles). The sequences are placed first-fit
decreasing into rows; each row numbers its sequences 1, 2, ... in `segment_ids` (0:
padding), so attention stays within a sequence and positions restart at each one
(`rljax.models.transformer.Decoder`). The filled rows go to the first micro-batches
(`rljax.train.steps.split_micro_batches` gives micro-batch m the rows m, M + m, ...),
spread evenly over the data-parallel devices, and the micro-batches left with no token
are skipped by the train step (`make_train_step(live=...)`). The update therefore runs
ceil(filled rows / micro-batch rows) micro-batches instead of M.

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


@dataclass(frozen=True)
class Packing:
    """Where each of N sequences sits in the packed rows."""

    row: np.ndarray  # [N] int the packed row of sequence i
    start: np.ndarray  # [N] int its first column in that row
    length: np.ndarray  # [N] int its tokens: columns [0, length) of its own row
    segment: np.ndarray  # [N] int its segment id in the packed row (1, 2, ...)
    length_of_rows: int  # T, of the source rows and the packed ones
    micro_batches: int  # the micro-batches that hold a token (the ones the train step runs)

    @property
    def rows(self) -> int:
        return len(self.row)

    def token_index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(source row, source column, packed row, packed column) of every real token."""
        sequence = np.repeat(np.arange(self.rows), self.length)  # [tokens]
        column = np.arange(len(sequence)) - np.repeat(np.cumsum(self.length) - self.length, self.length)
        return sequence, column, self.row[sequence], self.start[sequence] + column


def plan_packing(attention_mask: np.ndarray, micro_rows: int, devices: int = 1) -> Packing:
    """First-fit-decreasing packing of `[B, T]` right-padded rows (their real tokens
    are a prefix) into rows of T, placed for micro-batches of `micro_rows` rows (B / micro_rows
    of them) split over `devices` data-parallel devices. Deterministic: every process
    computes the same packing from the same batch."""
    mask = np.asarray(attention_mask) > 0
    n, t = mask.shape
    length = mask.sum(axis=1)
    if not np.array_equal(mask, np.arange(t)[None, :] < length[:, None]):
        bad = int(np.flatnonzero((mask != (np.arange(t)[None, :] < length[:, None])).any(axis=1))[0])
        raise ValueError(f"packing: row {bad} is not right-padded (its attention_mask has a gap)")
    if n % micro_rows or micro_rows % devices:
        raise ValueError(f"packing: {n} rows do not split into micro-batches of {micro_rows} rows over "
                         f"{devices} devices")
    num_micro, per_device = n // micro_rows, micro_rows // devices
    used: list[int] = []  # tokens placed in each packed row so far
    segments: list[int] = []  # sequences placed in each packed row so far
    bin_of, start, segment = (np.zeros(n, np.int64) for _ in range(3))
    for i in np.argsort(-length, kind="stable"):
        b = next((b for b, u in enumerate(used) if u + length[i] <= t), len(used))
        if b == len(used):
            used.append(0)
            segments.append(0)
        bin_of[i], start[i] = b, used[b]
        used[b] += int(length[i])
        segments[b] += 1
        segment[i] = segments[b]
    # packed row j: micro-batch j // micro_rows, its (j % micro_rows)-th slot in an order
    # that deals slots to the devices in turn; global row = slot * M + micro-batch
    k = np.arange(micro_rows)
    slot = (k % devices) * per_device + k // devices
    row = slot[bin_of % micro_rows] * num_micro + bin_of // micro_rows
    return Packing(row, start, length, segment, t, -(-len(used) // micro_rows))


def pack(view: V, packing: Packing) -> V:
    """`view` (a dataclass of `[B, T, ...]` host arrays and a `segment_ids` field) with
    its sequences in the packed rows; padding holds 0 (`PAD_VALUES` for some fields)."""
    src_row, src_col, dst_row, dst_col = packing.token_index()
    shape = (packing.rows, packing.length_of_rows)
    out = {}
    for name, x in present(view).items():
        x = np.asarray(x)
        if x.shape[:2] != shape:
            raise ValueError(f"packing: field {name!r} is {x.shape}, not per token {shape}")
        packed = np.full_like(x, PAD_VALUES.get(name, 0))
        packed[dst_row, dst_col] = x[src_row, src_col]
        out[name] = packed
    segment_ids = np.zeros(shape, np.int32)
    segment_ids[dst_row, dst_col] = packing.segment[src_row]
    return dataclasses.replace(view, **out, segment_ids=segment_ids)


def unpack(x: np.ndarray, packing: Packing) -> np.ndarray:
    """A per-token output of the packed rows `[B, T, ...]` -> per source row, each
    sequence's tokens where they were, 0 at padding."""
    src_row, src_col, dst_row, dst_col = packing.token_index()
    out = np.zeros_like(x)
    out[src_row, src_col] = x[dst_row, dst_col]
    return out
