"""Every program an RL run executes, as (jitted function, abstract arguments) pairs.

The functions are the run's own: the train step of `rljax.rl.learner.learner_update`
(the actor's objective, and the critic's when the estimator needs values), the batch
forwards of `rljax.rl.forwards.BatchForwards` (old / reference log-probs, exact KL,
values), the sampler's prefill and decode programs of
`rljax.rollout.device_step.make_programs` (one replica of the rollout layout, at the
largest buckets the scheduler uses) and the weight hand-off's reshard (with the rollout
devices apart from the trainer's on several hosts, first the transfer program over the
union of both sets, `rljax.rollout.cross_transfer.UnionTransfer`'s). Only the
arguments are new: `jax.ShapeDtypeStruct`s with the shardings a run gives its arrays, on
`devices` (e.g. a TPU topology's, `rljax.tpu.topology`). Nothing is allocated.

Row shapes, as the run makes them: a train step's mini-batch is `ppo_mini_batch_size x
rollout.n` rows of `max_prompt_length + response_length` tokens (the longest bucket),
cut in micro-batches inside the step; the forwards see the whole step batch
(`data.train_batch_size x rollout.n` rows). Prefill: for each chunk bucket the scheduler
can use, the most rows whose padded `[rows, chunk]` fits `max_num_batched_tokens`;
decode: `max_num_seqs` rows (the largest bucket); both with the widest page table.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rljax.algos.registry import get_adv_estimator
from rljax.models import DTypePolicy, ModelConfig, init_model, read_config
from rljax.models.attention import compiling_for, resolve_attention
from rljax.models.heads import ScalarHeadModel
from rljax.parallel import batch_sharding, make_mesh, replicated, state_shardings
from rljax.rl.batch import BatchFields, StepBatch, abstract_batch
from rljax.rl.config import RLConfig
from rljax.rl.forwards import BatchForwards
from rljax.rl.learner import learner_update
from rljax.rl.actor_critic import (ActorBatch, CriticBatch, actor_objective, critic_objective, packs_sequences,
                                   shares_prompts)
from rljax.rl.packing import PACKED_FIELDS
from rljax.rollout.attention import cache_head_dim, resolve_paged_attention, tpu_queries_per_block
from rljax.rollout.buckets import Buckets
from rljax.rollout.config import SamplerConfig
from rljax.rollout.device_step import make_programs
from rljax.rollout.handoff import cast_shapes
from rljax.rollout.kv_cache import CacheShape, cache_sharding
from rljax.rollout.replicas import ReplicaLayout
from rljax.rollout.scheduler import StepKind
from rljax.rollout.step_inputs import DecodeInputs, MixedInputs, PrefillInputs, RaggedChunks, SamplingInputs
from rljax.train.setup import load_tokenizer, model_config_from_section
from rljax.train.steps import init_train_state

# every `Program.kind`, in the order a run's programs are listed
PROGRAM_KINDS = ("train", "forward", "handoff", "prefill", "decode", "mixed")


@dataclass
class Program:
    """One program of a run, ready to lower.

    kind: one of `PROGRAM_KINDS` (train | forward | handoff | prefill | decode | mixed).
    tokens: tokens one call processes (train / forward: rows x length; prefill: padded
        rows x chunk; decode: rows x steps), over all its devices.
    model_flops: matmul FLOPs of those tokens (`ModelConfig.flops_per_token`), 0 for the
        hand-off.
    devices: chips the program runs on (a replica's for the sampler).
    kernel_bytes: HBM bytes per chip per call read inside Pallas kernels, which XLA's
        cost analysis does not see (a Mosaic custom call counts 0): the decode step's
        K / V pages under `attention: pallas_tpu`, for full page tables (an upper
        bound: the kernel stops at each row's length). Added to the roofline's bytes.
    kernel_flops: FLOPs per chip per call inside Pallas kernels, likewise unseen: the
        train step's causal attention under splash, counted by the model-FLOPs convention
        (forward + 2x forward for the backward; the kernel does more: flash's backward
        recomputes the scores, remat recomputes the forward), so the bound stays an upper
        bound on speed. Added to the roofline's FLOPs.
    """

    name: str
    kind: str
    fn: Callable
    args: tuple
    tokens: int
    model_flops: float
    devices: int
    mesh: Any  # the mesh active while it is traced (a replica's for the sampler)
    kernel_bytes: float = 0.0
    kernel_flops: float = 0.0
    estimate: str = ""  # the key of `rljax plan`'s per-chip estimate for it (`rljax compile`); "": `kind`

    def lower(self):
        # the abstract mesh only (what `constrain` and the kernels' shard_map read): a concrete TPU mesh
        # would send the host-side eager arrays some kernels build (splash's mask metadata) to devices
        # this process cannot run
        with jax.sharding.use_abstract_mesh(self.mesh.abstract_mesh), compiling_for(_platform(self.mesh)):
            return self.fn.lower(*self.args)


def _platform(mesh) -> str:
    return next(iter(mesh.devices.flat)).platform


def model_config(cfg: RLConfig) -> ModelConfig:
    """The run's ModelConfig, as `build_decoder(weights=False)` reads it."""
    section = cfg.model
    if section.path:
        return read_config(section.path)
    tokenizer = None if "vocab_size" in section.hf_config else load_tokenizer(section)
    return model_config_from_section(section, tokenizer)


def _abstract(tree, shardings):
    """ShapeDtypeStructs of `tree` (shapes) laid out by the matching `shardings`."""
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), tree, shardings)


def _reshard_source(source: NamedSharding, target: NamedSharding) -> NamedSharding:
    """`source`'s layout expressed over `target`'s device order, as `jax.device_put` does
    before its reshard program when the two meshes order the same devices differently
    (the training mesh follows the torus, the replica mesh device ids): same blocks on the
    same devices, so the compiled program is the hand-off's. Mirrors
    `jax._src.dispatch._different_device_order_reshard`."""
    source_devices = list(source.mesh.devices.flat)
    target_devices = list(target.mesh.devices.flat)
    if source_devices == target_devices:
        return source
    mesh = Mesh(target.mesh.devices.reshape(source.mesh.axis_sizes), source.mesh.axis_names,
                axis_types=source.mesh.axis_types)
    logical = None if source.is_fully_replicated else tuple(target_devices.index(d) for d in source_devices)
    return NamedSharding(mesh, source.spec, _logical_device_ids=logical)


def _rows(view: type, cfg: RLConfig, rows: int, length: int, mesh, model: ModelConfig, extra: tuple[str, ...] = ()):
    """The abstract `view` of the run's step batch (`rljax.rl.batch.abstract_batch`):
    `rows x length`, the fields the config asks for and the `extra` ones (packing's), rows
    split over the mesh."""
    return abstract_batch(view, BatchFields.of(cfg), rows, length,
                          (model.num_hidden_layers, model.num_experts_per_tok), batch_sharding(mesh), extra)


@dataclass
class RunPrograms:
    """The programs, plus what a report prints beside them."""

    programs: list[Program]
    mesh: Any
    layout: ReplicaLayout | None  # the rollout replicas (rollout.tensor_parallel_size >= 1)
    num_pages: int  # KV pages in one sampler's pool
    model: ModelConfig
    notes: list[str]


def run_programs(cfg: RLConfig, devices: list, *, config: ModelConfig | None = None, num_pages: int,
                 single_micro_batch: bool = False, num_scheduler_steps: int | None = None,
                 all_buckets: bool = False, replica_devices: list | None = None,
                 rollout_devices: list | None = None) -> RunPrograms:
    """The run's programs on `devices`. `config` replaces the model's (e.g. fewer layers,
    for the roofline's per-layer costs); `num_pages` sizes each sampler's KV pool;
    `single_micro_batch` compiles the train steps with one micro-batch per mini-batch and
    `num_scheduler_steps` overrides the decode loop (both for the roofline).
    `replica_devices` (tp of them) are where one replica's sampler programs are compiled
    (default: the layout's first replica; see `rljax.tpu.topology.sub_slice`).
    `rollout_devices`, disjoint from `devices` (an asynchronous `trainer.mode`'s share,
    `rljax.rl.async_config.split_devices`): the replicas' layout is built over them, the
    training mesh over `devices`; the hand-off is then, on several hosts, the transfer
    program over the union of both sets followed by the reshard within the rollout
    devices, and on one host (a `jax.device_put` between the two sets, no program) none.
    Default: the replicas share `devices` (`trainer.mode: sync`)."""
    model = config or model_config(cfg)
    section, a, r = cfg.model, cfg.actor, cfg.rollout
    policy = DTypePolicy(section.param_dtype, section.compute_dtype)
    mesh = make_mesh(cfg.mesh, devices)
    row = cfg.row_length
    platform = _platform(mesh)
    notes: list[str] = []

    def decoder():
        return init_model(model, seed=section.init_seed, policy=policy, remat=section.remat,
                          attention=section.attention)

    # the train step's attention FLOPs inside the splash kernel, per token (see `Program.kernel_flops`)
    train_attention = resolve_attention(section.attention, platform, policy.compute, model.head_dim)
    def splash_flops(length: int) -> float:
        return model.attention_flops_per_token(length, training=True) if train_attention == "splash" else 0.0

    programs: list[Program] = []
    # built outside `jax.set_mesh`: optax initialises placeholders eagerly, which must not target the
    # topology's devices; the programs are traced under their mesh in `Program.lower`
    with compiling_for(platform):
        graphdef, params = nnx.split(nnx.eval_shape(decoder))
        param_shardings = state_shardings(params, mesh)
        abstract_params = _abstract(params, param_shardings)
        reference = abstract_params if a.kl_loss or cfg.algorithm.use_kl_in_reward else None

        def train_program(name, graph, state_params, optim, objective, totals, inputs, mini, micro, epochs, frozen,
                          pack=False, share_prompts=False):
            update = learner_update(graph, state_params, optim, objective, totals, cfg, mesh, mini,
                                    0 if single_micro_batch else micro, epochs, pack)
            shapes = jax.eval_shape(lambda p: init_train_state(p, update.optimizer, cfg.trainer.seed), state_params)
            f = update.pack_factor or 1  # packed: rows f times as long, f times fewer
            rows, length = update.mini_rows // f, f * row
            extra = PACKED_FIELDS if update.pack_factor else ()
            extra += ("branch_ids",) if update.pack_factor and share_prompts else ()
            batch = _rows(inputs, cfg, rows, length, mesh, model, extra)
            tokens = rows * length
            packed = ", packed" if update.pack_factor else ""
            label = f"{name} train step [{rows}x{length}, {update.mini_rows // update.micro_rows} micro{packed}]"
            # base None: no LoRA here (the step merges the trained params alone)
            return Program(label, "train", update.step, (_abstract(shapes, update.state_sharding), batch, frozen, None),
                           tokens, tokens * model.flops_per_token(length), len(devices), mesh,
                           kernel_flops=tokens * splash_flops(length) / len(devices))

        correction = cfg.algorithm.rollout_correction
        objective, totals = actor_objective(a, r.temperature, correction)
        programs.append(train_program("actor", graphdef, params, a.optim, objective, totals, ActorBatch,
                                      a.ppo_mini_batch_size, a.ppo_micro_batch_size_per_device, a.ppo_epochs,
                                      reference, packs_sequences(a, correction),
                                      shares_prompts(a, correction, train_attention)))
        critic_graph = critic_params = None
        if get_adv_estimator(cfg.algorithm.adv_estimator).needs_critic:
            c = cfg.critic
            critic_graph, critic_state = nnx.split(nnx.eval_shape(
                lambda: ScalarHeadModel(decoder(), rngs=nnx.Rngs(cfg.trainer.seed + 1))))
            critic_params = _abstract(critic_state, state_shardings(critic_state, mesh))
            programs.append(train_program("critic", critic_graph, critic_state, c.optim, critic_objective(c), None,
                                          CriticBatch, c.ppo_mini_batch_size, c.ppo_micro_batch_size_per_device,
                                          c.ppo_epochs, None))

        # the step batch's forwards
        forwards = BatchForwards.of(cfg, graphdef, critic_graph)
        rows = cfg.data.batch_size * r.n
        step_batch = _rows(StepBatch, cfg, rows, row, mesh, model)
        ids, mask = step_batch.input_ids, step_batch.attention_mask
        replay = (step_batch.expert_ids,) if forwards.router_replay else ()
        tokens = rows * row
        flops = tokens * model.flops_per_token(row, training=False)
        old = not (forwards.reuse_rollout_log_probs or forwards.old_from_update)  # else no forward for them
        if old or forwards.ref_log_probs:
            users = (["old"] if old else []) + (["reference"] if forwards.ref_log_probs else [])
            programs.append(Program(f"log-probs forward ({' + '.join(users)}) [{rows}x{row}]", "forward",
                                    forwards.log_probs, (abstract_params, ids, mask, *replay), tokens, flops,
                                    len(devices), mesh))
        if forwards.full_kl is not None:
            programs.append(Program(f"exact KL forward (policy + reference) [{rows}x{row}]", "forward",
                                    forwards.full_kl, (abstract_params, reference, ids, mask, *replay), tokens,
                                    2 * flops, len(devices), mesh))
        if forwards.values is not None:
            programs.append(Program(f"critic values forward [{rows}x{row}]", "forward", forwards.values,
                                    (critic_params, ids, mask), tokens, flops, len(devices), mesh))

    # the sampler: one replica of the rollout layout (all replicas run the same programs)
    sampler = cfg.sampler_config()
    if num_scheduler_steps is not None:
        sampler = dataclasses.replace(sampler, num_scheduler_steps=num_scheduler_steps)
    layout = None
    if r.tensor_parallel_size:
        tp = r.tensor_parallel_size
        samplers = devices if rollout_devices is None else rollout_devices
        dp = r.data_parallel_size or len(samplers) // tp
        ordered = sorted(samplers, key=lambda d: (d.process_index, d.id))[: dp * tp]
        layout = ReplicaLayout.create(ordered, tp, dp, r.allow_cross_host_replicas)
        sampler_mesh = layout.replicas[0]
        if replica_devices is not None:  # the same replica mesh, built by the same code, on other chips
            sampler_mesh = ReplicaLayout.create(replica_devices, tp, 1).replicas[0]
            notes.append(f"a replica's sampler programs are compiled on {len(replica_devices)} chips of their own "
                         "topology (libtpu cannot compile collectives over a subset of a multi-host slice)")
        # the replicas hold the weights in rollout.weight_dtype: the hand-off casts them where they lie, then reshards
        weights = cast_shapes(params, cfg.rollout_weight_dtype)
        sampler_state = _abstract(weights, state_shardings(params, sampler_mesh))
        targets = state_shardings(params, layout.mesh)
        handoff = jax.jit(lambda p: p, out_shardings=targets)
        dtype = jnp.dtype(cfg.rollout_weight_dtype).name
        if rollout_devices is None:
            sources = jax.tree.map(_reshard_source, param_shardings, targets)
            programs.append(Program(f"weight hand-off ({dtype}, training layout -> {dp} replicas x tp={tp})",
                                    "handoff", handoff, (_abstract(weights, sources),), 0, 0.0, len(devices),
                                    layout.mesh))
        elif len({d.process_index for d in (*devices, *rollout_devices)}) > 1:
            transfer, mirror = union_transfer(weights, param_shardings, mesh, rollout_devices)
            programs.append(transfer)
            sources = jax.tree.map(lambda s, t: _reshard_source(NamedSharding(mirror, s.spec), t), param_shardings,
                                   targets)
            programs.append(Program(f"weight hand-off ({dtype}, trainer layout on the rollout chips -> {dp} replicas "
                                    f"x tp={tp})", "handoff", handoff, (_abstract(weights, sources),), 0, 0.0,
                                    len(rollout_devices), layout.mesh))
        else:
            notes.append("one host: the weights cross from the trainer's chips to the rollout chips by a "
                         "jax.device_put between the two sets (no program to compile)")
    else:
        sampler_mesh = mesh
        sampler_state = abstract_params
        notes.append("rollout.tensor_parallel_size=0: the sampler reads the trainer's arrays where they are "
                     "(no hand-off program)")
    programs += sampler_programs(graphdef, sampler_state, sampler, model, num_pages, sampler_mesh, policy.compute,
                                 all_buckets)
    return RunPrograms(programs, mesh, layout, num_pages, model, notes)


def union_transfer(params, shardings, mesh: Mesh, rollout_devices: list) -> tuple[Program, Mesh]:
    """The program that moves the trainer's weights (`params`, laid out by `shardings`
    on `mesh`) onto the disjoint `rollout_devices` on several hosts: the one
    `rljax.rollout.cross_transfer.UnionTransfer` runs, over its union mesh `[role = 2,
    *mesh.shape]`, each leaf a `[2, ...]` array sharded `P("role", *spec)` whose row 0
    is copied onto row 1. Also returns the mirror mesh (the rollout devices arranged like
    `mesh`), where the transferred weights land."""
    from rljax.rollout.cross_transfer import UnionTransfer, _copy_row0

    cross = UnionTransfer(mesh, rollout_devices)  # meshes only: nothing is allocated
    leaves = jax.tree.leaves(params)
    stacked = [jax.ShapeDtypeStruct((2, *x.shape), x.dtype, sharding=NamedSharding(cross.union, P("role", *s.spec)))
               for x, s in zip(leaves, jax.tree.leaves(shardings))]
    fn = jax.jit(_copy_row0, out_shardings=[x.sharding for x in stacked])
    chips = cross.union.devices.size
    return Program(f"weight transfer (trainer chips -> rollout chips, one program over the union of {chips} chips)",
                   "handoff", fn, (stacked,), 0, 0.0, chips, cross.union, estimate="transfer"), cross.mirror


def sampler_programs(graphdef: nnx.GraphDef, state, config: SamplerConfig, model: ModelConfig, num_pages: int,
                     mesh, compute_dtype, all_buckets: bool = False) -> list[Program]:
    """Prefill and decode (the largest row bucket) programs, both with the widest page
    table, on `mesh`. Prefill: for each chunk bucket a row of `max_model_len` tokens can
    use, the most rows the token budget allows; without `all_buckets` only the first and
    the last of these (the most rows, the longest chunk). With `config.mixed_steps`, also
    the mixed program at its largest: every decode row, and the longest chunk in the
    budget they leave, with the most rows."""
    dtype = jnp.dtype(config.kv_cache.dtype or compute_dtype)  # as `plan_cache` sizes it
    pool_sharding = cache_sharding(state, model.num_key_value_heads)
    with compiling_for(_platform(mesh)):
        fns = make_programs(graphdef, config, model.head_dim, pool_sharding=pool_sharding)
        kernel = resolve_paged_attention(config.attention)
    head_dim = cache_head_dim(kernel, model.head_dim)
    # a 0-layer build (the roofline's) still traces the layer loop's body: give it one layer of pool
    shape = CacheShape(max(model.num_hidden_layers, 1), num_pages, config.kv_cache.page_size,
                       model.num_key_value_heads, head_dim, dtype)
    pool = jax.ShapeDtypeStruct(shape.pool_shape, dtype, sharding=pool_sharding)  # [L, P, S, 2K, D]
    buckets = Buckets.from_config(config)
    rep = replicated(mesh)
    n = mesh.devices.size

    def arr(shape, dt):
        return jax.ShapeDtypeStruct(shape, dt, sharding=rep)

    def sampling(b):
        return SamplingInputs(arr((b,), jnp.float32), arr((b,), jnp.int32), arr((b,), jnp.float32),
                              arr((b,), jnp.float32), arr((b,), jnp.uint32), arr((b, 2), jnp.uint32),
                              arr((b,), jnp.int32))

    width = buckets.width[-1]
    length = width * config.kv_cache.page_size
    tensor = mesh.shape.get("tensor", 1)
    heads = model.num_key_value_heads // tensor if model.num_key_value_heads % tensor == 0 else \
        model.num_key_value_heads  # per chip, as `cache_sharding` splits the pool

    def kernel_bytes(q_lens: list[int]) -> float:
        """HBM bytes per chip the ragged kernel reads for sequences of `q_lens` queries
        (flat, back to back) over full page tables: each query block re-reads the keys and
        values of every sequence it holds, in every layer (XLA's cost analysis does not
        see inside the kernel)."""
        if kernel != "pallas_tpu":
            return 0.0
        block = tpu_queries_per_block(sum(q_lens))
        reads = sum(-(-q // block) for q in q_lens)  # one sequence's tables per query block it spans, about
        return 2.0 * reads * model.num_hidden_layers * heads * length * head_dim * dtype.itemsize

    out = []
    budget = config.max_num_batched_tokens
    # a prefill row holds at most max_model_len tokens: larger chunk buckets never run
    usable = [c for c in buckets.chunk if c <= buckets.pad_chunk(min(config.max_model_len, buckets.chunk[-1]))]
    shapes = [(max(b for b in buckets.rows if b * c <= budget), c) for c in usable
              if any(b * c <= budget for b in buckets.rows)]
    if not all_buckets:  # the extremes: the most rows, the longest chunk
        shapes = sorted({shapes[0], shapes[-1]}, key=lambda s: s[1])
    for b, chunk in shapes:
        inputs = PrefillInputs(arr((b, chunk), jnp.int32), arr((b, chunk), jnp.int32), arr((b, chunk), jnp.bool_),
                               arr((b, width), jnp.int32), arr((b,), jnp.int32), arr((b,), jnp.int32), sampling(b))
        out.append(Program(f"prefill [{b}x{chunk}, W={width}]", "prefill", fns[StepKind.PREFILL],
                           (state, pool, inputs), b * chunk,
                           b * chunk * model.flops_per_token(chunk, training=False), n, mesh,
                           kernel_bytes([chunk] * b)))
    b, steps = buckets.rows[-1], config.num_scheduler_steps
    inputs = DecodeInputs(arr((b,), jnp.int32), arr((b,), jnp.int32), arr((b, width), jnp.int32), arr((b,), jnp.int32),
                          sampling(b))
    out.append(Program(f"decode [{b}x1 x {steps} steps, W={width}, {kernel} attention]", "decode",
                       fns[StepKind.DECODE], (state, pool, inputs), b * steps,
                       b * steps * model.flops_per_token(length, training=False), n, mesh,
                       steps * kernel_bytes([1] * b)))
    if config.mixed_steps:
        left = max(budget - b, buckets.chunk[0])  # what the decode rows leave of the budget
        fitting = [s for s in shapes if s[0] * s[1] <= left] or [(1, buckets.chunk[0])]
        rows, chunk = max(fitting, key=lambda s: (s[1], s[0]))
        tp = buckets.pad_tokens(rows * chunk)
        chunks = RaggedChunks(arr((tp,), jnp.int32), arr((tp,), jnp.int32), arr((tp,), jnp.bool_),
                              arr((tp,), jnp.int32), arr((tp,), jnp.int32), arr((rows, chunk), jnp.int32),
                              arr((rows, width), jnp.int32), arr((rows,), jnp.int32), arr((rows,), jnp.int32),
                              sampling(rows))
        out.append(Program(f"mixed [{b}x1 x {steps} steps + {rows}x{chunk} chunk tokens, W={width}, "
                           f"{kernel} attention]", "mixed", fns[StepKind.MIXED],
                           (state, pool, MixedInputs(inputs, chunks)), b * steps + rows * chunk,
                           b * steps * model.flops_per_token(length, training=False)
                           + rows * chunk * model.flops_per_token(chunk, training=False), n, mesh,
                           kernel_bytes([1] * b + [chunk] * rows) + (steps - 1) * kernel_bytes([1] * b)))
    return out


def parse_kinds(text: str) -> tuple[str, ...]:
    """`"train,decode"` -> `("train", "decode")`: a comma-separated subset of
    `PROGRAM_KINDS` (`rljax compile --programs`); an unknown kind is a `ValueError`
    naming the valid ones."""
    kinds = tuple(k.strip() for k in text.split(","))
    unknown = [k for k in kinds if k not in PROGRAM_KINDS]
    if unknown:
        raise ValueError(f"--programs {text!r}: unknown program kind {', '.join(map(repr, unknown))}; "
                         f"choose from {', '.join(PROGRAM_KINDS)}")
    return kinds


def select(run: RunPrograms, kinds: tuple[str, ...]) -> RunPrograms:
    """`run` with only the programs of `kinds`, in the run's order."""
    return dataclasses.replace(run, programs=[p for p in run.programs if p.kind in kinds])


def default_pages(cfg: RLConfig) -> int:
    """Pages per sampler pool: `rollout.num_pages`, else `max_num_seqs` full-length
    sequences plus the null page (what `rljax plan` assumes)."""
    r = cfg.rollout
    if r.num_pages:
        return r.num_pages
    return r.max_num_seqs * -(-cfg.row_length // r.page_size) + 1

