"""The arrays of one compiled rollout call, typed, and their packing from a `StepPlan`.

Host numpy arrays padded to the compiled buckets (`rljax.rollout.buckets`): B rows
(padded rows point at the null page 0, are greedy and their results are dropped), T
tokens per prefill row, W page-table entries per row (unused ones: page 0). They are
registered pytrees, so a whole structure passes through `jax.jit` as one argument and
each kind of call has its own structure (a decode call takes no prefill-only arrays; a
mixed call takes a decode part and a prefill part).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import jax
import numpy as np

from rljax.rollout.buckets import Buckets
from rljax.rollout.scheduler import Row, StepKind, StepPlan


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class SamplingInputs:
    """How each row samples (`rljax.rollout.sampling`)."""

    temperature: np.ndarray  # [B] float32, 0 = greedy
    top_k: np.ndarray  # [B] int32, 0 = off
    top_p: np.ndarray  # [B] float32, 1 = off
    min_p: np.ndarray  # [B] float32, 0 = off
    seeds: np.ndarray  # [B] uint32
    streams: np.ndarray  # [B, 2] uint32, the request stream's high and low 32 bits
    sample_index: np.ndarray  # [B] int32


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class PrefillInputs:
    """Row b computes a chunk of its known tokens and samples from its last one's logits."""

    tokens: np.ndarray  # [B, T] int32, the chunk
    positions: np.ndarray  # [B, T] int32, absolute positions (padding repeats the last)
    valid: np.ndarray  # [B, T] bool, False on padding (its keys / values go to page 0)
    page_table: np.ndarray  # [B, W] int32
    kv_lens: np.ndarray  # [B] int32, tokens in the cache once the chunk is written
    last_index: np.ndarray  # [B] int32, the column whose logits are sampled
    sampling: SamplingInputs

    @property
    def label(self) -> str:
        return f"[{self.tokens.shape[0]}x{self.tokens.shape[1]}, W={self.page_table.shape[1]}]"


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class DecodeInputs:
    """Row b feeds its last token and runs `n_steps[b]` decode steps, each step's sampled
    token feeding the next (later steps write only page 0; their tokens are dropped)."""

    tokens: np.ndarray  # [B] int32, the row's last token
    positions: np.ndarray  # [B] int32, its absolute position
    page_table: np.ndarray  # [B, W] int32, pages for every step of the call
    n_steps: np.ndarray  # [B] int32, steps this row runs (0 on padding)
    sampling: SamplingInputs

    @property
    def label(self) -> str:
        return f"[{self.tokens.shape[0]}x1, W={self.page_table.shape[1]}]"


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class RaggedChunks:
    """Prefill chunks as one flat run of tokens: row r's chunk is `tokens[starts[r] :
    starts[r] + lens[r]]`, rows back to back, then padding up to Tp. `query_index` views
    them as `[Bp, C]` (row r's c-th token; past its chunk, its last token again) for
    attention; `token_row` / `token_col` map each flat token back to that view."""

    tokens: np.ndarray  # [Tp] int32
    positions: np.ndarray  # [Tp] int32, absolute positions (padding: 0)
    valid: np.ndarray  # [Tp] bool, False on padding (its keys / values go to page 0)
    token_row: np.ndarray  # [Tp] int32, the chunk row of each token (padding: 0)
    token_col: np.ndarray  # [Tp] int32, its index within the chunk (padding: 0)
    query_index: np.ndarray  # [Bp, C] int32, the flat token at (row, column)
    page_table: np.ndarray  # [Bp, W] int32
    kv_lens: np.ndarray  # [Bp] int32, tokens in the cache once the chunk is written
    last_index: np.ndarray  # [Bp] int32, the flat index of each row's last token (sampled from)
    sampling: SamplingInputs  # [Bp]


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class MixedInputs:
    """A step over decode rows and prefill chunks together (each decode row feeds its
    last token, each chunk row computes its chunk, every row samples one token), then
    the decode rows' further steps (`decode.n_steps` in all). The matmuls run over the
    `Bd` decode tokens and the `Tp` flat chunk tokens, so a chunk costs its own length,
    not the longest chunk's. Each part has its own page-table width."""

    decode: DecodeInputs  # [Bd] rows
    chunks: RaggedChunks  # [Tp] tokens of [Bp] rows, up to C each

    @property
    def label(self) -> str:
        (bd,), (bp, c) = self.decode.tokens.shape, self.chunks.query_index.shape
        return (f"[{bd}x1+{self.chunks.tokens.shape[0]}({bp}x{c}), "
                f"W={self.decode.page_table.shape[1]}+{self.chunks.page_table.shape[1]}]")


StepInputs = PrefillInputs | DecodeInputs | MixedInputs


def _page_table(rows: Sequence[Row], b: int, buckets: Buckets) -> np.ndarray:
    w = buckets.pad_width(max((len(r.pages) for r in rows), default=1))
    page_table = np.zeros((b, w), np.int32)  # [B, W]
    for i, r in enumerate(rows):
        page_table[i, : len(r.pages)] = r.pages
    return page_table


def _sampling(rows: Sequence[Row], b: int) -> SamplingInputs:
    s = SamplingInputs(
        temperature=np.zeros(b, np.float32),
        top_k=np.zeros(b, np.int32),
        top_p=np.ones(b, np.float32),
        min_p=np.zeros(b, np.float32),
        seeds=np.zeros(b, np.uint32),
        streams=np.zeros((b, 2), np.uint32),
        sample_index=np.zeros(b, np.int32),
    )
    for i, r in enumerate(rows):
        p = r.params
        s.temperature[i] = p.temperature
        s.top_k[i] = p.top_k
        s.top_p[i] = p.top_p
        s.min_p[i] = p.min_p
        s.seeds[i] = r.seed % 2**32
        s.streams[i] = divmod(p.stream, 2**32)
        s.sample_index[i] = r.sample_index
    return s


def pack_prefill(rows: Sequence[Row], buckets: Buckets) -> PrefillInputs:
    b = buckets.pad_rows(max(len(rows), 1))
    t = buckets.pad_chunk(max(len(r.tokens) for r in rows))
    tokens = np.zeros((b, t), np.int32)
    positions = np.zeros((b, t), np.int32)
    valid = np.zeros((b, t), bool)
    kv_lens = np.zeros(b, np.int32)
    last_index = np.zeros(b, np.int32)
    for i, r in enumerate(rows):
        n = len(r.tokens)
        tokens[i, :n] = r.tokens
        positions[i, :n] = np.arange(r.start, r.start + n)
        positions[i, n:] = r.start + n - 1
        valid[i, :n] = True
        kv_lens[i] = r.start + n
        last_index[i] = n - 1
    return PrefillInputs(tokens, positions, valid, _page_table(rows, b, buckets), kv_lens, last_index,
                         _sampling(rows, b))


def pack_decode(rows: Sequence[Row], buckets: Buckets) -> DecodeInputs:
    b = buckets.pad_rows(max(len(rows), 1))
    tokens = np.zeros(b, np.int32)
    positions = np.zeros(b, np.int32)
    n_steps = np.zeros(b, np.int32)
    for i, r in enumerate(rows):
        (tokens[i],) = r.tokens
        positions[i] = r.start
        n_steps[i] = r.num_steps
    return DecodeInputs(tokens, positions, _page_table(rows, b, buckets), n_steps, _sampling(rows, b))


def pack_mixed(rows: Sequence[Row], num_decode: int, buckets: Buckets) -> MixedInputs:
    """The first `num_decode` rows decode, the rest are chunks."""
    return MixedInputs(pack_decode(rows[:num_decode], buckets), pack_chunks(rows[num_decode:], buckets))


def pack_chunks(rows: Sequence[Row], buckets: Buckets) -> RaggedChunks:
    lens = [len(r.tokens) for r in rows]
    b, c, tp = buckets.pad_rows(len(rows)), buckets.pad_chunk(max(lens)), buckets.pad_tokens(sum(lens))
    tokens, positions, token_row, token_col = (np.zeros(tp, np.int32) for _ in range(4))
    valid = np.zeros(tp, bool)
    query_index = np.zeros((b, c), np.int32)
    kv_lens, last_index = np.zeros(b, np.int32), np.zeros(b, np.int32)
    at = 0
    for i, r in enumerate(rows):
        n = len(r.tokens)
        span = slice(at, at + n)
        tokens[span] = r.tokens
        positions[span] = np.arange(r.start, r.start + n)
        valid[span] = True
        token_row[span] = i
        token_col[span] = np.arange(n)
        query_index[i] = at + np.minimum(np.arange(c), n - 1)
        kv_lens[i] = r.start + n
        last_index[i] = at + n - 1
        at += n
    return RaggedChunks(tokens, positions, valid, token_row, token_col, query_index, _page_table(rows, b, buckets),
                        kv_lens, last_index, _sampling(rows, b))


PACKERS: dict[StepKind, Callable[[StepPlan, Buckets], StepInputs]] = {
    StepKind.PREFILL: lambda plan, buckets: pack_prefill(plan.rows, buckets),
    StepKind.DECODE: lambda plan, buckets: pack_decode(plan.rows, buckets),
    StepKind.MIXED: lambda plan, buckets: pack_mixed(plan.rows, plan.num_decode_rows, buckets),
}


def pack_step(plan: StepPlan, buckets: Buckets) -> StepInputs:
    """The typed, padded inputs of the call that runs `plan`."""
    return PACKERS[plan.kind](plan, buckets)


def result_rows(plan: StepPlan, inputs: StepInputs) -> np.ndarray:
    """Which rows of a call's outputs are the plan's rows, in plan order (padding rows
    dropped; a mixed call pads its decode and chunk rows separately)."""
    if isinstance(inputs, MixedInputs):
        bd, d = inputs.decode.tokens.shape[0], plan.num_decode_rows
        return np.concatenate([np.arange(d), bd + np.arange(len(plan.rows) - d)])
    return np.arange(len(plan.rows))
