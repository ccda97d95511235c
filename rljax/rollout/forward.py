"""The decoder's forward pass over a paged KV cache, as pure functions to jit.

Same math as `Decoder.hidden_states` (the trainer's forward): embed, then a `lax.scan`
over the stacked layers running `attention_inputs` and `attention_output_and_mlp`, with
paged attention in place of full attention. The KV pool travels in the scan carry and
each layer writes this step's keys and values (interleaved per kv head) into its pages
with one scatter (`.at[].set`), so with the pool donated XLA updates it in place.

Two programs are built from it, each taking its typed inputs
(`rljax.rollout.step_inputs`):
- `make_prefill_fn`: computes `[B, T]` tokens (prompt chunks), then samples one token
  per row from the logits of the row's last computed token.
- `make_decode_fn`: `num_steps` decode steps in one call (an on-device loop feeding each
  step's sampled token to the next), which amortises dispatch and host transfers over
  several tokens. Row b runs `n_steps[b] <= num_steps` steps; later steps of that row
  write only to the null page and their tokens are ignored by the scheduler.

A sampled token's absolute position (part of its random key) is its predecessor's
position + 1.

Routing record (`SamplerConfig.record_routing`, MoE models): both programs also return
the experts each computed token was routed to in every layer (the router's top-k, the
layer scan's per-layer output), `[B, T, L, k]` int32 for prefill and `[B, num_steps,
L, k]` for decode (step j's is that of the token fed at step j); None without it. Shapes: B rows, T tokens per row, E hidden, N query heads, K kv heads,
D head dim, V vocabulary, L layers, P pages, S page size, W page-table width.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from rljax.models.transformer import Decoder, attention_inputs, attention_output_and_mlp, rope_cos_sin
from rljax.rollout.attention import PagedAttention, interleave_kv
from rljax.rollout.sampling import sample_tokens
from rljax.rollout.step_inputs import DecodeInputs, MixedInputs, PrefillInputs, SamplingInputs


def run_layers(model: Decoder, kv_cache: jax.Array, tokens: jax.Array, positions: jax.Array, valid: jax.Array,
               write_page: jax.Array, attend: Callable, *, page_size: int, record: bool = False):
    """Embed `tokens` `[B, T]`, write each layer's keys / values into page `write_page`
    `[B, T]` (padding: the null page 0) at slot `positions % page_size`, and run the
    decoder's layers with `attend(q, kv_cache, layer) -> [B, T, N, D]` as attention.
    Returns (hidden states `[B, T, E]` before the final norm, kv_cache, experts
    `[B, T, L, k]` with `record` on a MoE model, else None)."""
    config = model.config
    write_slot = jnp.where(valid, positions % page_size, 0)  # [B, T]
    cos, sin = rope_cos_sin(positions, config)  # [B, T, D] each

    def block(carry, xs):
        x, cache = carry  # x [B, T, E]
        p, layer = xs
        q, k, v = attention_inputs(p, x, cos, sin, config)  # q [B, T, N, D], k / v [B, T, K, D]
        pad = ((0, 0),) * 3 + ((0, cache.shape[-1] - k.shape[-1]),)  # a pool padded past head_dim takes zeros
        # each token's [2K, D] keys and values are one contiguous window of the [L, P, S, 2K, D] pool
        cache = cache.at[layer, write_page, write_slot].set(interleave_kv(jnp.pad(k, pad), jnp.pad(v, pad))
                                                            .astype(cache.dtype), mode="promise_in_bounds")
        attn = attend(q, cache, layer)  # [B, T, N, D]
        x, routing = attention_output_and_mlp(p, x, attn.astype(x.dtype), config, valid=valid)  # [B, T, E]
        return (x, cache), (routing.experts if record and routing is not None else None)  # [B, T, k]

    layers = jnp.arange(config.num_hidden_layers, dtype=jnp.int32)  # [L]
    x0 = model.embed_tokens(tokens)  # [B, T, E]
    # experts: [L, B, T, k] or None
    (x, kv_cache), experts = jax.lax.scan(block, (x0, kv_cache), (model.layer_arrays(), layers))
    if experts is not None:
        experts = jnp.moveaxis(experts, 0, 2)  # [B, T, L, k]
    return x, kv_cache, experts


def write_pages(page_table: jax.Array, positions: jax.Array, valid: jax.Array, page_size: int) -> jax.Array:
    """The page each token's key / value goes to, `[B, T]`: its row's page-table entry for
    its position; padding goes to the null page 0."""
    column = jnp.minimum(positions // page_size, page_table.shape[1] - 1)  # [B, T] page-table column
    return jnp.where(valid, jnp.take_along_axis(page_table, column, axis=1), 0)


def sample_rows(model: Decoder, last: jax.Array, sample_positions: jax.Array, sampling: SamplingInputs):
    """One token per row from the final hidden states `last` `[B, E]` of the rows' last
    computed tokens; `sample_positions` `[B]`: where each sampled token goes (part of its
    random key). Returns (tokens [B] int32, log_probs [B] float32)."""
    logits = model.logits(model.final_hidden(last)[:, None, :])[:, 0, :]  # [B, V] float32
    return sample_tokens(logits, sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p,
                         sampling.seeds, sampling.streams, sampling.sample_index, sample_positions)


def forward_and_sample(
    model: Decoder,
    kv_cache: jax.Array,
    tokens: jax.Array,
    positions: jax.Array,
    valid: jax.Array,
    page_table: jax.Array,
    kv_lens: jax.Array,
    last_index: jax.Array,
    sampling: SamplingInputs,
    *,
    page_size: int,
    attention: Callable,
    record: bool = False,
):
    """Write `tokens`' `[B, T]` keys / values into their pages, run the decoder over them
    (`attention`: a `PagedAttentionFn`) and sample one token per row from the logits at
    column `last_index` `[B]`. The pool is `[L, P, S, 2K, D]`. Returns (kv_cache, tokens
    [B], log_probs [B], experts [B, T, L, k] int32 with `record` on a MoE model, else
    None)."""
    b = tokens.shape[0]

    def attend(q, cache, layer):
        return attention(q, cache, layer, page_table, positions, kv_lens)

    x, kv_cache, experts = run_layers(
        model, kv_cache, tokens, positions, valid, write_pages(page_table, positions, valid, page_size),
        attend, page_size=page_size, record=record)
    last = x[jnp.arange(b), last_index]  # [B, E]
    sample_positions = positions[jnp.arange(b), last_index] + 1  # [B] where the sampled token goes
    next_tokens, log_probs = sample_rows(model, last, sample_positions, sampling)  # [B] each
    return kv_cache, next_tokens, log_probs, experts


def make_prefill_fn(graphdef: nnx.GraphDef, page_size: int, attention: PagedAttention, on_trace: Callable[[], None],
                    record: bool = False):
    """`prefill(state, kv_cache, inputs: PrefillInputs) -> (kv_cache, tokens [B],
    log_probs [B], experts [B, T, L, k] or None)`. `on_trace` runs each time the function
    is traced (once per compiled shape); `record`: return the routing."""

    def prefill(state: nnx.State, kv_cache: jax.Array, inputs: PrefillInputs):
        on_trace()
        model = nnx.merge(graphdef, state)
        return forward_and_sample(
            model, kv_cache, inputs.tokens, inputs.positions, inputs.valid, inputs.page_table,
            inputs.kv_lens, inputs.last_index, inputs.sampling, page_size=page_size, attention=attention.prefill,
            record=record,
        )

    return prefill


def make_decode_fn(
    graphdef: nnx.GraphDef, page_size: int, attention: PagedAttention, num_steps: int, on_trace: Callable[[], None],
    record: bool = False,
):
    """`decode(state, kv_cache, inputs: DecodeInputs) -> (kv_cache, tokens [B, num_steps],
    log_probs [B, num_steps], experts [B, num_steps, L, k] or None)`: `num_steps` decode
    steps, each feeding its sampled token (at the next position) to the next; `record`:
    return the routing of each fed token."""

    def decode(state: nnx.State, kv_cache: jax.Array, inputs: DecodeInputs):
        on_trace()
        model = nnx.merge(graphdef, state)
        return decode_loop(model, kv_cache, inputs.tokens, inputs.positions, inputs.page_table, inputs.n_steps,
                           inputs.sampling, num_steps=num_steps, page_size=page_size, attention=attention.decode,
                           record=record)

    return decode


def decode_loop(model: Decoder, kv_cache: jax.Array, tokens: jax.Array, positions: jax.Array, page_table: jax.Array,
                n_steps: jax.Array, sampling: SamplingInputs, *, num_steps: int, page_size: int, attention: Callable,
                record: bool = False):
    """Up to `num_steps` decode steps on device: row b feeds `tokens[b]` at
    `positions[b]`, and each step's sampled token (at the next position) feeds the next,
    for `n_steps[b]` steps (later steps write only the null page; the loop stops after
    the longest row's last step). Returns (kv_cache, tokens [B, num_steps], log_probs
    [B, num_steps], experts [B, num_steps, L, k] or None)."""
    zeros = jnp.zeros_like(n_steps)  # [B] the one column is the one sampled from
    b = tokens.shape[0]

    def one(i, carry):
        cache, token, position, out_tokens, out_log_probs, out_experts = carry  # token, position [B]
        valid = (i < n_steps)[:, None]  # [B, 1]
        cache, token, log_prob, experts = forward_and_sample(
            model, cache, token[:, None], position[:, None], valid, page_table, position + 1,
            zeros, sampling, page_size=page_size, attention=attention, record=record,
        )
        out_tokens = out_tokens.at[i].set(token)
        out_log_probs = out_log_probs.at[i].set(log_prob)
        if out_experts is not None:
            out_experts = out_experts.at[i].set(experts[:, 0])  # [B, L, k]
        return cache, token, position + 1, out_tokens, out_log_probs, out_experts

    out_experts = None
    if record and model.config.is_moe:
        out_experts = jnp.full((num_steps, b, model.config.num_hidden_layers, model.config.num_experts_per_tok), -1,
                               jnp.int32)
    init = (kv_cache, tokens, positions, jnp.zeros((num_steps, b), jnp.int32),
            jnp.zeros((num_steps, b), jnp.float32), out_experts)
    # only as many steps as the longest row runs (a call whose rows all stop early skips the rest)
    trip = jnp.minimum(jnp.max(n_steps), num_steps)
    kv_cache, _, _, tokens, log_probs, experts = jax.lax.fori_loop(0, trip, one, init)
    experts = None if experts is None else jnp.swapaxes(experts, 0, 1)  # [B, num_steps, L, k]
    return kv_cache, tokens.T, log_probs.T, experts


def ragged_rows(inputs: MixedInputs) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """A mixed step's rows as ragged sequences over its flat `[Bd + Tp]` stream: each
    decode row one query, then each chunk row its chunk (rows back to back; padding chunk
    rows, last, are past `num_seqs`). Returns (page_table `[Bd + Bp, W]`, both parts'
    tables padded to the wider with the null page, cu_q_lens `[Bd + Bp + 1]`, kv_lens
    `[Bd + Bp]`, num_seqs `[1]`)."""
    d, ch = inputs.decode, inputs.chunks
    bd = d.tokens.shape[0]
    real = ch.kv_lens > 0  # [Bp] padding chunk rows have nothing in the cache
    chunk_lens = jnp.where(real, ch.last_index - ch.query_index[:, 0] + 1, 0)  # [Bp]
    cu_q_lens = jnp.concatenate([jnp.arange(bd + 1, dtype=jnp.int32), bd + jnp.cumsum(chunk_lens, dtype=jnp.int32)])
    width = max(d.page_table.shape[1], ch.page_table.shape[1])
    page_table = jnp.concatenate([jnp.pad(t, ((0, 0), (0, width - t.shape[1]))) for t in (d.page_table, ch.page_table)])
    kv_lens = jnp.concatenate([d.positions + 1, ch.kv_lens]).astype(jnp.int32)
    num_seqs = (bd + jnp.sum(real, dtype=jnp.int32))[None]
    return page_table, cu_q_lens, kv_lens, num_seqs


def mixed_forward_and_sample(model: Decoder, kv_cache: jax.Array, inputs: MixedInputs, *, page_size: int,
                             attention: PagedAttention, record: bool = False):
    """One step over decode rows and prefill chunks together: the `[Bd]` decode tokens
    and the `[Tp]` flat chunk tokens run as one `[1, Bd + Tp]` sequence through every
    matmul. Attention: with a ragged implementation (`attention.ragged`), one call over
    the flat stream (`ragged_rows`); otherwise split, decode rows through
    `attention.decode` (`[Bd, 1]` queries) and chunks through `attention.prefill` on their
    `[Bp, C]` view (`RaggedChunks.query_index`), each over its rows' page tables. Every row
    samples one token (a decode row from its token, a chunk row from its last). Returns
    (kv_cache, tokens [Bd + Bp], log_probs [Bd + Bp], sample positions [Bd + Bp], experts
    [Bd + Bp, C, L, k] with `record` on a MoE model (a decode row's in column 0), else
    None)."""
    d, ch = inputs.decode, inputs.chunks
    bd, (bp, c) = d.tokens.shape[0], ch.query_index.shape
    d_valid = d.n_steps > 0  # [Bd]
    d_pages = write_pages(d.page_table, d.positions[:, None], d_valid[:, None], page_size)[:, 0]  # [Bd]
    # each chunk token as a one-token row of its own row's page table
    ch_pages = write_pages(ch.page_table[ch.token_row], ch.positions[:, None], ch.valid[:, None], page_size)[:, 0]

    def flat(a_decode, a_chunks):
        return jnp.concatenate([a_decode, a_chunks])[None]

    valid = flat(d_valid, ch.valid)  # [1, Bd + Tp]
    if attention.ragged is not None:
        rows = ragged_rows(inputs)

        def attend(q, cache, layer):  # q [1, Bd + Tp, N, D]; queries past the last chunk are padding: zeros
            out = attention.ragged(q[0], cache, layer, *rows)
            return jnp.where(valid[0, :, None, None], out, 0)[None]
    else:
        def attend(q, cache, layer):  # q [1, Bd + Tp, N, D]
            q_c = q[0, bd:][ch.query_index]  # [Bp, C, N, D]
            a_d = attention.decode(q[0, :bd, None], cache, layer, d.page_table, d.positions[:, None],
                                   d.positions + 1)  # [Bd, 1, N, D]
            a_c = attention.prefill(q_c, cache, layer, ch.page_table, ch.positions[ch.query_index],
                                    ch.kv_lens)  # [Bp, C, N, D]
            return jnp.concatenate([a_d[:, 0], a_c[ch.token_row, ch.token_col]])[None]  # [1, Bd + Tp, N, D]

    x, kv_cache, experts = run_layers(
        model, kv_cache, flat(d.tokens, ch.tokens), flat(d.positions, ch.positions), valid,
        flat(d_pages, ch_pages), attend, page_size=page_size, record=record)
    last = jnp.concatenate([x[0, :bd], x[0, bd + ch.last_index]])  # [Bd + Bp, E]
    sample_positions = jnp.concatenate([d.positions, ch.positions[ch.last_index]]) + 1  # [Bd + Bp]
    sampling = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), d.sampling, ch.sampling)
    next_tokens, log_probs = sample_rows(model, last, sample_positions, sampling)
    if experts is not None:  # [1, Bd + Tp, L, k] -> [Bd + Bp, C, L, k]
        e_d = jnp.pad(experts[0, :bd, None], ((0, 0), (0, c - 1), (0, 0), (0, 0)), constant_values=-1)
        experts = jnp.concatenate([e_d, experts[0, bd:][ch.query_index]])
    return kv_cache, next_tokens, log_probs, sample_positions, experts


def make_mixed_fn(graphdef: nnx.GraphDef, page_size: int, attention: PagedAttention, num_steps: int,
                  on_trace: Callable[[], None], record: bool = False):
    """`mixed(state, kv_cache, inputs: MixedInputs) -> (kv_cache, tokens [Bd + Bp,
    num_steps], log_probs [Bd + Bp, num_steps], experts or None)`: one mixed step
    (`mixed_forward_and_sample`), then up to `num_steps - 1` more decode steps for the
    decode rows (`decode_loop`; a decode row runs `decode.n_steps` steps in all, a chunk
    row samples one token, in column 0). With `record`, experts are `[Bd + Bp, C +
    num_steps - 1, L, k]`: the mixed step's (a decode row's in column 0), then the token a
    decode row fed at each later step."""

    def mixed(state: nnx.State, kv_cache: jax.Array, inputs: MixedInputs):
        on_trace()
        model = nnx.merge(graphdef, state)
        d = inputs.decode
        bd, bp = d.tokens.shape[0], inputs.chunks.query_index.shape[0]
        kv_cache, tokens, log_probs, positions, experts = mixed_forward_and_sample(
            model, kv_cache, inputs, page_size=page_size, attention=attention, record=record)
        if num_steps == 1:
            return kv_cache, tokens[:, None], log_probs[:, None], experts
        kv_cache, more_tokens, more_log_probs, more_experts = decode_loop(
            model, kv_cache, tokens[:bd], positions[:bd], d.page_table, jnp.maximum(d.n_steps - 1, 0),
            d.sampling, num_steps=num_steps - 1, page_size=page_size, attention=attention.decode, record=record)

        def with_chunk_rows(first, more, fill):  # [Bd + Bp] and [Bd, steps - 1, ...] -> [Bd + Bp, steps, ...]
            more = jnp.concatenate([more, jnp.full((bp, *more.shape[1:]), fill, more.dtype)])
            return jnp.concatenate([first[:, None] if first.ndim == 1 else first, more], axis=1)

        tokens = with_chunk_rows(tokens, more_tokens, 0)
        log_probs = with_chunk_rows(log_probs, more_log_probs, 0.0)
        if experts is not None:
            experts = with_chunk_rows(experts, more_experts, -1)  # [Bd + Bp, C + num_steps - 1, L, k]
        return kv_cache, tokens, log_probs, experts

    return mixed
