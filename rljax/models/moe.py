"""Mixture-of-experts MLP: a float32 top-k router and dropless expert dispatch.

Router (Qwen3-MoE's `Qwen3MoeTopKRouter`, Mixtral's `MixtralTopKRouter` in transformers;
Shazeer et al. 2017, Fedus et al. 2021): for a token h

    p = softmax(h W_r)            (float32, over all X experts)
    S = the k experts with the largest p
    w_j = p_j                      for j in S      (Qwen3-MoE, norm_topk_prob=false)
    w_j = p_j / sum_{i in S} p_i   for j in S      (Qwen3-MoE norm_topk_prob=true; Mixtral always,
                                                    = softmax over the top-k logits)
    y = sum_{j in S} w_j * SwiGLU_j(h)

Dispatch is dropless ("sort + grouped matmul", as MegaBlocks, Gale et al. 2022): the
B*T*k token-slots are sorted by expert, each expert's contiguous group goes through its
weights with `jax.lax.ragged_dot` (group sizes from a histogram), and the results are
unsorted and summed with the router weights. No [tokens, experts, capacity] tensor and
no token is dropped.

Expert parallelism: the experts are split over the `fsdp` mesh axis (logical axis
`expert`) and stay split in the forward (`rljax.parallel.STAY_SPLIT`). Under
`shard_map` each device gathers the tokens of its fsdp group, runs the slots routed to
its own experts (the others sort to the end and count in no group, so `ragged_dot`
gives zeros there), and a `psum_scatter` over fsdp returns each device its tokens'
sums. Why fsdp rather than a fourth mesh axis: the fsdp group already owns one slice
of every weight; giving it whole experts instead keeps the mesh (data, fsdp, tensor),
the batch layout and the optimizer-state layout unchanged. What moves per layer: the
tokens' all-gather and psum_scatter, 2 fsdp b T E values, instead of
all-gathering the layer's experts, 3 X E F values (Qwen3-30B-A3B, bf16, fsdp = 64, one row of
1536 tokens per chip: 0.8 GB instead of 1.2 GB), and no chip ever holds every expert.
Experts' MLP width is split over `tensor` (a psum over it ends the down projection).

Shapes: B batch rows, T positions, E hidden, X experts, k experts per token, F expert
MLP width, S = B*T*k token-slots.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rljax.models.mlp import swiglu


class Routing(NamedTuple):
    """What one MoE layer reports about its routing."""

    experts: jax.Array  # [B, T, k] int32: the chosen experts of every token
    counts: jax.Array  # [X] float32: top-k assignments per expert, valid tokens only
    prob_sum: jax.Array  # [X] float32: router probabilities summed over valid tokens


def route(h: jax.Array, router: jax.Array, k: int, renormalise: bool) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`h` `[B, T, E]`, router weight `[E, X]` -> (top-k weights `[B, T, k]` float32, expert
    ids `[B, T, k]` int32, all probabilities `[B, T, X]` float32), as in the module
    docstring. The whole router runs in float32."""
    logits = jnp.einsum("bte,ex->btx", h.astype(jnp.float32), router.astype(jnp.float32))  # [B, T, X]
    probs = jax.nn.softmax(logits, axis=-1)  # [B, T, X]
    top, experts = jax.lax.top_k(probs, k)  # [B, T, k] each
    if renormalise:
        top = top / jnp.sum(top, axis=-1, keepdims=True)
    return top, experts.astype(jnp.int32), probs


def replay_routing(probs: jax.Array, experts: jax.Array, replay: jax.Array,
                   renormalise: bool) -> tuple[jax.Array, jax.Array]:
    """Routing replay (verl's "R3", Ma et al. 2025, "Stabilizing MoE RL by aligning training
    and inference routers"): the experts recorded by the sampler, `replay` `[B, T, k]`
    int32, replace the router's own top-k `experts` `[B, T, k]` on every token that has a
    record (`replay[..., 0] >= 0`; -1: none, the token keeps its own top-k). The weights
    stay the current router's probabilities `probs` `[B, T, X]` at the chosen experts,
    renormalised as `route` does, so the router still gets gradients:

        S = replay ids (recorded) or top-k(p) (no record);  w_j = p_j  or  p_j / sum_{i in S} p_i

    -> (weights `[B, T, k]` float32, experts `[B, T, k]` int32)."""
    recorded = replay[..., :1] >= 0  # [B, T, 1]
    experts = jnp.where(recorded, replay.astype(jnp.int32), experts)  # [B, T, k]
    top = jnp.take_along_axis(probs, experts, axis=-1)  # [B, T, k]
    if renormalise:
        top = top / jnp.sum(top, axis=-1, keepdims=True)
    return top, experts


def grouped_swiglu(xs: jax.Array, group_sizes: jax.Array, gate: jax.Array, up: jax.Array,
                   down: jax.Array) -> jax.Array:
    """`xs` `[S, E]` sorted by expert with `group_sizes` `[X']` rows each (rows past their
    sum give 0) through each group's SwiGLU MLP: gate / up `[X', E, F]`, down `[X', F, E]`
    -> `[S, E]`."""
    g = jax.lax.ragged_dot(xs, gate, group_sizes)  # [S, F]
    u = jax.lax.ragged_dot(xs, up, group_sizes)  # [S, F]
    return jax.lax.ragged_dot(swiglu(g, u), down, group_sizes)  # [S, E]


def dispatch(h: jax.Array, weights: jax.Array, experts: jax.Array, gate: jax.Array, up: jax.Array,
             down: jax.Array, first_expert: jax.Array | int = 0) -> jax.Array:
    """sum_j weights[..., j] * MLP_{experts[..., j]}(h) over the slots whose expert is one of
    the `X'` = gate.shape[0] experts `first_expert, ..., first_expert + X' - 1` held here
    (all of them without expert parallelism): `h` `[B, T, E]`, `weights` / `experts`
    `[B, T, k]` -> `[B, T, E]` (float32 accumulation, `h`'s dtype out)."""
    b, t, e = h.shape
    k = experts.shape[-1]
    local = gate.shape[0]
    slot_expert = experts.reshape(-1) - first_expert  # [S]
    held = (slot_expert >= 0) & (slot_expert < local)  # [S]
    sort_key = jnp.where(held, slot_expert, local)  # [S]; others after every group
    order = jnp.argsort(sort_key, stable=True)  # [S] slot of each sorted row
    group_sizes = jnp.zeros((local + 1,), jnp.int32).at[sort_key].add(1)[:local]  # [X']
    xs = h.reshape(b * t, e)[order // k]  # [S, E] rows grouped by expert
    ys = grouped_swiglu(xs, group_sizes, gate, up, down)  # [S, E]
    slot_out = ys[jnp.argsort(order)].reshape(b, t, k, e)  # [B, T, k, E] back in slot order
    w = jnp.where(held.reshape(b, t, k), weights, 0.0)  # [B, T, k]
    out = jnp.einsum("btke,btk->bte", slot_out.astype(jnp.float32), w.astype(jnp.float32))  # [B, T, E]
    return out.astype(h.dtype)


def dense_reference(h: jax.Array, weights: jax.Array, experts: jax.Array, gate: jax.Array, up: jax.Array,
                    down: jax.Array) -> jax.Array:
    """The same sum computed densely: every expert on every token `[X, B, T, E]`, weighted
    by the router weight scattered to `[B, T, X]` (0 for experts not chosen). For tests
    and the dispatch benchmark only: X / k times the FLOPs."""
    num_experts = gate.shape[0]
    dense_w = jnp.sum(jax.nn.one_hot(experts, num_experts, dtype=jnp.float32) * weights[..., None], axis=-2)  # [B,T,X]
    g = jnp.einsum("bte,xef->xbtf", h, gate)  # [X, B, T, F]
    u = jnp.einsum("bte,xef->xbtf", h, up)  # [X, B, T, F]
    y = jnp.einsum("xbtf,xfe->xbte", swiglu(g, u), down)  # [X, B, T, E]
    return jnp.einsum("xbte,btx->bte", y.astype(jnp.float32), dense_w).astype(h.dtype)


def routing_stats(experts: jax.Array, probs: jax.Array, valid: jax.Array | None, num_experts: int):
    """(counts `[X]`, prob_sum `[X]`) over the valid tokens (`valid` `[B, T]`, None: all):
    the per-layer sums the load-balancing loss needs (`rljax.algos.router_loss`)."""
    v = jnp.ones(experts.shape[:2], jnp.float32) if valid is None else valid.astype(jnp.float32)  # [B, T]
    slot_v = jnp.broadcast_to(v[..., None], experts.shape)  # [B, T, k]
    counts = jnp.zeros((num_experts,), jnp.float32).at[experts.reshape(-1)].add(slot_v.reshape(-1))  # [X]
    prob_sum = jnp.einsum("btx,bt->x", probs, v)  # [X]
    return counts, prob_sum


# Most tokens one expert-parallel dispatch gathers at once (its buffers hold k slots
# each): more rows per device are dispatched in chunks of rows under `lax.map`.
MAX_GATHERED_TOKENS = 1 << 17


def expert_parallel_dispatch(h: jax.Array, weights: jax.Array, experts: jax.Array, gate: jax.Array,
                             up: jax.Array, down: jax.Array) -> jax.Array:
    """`dispatch` with the experts split over the active mesh's `fsdp` axis and their MLP
    width over `tensor` (module docstring); plain `dispatch` without a mesh. Rows are
    split over (data, fsdp) when they divide, else every device holds all of them and the
    partial sums meet in a psum instead of a psum_scatter. A device's rows go through in
    chunks so that one gather holds at most `MAX_GATHERED_TOKENS` tokens (a step batch's
    forward has many rows per device; the dispatch buffers grow with fsdp x rows)."""
    from jax.sharding import PartitionSpec as P

    from rljax.parallel import BATCH_AXES, active_mesh, data_parallel_size, logical_to_spec

    mesh = active_mesh()
    if mesh is None:
        return dispatch(h, weights, experts, gate, up, down)
    split_rows = h.shape[0] % data_parallel_size(mesh) == 0
    rows = P(BATCH_AXES) if split_rows else P()
    in_out = logical_to_spec(("expert", "expert_embed", "expert_mlp"), gate.shape, mesh, "expert_gate")  # [X, E, F]
    out_in = logical_to_spec(("expert", "expert_mlp", "expert_embed"), down.shape, mesh, "expert_down")  # [X, F, E]
    fsdp = mesh.shape["fsdp"]
    local_rows = h.shape[0] // data_parallel_size(mesh) if split_rows else h.shape[0]
    chunk = max([d for d in range(1, local_rows + 1)
                 if local_rows % d == 0 and d * fsdp * h.shape[1] <= MAX_GATHERED_TOKENS] or [1])

    def gathered(h, weights, experts, gate, up, down):
        """This fsdp group's rows `[rows, T, ...]` through the experts held here."""
        first = jax.lax.axis_index("fsdp") * gate.shape[0] if in_out[0] is not None else 0
        h, weights, experts = (jax.lax.all_gather(a, "fsdp", axis=0, tiled=True) for a in (h, weights, experts))
        out = jax.lax.psum(dispatch(h, weights, experts, gate, up, down, first), "tensor")  # F slices summed
        return jax.lax.psum_scatter(out, "fsdp", scatter_dimension=0, tiled=True)  # own rows, all experts

    def local(h, weights, experts, gate, up, down):
        if not split_rows:  # every device has every row: partial sums over experts and F slices
            first = jax.lax.axis_index("fsdp") * gate.shape[0] if in_out[0] is not None else 0
            out = jax.lax.psum(dispatch(h, weights, experts, gate, up, down, first), "tensor")
            return jax.lax.psum(out, "fsdp")
        if chunk == local_rows:
            return gathered(h, weights, experts, gate, up, down)
        split = lambda a: a.reshape(local_rows // chunk, chunk, *a.shape[1:])  # noqa: E731
        out = jax.lax.map(lambda c: gathered(*c, gate, up, down), (split(h), split(weights), split(experts)))
        return out.reshape(local_rows, *out.shape[2:])

    return jax.shard_map(local, mesh=mesh, in_specs=(rows, rows, rows, in_out, in_out, out_in), out_specs=rows)(
        h, weights, experts, gate, up, down)


def moe_mlp(p: dict, h: jax.Array, config, valid: jax.Array | None = None,
            replay: jax.Array | None = None) -> tuple[jax.Array, Routing]:
    """The MoE MLP of one layer on normed hidden states `h` `[B, T, E]` with that layer's
    `router` `[E, X]`, `expert_gate` / `expert_up` `[X, E, F]`, `expert_down` `[X, F, E]`:
    (`[B, T, E]`, its `Routing`; statistics over `valid` `[B, T]` tokens). `replay`
    `[B, T, k]`: recorded experts to use instead of the top-k (`replay_routing`)."""
    weights, experts, probs = route(h, p["router"], config.num_experts_per_tok, config.norm_topk_prob)
    if replay is not None:
        weights, experts = replay_routing(probs, experts, replay, config.norm_topk_prob)
    counts, prob_sum = routing_stats(experts, probs, valid, config.num_experts)
    out = expert_parallel_dispatch(h, weights, experts, p["expert_gate"], p["expert_up"], p["expert_down"])
    return out, Routing(experts, counts, prob_sum)
