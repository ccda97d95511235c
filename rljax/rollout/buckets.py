"""The padded sizes the rollout programs are compiled for, shared by the scheduler (which
sizes prefill steps to fit the token budget once padded) and the device step (which
pads to them). Pure Python."""

from __future__ import annotations

from dataclasses import dataclass

from rljax.rollout.config import SamplerConfig


def bucket(n: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket that holds `n` (buckets sorted ascending)."""
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")


@dataclass(frozen=True)
class Buckets:
    """rows: batch rows of a decode or prefill call; chunk: tokens per prefill row;
    width: page-table entries per row. Each ascending. A mixed call's flat chunk tokens
    pad to powers of two (`pad_tokens`)."""

    rows: tuple[int, ...]
    chunk: tuple[int, ...]
    width: tuple[int, ...]

    @classmethod
    def from_config(cls, config: SamplerConfig) -> "Buckets":
        return cls(config.decode_buckets(), config.chunk_buckets(), config.width_buckets())

    def pad_rows(self, n: int) -> int:
        return bucket(n, self.rows)

    def pad_chunk(self, n: int) -> int:
        return bucket(n, self.chunk)

    def pad_width(self, n: int) -> int:
        return bucket(n, self.width)

    def pad_tokens(self, n: int) -> int:
        """The flat token count of a mixed call's chunks: a power of two, at least 16."""
        return max(16, 1 << (max(n, 1) - 1).bit_length())
