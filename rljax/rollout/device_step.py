"""The device half of the rollout engine: one replica's parameters, KV pool and compiled
programs, running the scheduler's `StepPlan`s.

`run(plan)` packs the plan into typed, bucket-padded inputs (`rljax.rollout.step_inputs`),
calls the compiled prefill, decode or mixed program with the KV pool donated, and returns
each row's sampled tokens and log_probs. Nothing here is global: the parameters and the
pool (and so the devices or sub-mesh they live on) are constructor inputs, so one device
step per data-parallel replica is one more instance; `for_model` is the single-replica
construction (the pool beside the model's parameters).
"""

from __future__ import annotations

import contextlib

from dataclasses import dataclass
from typing import Callable

import jax
import numpy as np
from flax import nnx

from rljax.models.transformer import Decoder
from rljax.rollout.attention import paged_attention
from rljax.rollout.buckets import Buckets
from rljax.rollout.config import SamplerConfig
from rljax.rollout.forward import make_decode_fn, make_mixed_fn, make_prefill_fn
from rljax.rollout.kv_cache import KVPool, cache_sharding, plan_cache
from rljax.rollout.program_share import PROCESS_SHARE, CompileCounts, ProgramShare
from rljax.rollout.scheduler import StepKind, StepPlan
from rljax.rollout.step_inputs import MixedInputs, pack_step, result_rows


def make_programs(graphdef: nnx.GraphDef, config: SamplerConfig, head_dim: int,
                  on_trace: Callable[[str], Callable[[], None]] = lambda kind: lambda: None,
                  pool_sharding: jax.sharding.Sharding | None = None) -> dict[StepKind, Callable]:
    """The jitted prefill, decode and mixed programs, `program(state, kv_pool, inputs) ->
    (kv_pool, tokens, log_probs, experts)` with the pool donated (experts: the
    routing with `config.record_routing` on a MoE model, else None). `on_trace(kind)` gives the
    callback run when a program of that kind is traced. Shared by `DeviceStep` and
    ahead-of-time compilation (`rljax.tpu.programs`), which lowers them on abstract shapes.
    `pool_sharding`: where the pool lives (a kernel that cannot be partitioned runs per
    shard of its mesh)."""
    page_size = config.kv_cache.page_size
    mesh = getattr(pool_sharding, "mesh", None)
    attention = paged_attention(config.attention, head_dim, page_size, mesh)
    record = config.record_routing
    decode = make_decode_fn(graphdef, page_size, attention, config.num_scheduler_steps, on_trace("decode"), record)
    prefill = make_prefill_fn(graphdef, page_size, attention, on_trace("prefill"), record)
    mixed = make_mixed_fn(graphdef, page_size, attention, config.num_scheduler_steps, on_trace("mixed"), record)
    return {
        StepKind.PREFILL: jax.jit(prefill, donate_argnums=(1,)),
        StepKind.DECODE: jax.jit(decode, donate_argnums=(1,)),
        StepKind.MIXED: jax.jit(mixed, donate_argnums=(1,)),
    }


def _expert_mesh(model: Decoder, state: nnx.State):
    """The (data, fsdp, tensor) mesh a MoE model's experts are laid out on, else None."""
    from jax.sharding import NamedSharding

    from rljax.parallel import MESH_AXES

    if not model.config.is_moe:
        return None
    sharding = state["layers"]["expert_gate"][...].sharding
    if isinstance(sharding, NamedSharding) and set(MESH_AXES) <= set(sharding.mesh.axis_names):
        return sharding.mesh
    return None


@dataclass(frozen=True)
class StepResult:
    """What one call sampled, per plan row (padding rows dropped)."""

    tokens: np.ndarray  # [rows, steps] int32; prefill: steps = 1, decode, mixed: num_scheduler_steps
    log_probs: np.ndarray  # [rows, steps] float32
    # routing record [rows, T, L, k]: a prefill row's chunk (then, in a mixed call, the token fed at each
    # later step), a decode row's token fed at each step
    experts: np.ndarray | None = None


def _mixed_routing(plan: StepPlan, chunk: int, experts: np.ndarray) -> np.ndarray:
    """A mixed call's routing `[rows, C + steps - 1, L, k]` (the mixed step's columns,
    then one per later step) as the scheduler takes it: each row's computed tokens
    first (a decode row's one, a chunk row's chunk), then its later steps'."""
    out = np.full_like(experts, -1)
    later = experts.shape[1] - chunk
    for i, row in enumerate(plan.rows):
        head = 1 if i < plan.num_decode_rows else len(row.tokens)
        out[i, :head] = experts[i, :head]
        out[i, head:head + later] = experts[i, chunk:]
    return out


class DeviceStep:
    """Compiled prefill / decode programs over one set of parameters and one `KVPool`.
    With `config.share_programs`, their backend compiles go through `share` (default: the
    process's `PROCESS_SHARE`): a program another same-shaped DeviceStep compiled is
    loaded onto this one's devices (`compile_counts` counts both)."""

    def __init__(self, graphdef: nnx.GraphDef, state: nnx.State, pool: KVPool, config: SamplerConfig,
                 head_dim: int, mesh=None, share: ProgramShare | None = None):
        self.graphdef = graphdef
        # traced under this (data, fsdp, tensor) mesh when given: a MoE model's experts stay
        # split over it (`rljax.models.moe.expert_parallel_dispatch`), as in the train step
        self.mesh = mesh
        self.state = state
        self.pool = pool
        self.buckets = Buckets.from_config(config)
        self.compiled_shapes: list[str] = []  # each traced program, as kind[rows x tokens, W=width]
        self._label = ""  # the shape of the call being made, for `compiled_shapes`
        self.programs = make_programs(graphdef, config, head_dim, self._traced, pool.sharding)
        self.compile_counts = CompileCounts()
        if not config.share_programs:
            share = ProgramShare(enabled=False)  # counts compiles, shares none
        self.share = PROCESS_SHARE if share is None else share

    @classmethod
    def for_model(cls, model: Decoder, config: SamplerConfig) -> "DeviceStep":
        """The model's parameters where they are, committed (so the trainer's arrays that
        `update_params` places there hit the same compiled programs: same buffers, no
        copy), and the pool over the same devices."""
        graphdef, state = nnx.split(model)
        state = jax.tree.map(lambda a: jax.device_put(a, a.sharding), state)
        sharding = cache_sharding(state, model.config.num_key_value_heads)
        device = min(sharding.device_set, key=lambda d: d.id)
        shape = plan_cache(model.config, config, model.policy.compute, device)
        return cls(graphdef, state, KVPool(shape, sharding), config, model.config.head_dim, _expert_mesh(model, state))

    def _traced(self, kind: str) -> Callable[[], None]:
        def on_trace():
            self.compiled_shapes.append(kind + self._label)

        return on_trace

    def run(self, plan: StepPlan) -> StepResult:
        """Run one call; the pool is replaced by the updated one."""
        inputs = pack_step(plan, self.buckets)
        self._label = inputs.label
        context = contextlib.nullcontext() if self.mesh is None else jax.sharding.use_abstract_mesh(
            self.mesh.abstract_mesh)
        with context, self.share.scope(self.compile_counts):
            self.pool.kv, tokens, log_probs, experts = self.programs[plan.kind](self.state, self.pool.kv, inputs)
        # tokens / log_probs [B] (prefill) or [B, steps]; experts [B, T or steps, L, k] or None
        tokens, log_probs, experts = jax.device_get((tokens, log_probs, experts))
        rows, padded = result_rows(plan, inputs), tokens.shape[0]
        if experts is not None:
            experts = experts[rows]
            if isinstance(inputs, MixedInputs):
                experts = _mixed_routing(plan, inputs.chunks.query_index.shape[1], experts)
        return StepResult(tokens.reshape(padded, -1)[rows], log_probs.reshape(padded, -1)[rows], experts)

    def update_params(self, state: nnx.State, copy: bool = False) -> None:
        """Use new parameters (an nnx.State of the same Decoder) from the next call on.
        Arrays are placed with the current shardings and dtypes by `jax.device_put` on
        device (no host round-trip; no copy when they already match). `copy=True`
        forces a device copy, for a trainer that donates its parameter buffers."""
        old_paths, old_tree = jax.tree_util.tree_flatten_with_path(self.state)
        new_paths, _ = jax.tree_util.tree_flatten_with_path(state)
        old_keys = [jax.tree_util.keystr(p) for p, _ in old_paths]
        new_keys = [jax.tree_util.keystr(p) for p, _ in new_paths]
        if old_keys != new_keys:  # compare names only: variable metadata may differ
            missing = sorted(set(old_keys) - set(new_keys))[:4]
            extra = sorted(set(new_keys) - set(old_keys))[:4]
            raise ValueError(f"update_params: the state does not match the sampler's model "
                             f"(missing {missing}, unexpected {extra})")
        placed = []
        for (_, new), (_, old) in zip(new_paths, old_paths):
            if new.shape != old.shape:
                raise ValueError(f"update_params: shape {new.shape} where the sampler has {old.shape}")
            if new.dtype != old.dtype:
                new = new.astype(old.dtype)
            placed.append(jax.device_put(new, old.sharding, may_alias=False if copy else None))
        self.state = jax.tree.unflatten(old_tree, placed)

    @property
    def num_compiled_programs(self) -> int:
        """Executables in the programs' jit caches (one per shape / sharding)."""
        return sum(program._cache_size() for program in self.programs.values())
