"""Sampler configuration: the KV cache (`KVCacheConfig`) and the engine (`SamplerConfig`).

Every shape the engine compiles comes from these buckets, so a run compiles a small,
fixed set of programs: decode steps are `[batch_bucket, 1]`, prefill steps
`[prefill_rows, chunk_bucket]`, mixed steps both (`[batch_bucket, 1]` decode rows and
`[prefill_rows, chunk_bucket]` chunks), and page tables are padded to a
`page_table_bucket`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from rljax.config import Bounds, NonNegInt, OpenUnitFloat, PositiveInt, check_config


def powers_of_two(lo: int, hi: int) -> tuple[int, ...]:
    """lo, 2lo, 4lo, ... below hi, then hi itself."""
    out, b = [], max(1, lo)
    while b < hi:
        out.append(b)
        b *= 2
    out.append(hi)
    return tuple(out)


@dataclass(frozen=True)
class KVCacheConfig:
    """The paged KV cache. Without `num_pages` the pool takes `memory_fraction` of the
    device's free memory when the backend reports it, else room for `max_num_seqs`
    sequences of `max_model_len` tokens. Checked at construction (`check_config`)."""

    page_size: PositiveInt = 16  # tokens per page
    # pages in the pool, page 0 included (a reserved null page, hence >= 2); null: sized by memory_fraction
    num_pages: Annotated[int, Bounds(ge=2)] | None = None
    memory_fraction: OpenUnitFloat = 0.5  # fraction of free device memory for the pool (num_pages null)
    dtype: str | None = None  # dtype of the cached keys and values; null: the model's compute dtype

    def __post_init__(self):
        check_config(self)


Attention = Literal["auto", "reference", "blocked", "pallas", "pallas_tpu"]  # rljax.rollout.attention.PAGED_ATTENTION


@dataclass(frozen=True)
class SamplerConfig:
    """The rollout engine. Checked at construction (`check_config`): a bad value is a
    `ConfigError` naming the field.

    attention: paged attention. "reference" (plain jnp gather + mask, the oracle),
        "blocked" (decode steps walk the page table in blocks of keys with an online
        softmax, up to the longest live row; prefill runs the reference), "pallas" (a Pallas decode kernel for GPU, interpreted elsewhere; prefill runs the
        reference), "pallas_tpu" (JAX's TPU ragged paged-attention kernel on the pool in
        place, for decode, prefill and mixed steps, the pool's head_dim padded to the 128
        lanes; elsewhere a jnp reference of the kernel on the same arguments), or "auto":
        pallas_tpu on a TPU, blocked on a CPU, else the reference
        (`rljax.rollout.attention.choose_paged_attention`).
    enable_prefix_caching: keep the full pages of finished (and preempted) sequences and
        reuse them for any later sequence that starts with the same tokens: an agent's
        next turn, a retried prompt (`rljax.rollout.prefix_cache`). Unreferenced cached
        pages are evicted (least recently used first) before anything is preempted; the
        cache is cleared when the parameters change.
    record_routing: (mixture-of-experts models) every completion carries the experts each
        of its tokens was routed to in every layer (`Completion.expert_ids`), for routing
        replay in the trainer (`actor.router_replay`). The prefix cache is then not read
        (a cached page's routing was not recorded; its pages are still registered and
        the n samples of a request still share the prompt's pages, whose routing they
        copy); each position keeps the routing of its last computation (a preempted
        sequence's recompute overwrites it, as it overwrites its keys / values).
    mixed_steps: while prompts (or an agent's next turn) are prefilled, every running
        decode rides along in the same call, one token each (a mixed step: decodes take
        the token budget first, prefill chunks fill the rest), instead of waiting for
        the prefill to finish. One program per (decode rows, chunk rows, chunk, width)
        bucket, compiled as the mix occurs.
    share_programs: engines of the same shape in one process (rollout replicas) compile
        each program once; the others load that executable onto their own devices
        (`rljax.rollout.program_share`; CPU and GPU, where an executable is not tied to
        its devices; on a TPU each engine compiles its own).
    num_scheduler_steps: more amortise dispatch and host transfers, fewer let finished
        sequences hand their slot to a waiting one sooner (a sequence that stops mid-call
        wastes the rest).
    """

    max_num_seqs: PositiveInt = 64  # sequences decoding together (the largest decode batch)
    max_num_batched_tokens: PositiveInt = 512  # token budget of a prefill or mixed step (padded rows x chunk, + decode rows)
    max_model_len: PositiveInt = 2048  # the longest sequence (prompt + generated), in tokens; sets the page-table width
    kv_cache: KVCacheConfig = field(default_factory=KVCacheConfig)  # the paged KV pool
    attention: Attention = "auto"  # paged attention: auto | reference | blocked | pallas | pallas_tpu (see above)
    share_prefix: bool = True  # the n samples of a request share the prompt's full KV pages
    enable_prefix_caching: bool = True  # reuse cached pages across requests (see above)
    num_scheduler_steps: PositiveInt = 4  # decode steps per engine call (an on-device loop; see above)
    mixed_steps: bool = False  # running decodes join prefill calls instead of waiting (see above)
    share_programs: bool = True  # same-shaped engines compile each program once (see above)
    batch_buckets: tuple[int, ...] | None = None  # padded decode / prefill row counts; null: powers of two
    prefill_chunk_buckets: tuple[int, ...] | None = None  # padded prefill chunk lengths; null: powers of two
    page_table_buckets: tuple[int, ...] | None = None  # padded page-table widths, in pages; null: powers of two
    seed: NonNegInt = 0  # the generator that draws seeds for requests that bring none
    record_routing: bool = False  # MoE: completions carry each token's experts per layer (see above)

    def __post_init__(self):
        check_config(self)

    @property
    def max_pages_per_seq(self) -> int:
        return -(-self.max_model_len // self.kv_cache.page_size)

    def decode_buckets(self) -> tuple[int, ...]:
        buckets = self.batch_buckets or powers_of_two(1, self.max_num_seqs)
        if max(buckets) < self.max_num_seqs:
            raise ValueError(f"batch_buckets {buckets} must reach max_num_seqs={self.max_num_seqs}")
        return tuple(sorted(set(buckets)))

    def chunk_buckets(self) -> tuple[int, ...]:
        buckets = self.prefill_chunk_buckets or powers_of_two(16, self.max_num_batched_tokens)
        if max(buckets) > self.max_num_batched_tokens:
            raise ValueError(
                f"prefill_chunk_buckets {buckets} exceed max_num_batched_tokens={self.max_num_batched_tokens}"
            )
        return tuple(sorted(set(buckets)))

    def width_buckets(self) -> tuple[int, ...]:
        buckets = self.page_table_buckets or powers_of_two(1, self.max_pages_per_seq)
        buckets = tuple(sorted({min(b, self.max_pages_per_seq) for b in buckets} | {self.max_pages_per_seq}))
        return buckets
