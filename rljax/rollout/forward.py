"""The decoder's forward pass over a paged KV cache, as pure functions to jit.

Same math as `Decoder.hidden_states` (the trainer's forward): embed, then a `lax.scan`
over the stacked layers running `attention_inputs` and `attention_output_and_mlp`, with
paged attention in place of full attention. The key / value pools travel in the scan
carry and each layer writes this step's keys and values into its pages with one
scatter (`.at[].set`), so with the pools donated XLA updates them in place.

Two programs are built from it:
- `make_prefill_fn`: computes `[B, T]` tokens (prompt chunks), then samples one token
  per row from the logits of the row's last computed token.
- `make_decode_fn`: `num_steps` decode steps in one call (an on-device loop feeding each
  step's sampled token to the next), which amortises dispatch and host transfers over
  several tokens. Row b runs `n_steps[b] <= num_steps` steps; later steps of that row
  write only to the null page and their tokens are ignored by the engine.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from rljax.models.transformer import Decoder, attention_inputs, attention_output_and_mlp, rope_cos_sin
from rljax.rollout.sampling import sample_tokens

# The arrays of one call, numpy on the host, padded to bucketed shapes:
#   tokens [B, T] int32, positions [B, T] int32 (of the first token for decode),
#   valid [B, T] bool, page_table [B, W] int32, kv_lens [B] int32 (prefill),
#   last_index [B] int32 (prefill: the column whose logits are sampled),
#   n_steps [B] int32 (decode: steps this row runs), temperature / top_p / min_p [B]
#   float32, top_k / seeds / sample_index [B], streams [B, 2] uint32. A sampled token's
#   absolute position (part of its random key) is its predecessor's position + 1.
StepBatch = dict[str, jax.Array]

SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "seeds", "streams", "sample_index")


def forward_and_sample(
    model: Decoder,
    k_cache: jax.Array,
    v_cache: jax.Array,
    tokens: jax.Array,
    positions: jax.Array,
    valid: jax.Array,
    page_table: jax.Array,
    kv_lens: jax.Array,
    last_index: jax.Array,
    sampling: dict[str, jax.Array],
    *,
    page_size: int,
    attention: Callable,
):
    """Write `tokens`' keys / values into their pages, run the decoder over them and
    sample one token per row. Returns (k_cache, v_cache, tokens [B], logprobs [B])."""
    config = model.config
    b = tokens.shape[0]
    # Where each token's key / value goes; padding goes to the null page 0.
    column = jnp.minimum(positions // page_size, page_table.shape[1] - 1)
    write_page = jnp.take_along_axis(page_table, column, axis=1)
    write_page = jnp.where(valid, write_page, 0)
    write_slot = jnp.where(valid, positions % page_size, 0)
    cos, sin = rope_cos_sin(positions, config)

    def block(carry, xs):
        x, kc, vc = carry
        p, layer = xs
        q, k, v = attention_inputs(p, x, cos, sin, config)
        kc = kc.at[layer, write_page, write_slot].set(k.astype(kc.dtype), mode="promise_in_bounds")
        vc = vc.at[layer, write_page, write_slot].set(v.astype(vc.dtype), mode="promise_in_bounds")
        attn = attention(q, kc, vc, layer, page_table, positions, kv_lens)
        x = attention_output_and_mlp(p, x, attn.astype(x.dtype), config)
        return (x, kc, vc), None

    layers = jnp.arange(config.num_hidden_layers, dtype=jnp.int32)
    x0 = model.embed_tokens(tokens)
    (x, k_cache, v_cache), _ = jax.lax.scan(block, (x0, k_cache, v_cache), (model.layer_arrays(), layers))
    last = x[jnp.arange(b), last_index]  # [B, E]
    sample_positions = positions[jnp.arange(b), last_index] + 1  # [B] where the sampled token goes
    logits = model.logits(model.final_hidden(last)[:, None, :])[:, 0, :]
    next_tokens, logprobs = sample_tokens(
        logits,
        sampling["temperature"],
        sampling["top_k"],
        sampling["top_p"],
        sampling["min_p"],
        sampling["seeds"],
        sampling["streams"],
        sampling["sample_index"],
        sample_positions,
    )
    return k_cache, v_cache, next_tokens, logprobs


def make_prefill_fn(graphdef: nnx.GraphDef, page_size: int, attention: Callable, on_trace: Callable[[], None]):
    """`prefill(state, k_cache, v_cache, batch) -> (k_cache, v_cache, tokens [B], logprobs [B])`.
    `on_trace` runs each time the function is traced (once per compiled shape)."""

    def prefill(state: nnx.State, k_cache: jax.Array, v_cache: jax.Array, batch: StepBatch):
        on_trace()
        model = nnx.merge(graphdef, state)
        return forward_and_sample(
            model, k_cache, v_cache, batch["tokens"], batch["positions"], batch["valid"], batch["page_table"],
            batch["kv_lens"], batch["last_index"], {k: batch[k] for k in SAMPLING_KEYS},
            page_size=page_size, attention=attention,
        )

    return prefill


def make_decode_fn(
    graphdef: nnx.GraphDef, page_size: int, attention: Callable, num_steps: int, on_trace: Callable[[], None]
):
    """`decode(state, k_cache, v_cache, batch) -> (k_cache, v_cache, tokens [B, num_steps],
    logprobs [B, num_steps])`: `num_steps` decode steps, each feeding its sampled
    token to the next. `batch["tokens"]` `[B, 1]` is each row's last token and
    `batch["positions"]` `[B, 1]` its position."""

    def decode(state: nnx.State, k_cache: jax.Array, v_cache: jax.Array, batch: StepBatch):
        on_trace()
        model = nnx.merge(graphdef, state)
        sampling = {k: batch[k] for k in SAMPLING_KEYS}
        n_steps = batch["n_steps"]
        zeros = jnp.zeros_like(n_steps)

        def one(carry, i):
            kc, vc, token, position = carry
            valid = (i < n_steps)[:, None]
            kc, vc, token, logprob = forward_and_sample(
                model, kc, vc, token[:, None], position[:, None], valid, batch["page_table"], position + 1,
                zeros, sampling, page_size=page_size, attention=attention,
            )
            return (kc, vc, token, position + 1), (token, logprob)

        init = (k_cache, v_cache, batch["tokens"][:, 0], batch["positions"][:, 0])
        (k_cache, v_cache, *_), (tokens, logprobs) = jax.lax.scan(one, init, jnp.arange(num_steps))
        return k_cache, v_cache, tokens.T, logprobs.T

    return decode
