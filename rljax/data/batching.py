"""Examples -> padded, bucketed numpy batches (and RL prompt batches as lists).

Padded batches are right-padded to T, the smallest bucket length >= the longest row of the
batch, so a run compiles one program per bucket, not per batch. Padding positions have
``input_ids = pad_id`` and zeros in every mask, ``positions`` and ``segment_ids``.
Every collate function has the signature ``collate(examples, layout)`` (the formats'
registry, `rljax.data.formats`, picks one per format); `BatchLayout` carries the buckets,
the pad id and the rows per batch. A padded batch may be given more `rows` than examples:
the extra rows are all padding.

SFT batch, all [B, T]:
  ``input_ids`` int32, ``attention_mask`` int32 (0/1), ``segment_ids`` int32 (1..k per
  packed segment, 0 = pad; equal to ``attention_mask`` without packing), ``positions``
  int32 (0.. restarting per segment, 0 on pads), ``loss_mask`` float32 (1 where
  ``input_ids[t]`` is a target token; 0 at the first token of every segment).
Preference batch, all [B, T] (one T for both sides):
  ``{chosen,rejected}_{input_ids,attention_mask,positions}`` int32 and
  ``{chosen,rejected}_loss_mask`` float32.
RL batch: python lists of length <= B (``prompt_ids``, ``raw_prompt``, ``data_source``,
  ``ground_truth``, ``reward_model``, ``extra_info``, ``tools``, ``index``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

RL_KEYS: tuple[str, ...] = (
    "prompt_ids",
    "raw_prompt",
    "data_source",
    "ground_truth",
    "reward_model",
    "extra_info",
    "tools",
    "index",
)


@dataclass(frozen=True)
class BatchLayout:
    """How examples become one batch on this process.

    `buckets`: the sorted lengths T may take (`DataConfig.bucket_lengths`); `pad_id`: the
    id at padding positions; `rows`: B, the rows of a padded batch.
    """

    buckets: tuple[int, ...]
    pad_id: int
    rows: int


def pick_bucket(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= `length` (`buckets` sorted ascending)."""
    for b in buckets:
        if b >= length:
            return int(b)
    raise ValueError(f"a row of {length} tokens is longer than the largest bucket {buckets[-1]}")


def _pad_rows(
    seqs: Sequence[np.ndarray], masks: Sequence[np.ndarray], rows: int, T: int, pad_id: int
) -> dict[str, np.ndarray]:
    input_ids = np.full((rows, T), pad_id, dtype=np.int32)
    attention_mask = np.zeros((rows, T), dtype=np.int32)
    positions = np.zeros((rows, T), dtype=np.int32)
    loss_mask = np.zeros((rows, T), dtype=np.float32)
    for i, (ids, mask) in enumerate(zip(seqs, masks)):
        n = len(ids)
        input_ids[i, :n] = ids
        attention_mask[i, :n] = 1
        positions[i, :n] = np.arange(n, dtype=np.int32)
        loss_mask[i, :n] = mask
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "positions": positions,
        "loss_mask": loss_mask,
    }


def collate_sft(
    examples: Sequence[dict[str, np.ndarray]], layout: BatchLayout
) -> dict[str, np.ndarray]:
    """Unpacked SFT examples -> an SFT batch of `layout.rows` rows (module docstring)."""
    longest = max((len(e["input_ids"]) for e in examples), default=0)
    T = pick_bucket(max(longest, 1), layout.buckets)
    out = _pad_rows(
        [e["input_ids"] for e in examples],
        [e["loss_mask"] for e in examples],
        layout.rows, T, layout.pad_id,
    )
    out["segment_ids"] = out["attention_mask"].copy()
    return out


def collate_packed(
    packed: Sequence[dict[str, np.ndarray]], layout: BatchLayout
) -> dict[str, np.ndarray]:
    """Rows packed by grain's first-fit packer -> an SFT batch (one row per packing bin).

    Each packed row has ``input_ids``, ``loss_mask`` (length max_length) and grain's
    ``input_ids_segment_ids`` / ``input_ids_positions``.
    """
    seg = np.stack([p["input_ids_segment_ids"] for p in packed]).astype(np.int32)
    used = seg > 0
    lengths = np.where(used.any(axis=1), used.shape[1] - np.argmax(used[:, ::-1], axis=1), 0)
    T = pick_bucket(max(int(lengths.max(initial=0)), 1), layout.buckets)
    seg = seg[:, :T]  # [B, T]
    valid = seg > 0
    ids = np.stack([p["input_ids"] for p in packed])[:, :T].astype(np.int32)
    pos = np.stack([p["input_ids_positions"] for p in packed])[:, :T].astype(np.int32)
    loss = np.stack([p["loss_mask"] for p in packed])[:, :T].astype(np.float32)
    return {
        "input_ids": np.where(valid, ids, np.int32(layout.pad_id)),
        "attention_mask": valid.astype(np.int32),
        "segment_ids": seg,
        "positions": np.where(valid, pos, 0).astype(np.int32),
        "loss_mask": np.where(valid, loss, 0.0).astype(np.float32),
    }


def collate_preference(
    examples: Sequence[dict[str, np.ndarray]], layout: BatchLayout
) -> dict[str, np.ndarray]:
    """Preference examples -> a preference batch of `layout.rows` rows; both sides share
    one T."""
    longest = max(
        (len(e[f"{s}_input_ids"]) for e in examples for s in ("chosen", "rejected")), default=0
    )
    T = pick_bucket(max(longest, 1), layout.buckets)
    out: dict[str, np.ndarray] = {}
    for side in ("chosen", "rejected"):
        part = _pad_rows(
            [e[f"{side}_input_ids"] for e in examples],
            [e[f"{side}_loss_mask"] for e in examples],
            layout.rows, T, layout.pad_id,
        )
        for k, v in part.items():
            out[f"{side}_{k}"] = v
    return out


def collate_rl(examples: Sequence[dict[str, Any]], layout: BatchLayout) -> dict[str, list[Any]]:
    """RL prompt examples -> a dict of lists (padding rows, i.e. empty dicts, dropped; the
    sampler packs prompts itself, so `layout` is not used)."""
    real = [e for e in examples if e]
    return {k: [e[k] for e in real] for k in RL_KEYS}
