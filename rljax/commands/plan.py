"""`rljax plan CONFIG [key.sub=value ...] [--devices N] [--device-memory-gb G]`: the
memory one device needs for a run, before paying for the slice.

The config is read as a run reads it (`load`: the run kind's class through
`rljax.config.load_config`, every value checked); an RL config's row length and sampler
settings are its own (`RLConfig.row_length`, `RLConfig.sampler_config`).

Everything comes from abstract shapes (`nnx.eval_shape`, `jax.eval_shape`) and the
logical-axis rules of `rljax.parallel` on an `AbstractMesh`; nothing is allocated, so a
laptop can plan a v5e-16 run (`--devices 16 --device-memory-gb 16`).

Rows (bytes per device):
- params, optimizer state (AdamW mu + nu, dtype as optax makes them) and gradients, each
  laid out exactly as training lays them out (the rules table; ceil division per
  split dimension);
- activations of one micro-batch: an estimate from the formulas printed with the table
  (XLA may fuse some tensors away or keep a few more);
- the KV cache the sampler would need for `--kv-seqs` sequences of `--kv-len` tokens,
  sequences split over data x fsdp and kv heads over tensor;
- RL configs with `rollout.tensor_parallel_size >= 1`: the rollout replicas instead (dp x
  tp), each device's share of the replica's weights (split over tp only) and of its KV
  pool (`rollout.num_pages`, or `--kv-seqs` x `--kv-len` per replica), the full-length
  sequences that pool holds, and the weight hand-off's transient (a second copy of the
  rollout weights while the old one is released).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

HELP = "Per-device memory (params, optimizer, gradients, activations, KV cache) of a config on a mesh."

GiB = 1024**3


def add_arguments(parser) -> None:
    parser.add_argument("config", help="YAML config file (see configs/)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. mesh.data=2 mesh.fsdp=8")
    parser.add_argument("--devices", type=int, default=None,
                        help="plan for this many devices (an abstract mesh; default: this machine's)")
    parser.add_argument("--device-memory-gb", type=float, default=None,
                        help="memory per device in GB (10^9 bytes), to say whether the run fits")
    parser.add_argument("--micro-batch", type=int, default=None,
                        help="rows per micro-batch, global (default: trainer.micro_batch_size or data.batch_size)")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per row (default: data.max_length)")
    parser.add_argument("--kv-seqs", type=int, default=None, help="sequences in the KV cache (default 64)")
    parser.add_argument("--kv-len", type=int, default=None, help="tokens per cached sequence (default 2048)")
    parser.add_argument("--kv-dtype", default=None, help="KV cache dtype (default: the compute dtype)")
    parser.add_argument("--backend", default="gpu", choices=["gpu", "tpu", "cpu"],
                        help="the platform planned for: what `model.attention: auto` resolves to; cpu also counts "
                             "what XLA:CPU keeps unfused (default gpu)")
    parser.add_argument("--reference", action="store_true",
                        help="add a frozen reference model (automatic for trainer.algorithm=dpo)")
    parser.add_argument("--critic", action="store_true", help="add a trained critic of the same size (PPO)")


# ---- config --------------------------------------------------------------------------------


def load(path: str, overrides: list[str]):
    """The run config of `path` with dotted `overrides`, as `rljax train` reads it: a
    `RunConfig` or an `RLConfig` by the run kind, every value checked."""
    from rljax.commands.run_kinds import config_class
    from rljax.config import load_config

    return load_config(config_class(path, overrides), path, overrides)


load_raw = load  # the name tests/parallel/test_plan.py imports


def model_config_of(section):
    """The ModelConfig of the `model:` section: `model.path`'s config.json (or its GGUF
    file's metadata) when it exists here, else `model.hf_config` (vocab size from the
    tokenizer only when not given)."""
    import os

    from rljax.models import read_config
    from rljax.models.gguf import is_gguf
    from rljax.train.setup import load_tokenizer, model_config_from_section

    if section.path and (os.path.exists(os.path.join(section.path, "config.json"))
                         or (is_gguf(section.path) and os.path.isfile(section.path))):
        return read_config(section.path)
    if not section.hf_config:
        raise SystemExit(f"model.path={section.path!r} has no config.json (nor is a GGUF file) here and model.hf_config is empty: "
                         "nothing to plan from")
    tokenizer = None if "vocab_size" in section.hf_config else load_tokenizer(section)
    return model_config_from_section(section, tokenizer)


# ---- the estimate --------------------------------------------------------------------------


@dataclass
class Plan:
    """Bytes per device; `rows` keeps the print order."""

    title: list[str]
    rows: list[tuple[str, int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    total: int = 0
    kv: list[tuple[str, int]] = field(default_factory=list)
    rollout: "RolloutPlan | None" = None  # the replicas, when rollout.tensor_parallel_size >= 1
    dcn: list[tuple[str, int]] = field(default_factory=list)  # bytes per chip over the data-center network

    def add(self, name: str, nbytes: int, count: bool = True) -> None:
        self.rows.append((name, int(nbytes)))
        if count:
            self.total += int(nbytes)


def moe_mlp_terms(cfg, fsdp: int, tensor: int, compute_bytes: int = 2) -> tuple[float, float]:
    """Values per token of this device's rows, in units of the compute dtype (c bytes), that
    one MoE layer keeps (`rljax.models.moe.expert_parallel_dispatch`): the fsdp group's
    tokens are gathered (G = fsdp tokens per own token) and each of their k slots gets a
    buffer row, dropless, so sized for every slot although only the local experts' are
    non-zero:
        none:      fsdp (2e + k (8e / c + 3e + 3F / t))
                     2e:     gathered tokens, partial sums
                     8e / c: the router-weighted sum `btke,btk->bte` runs in float32: the
                             expert outputs cast to float32 [S, E] and, in the backward,
                             their float32 gradient (d out x w) [S, E], 4 bytes each
                     3e:     [S, E] buffers of the compute dtype (sorted rows, expert
                             outputs: two seen at the peak; the third is calibration to
                             the compiled total, whose last ~5.5 GiB at fsdp 64 no buffer
                             dump explained)
                     3F / t: gate, up, act
        save_dots: fsdp k (e + 2F / t)             the grouped matmuls' outputs
    The 8e / c + 3e per slot were read off the compiled TPU train step of Qwen3-30B-A3B
    (v5p, fsdp 64 and 16, 2 layers, 1 row per chip, full remat: the backward of the
    rematted layer holds both float32 [S, E] arrays at its peak); fitted at fsdp 64
    (-1.5%), checked at fsdp 16 (-6.7%); without them the estimate falls 15 GiB per chip
    short at fsdp 64. Other remat modes and tensor > 1 are not measured."""
    e, k, f, c = cfg.hidden_size, cfg.num_experts_per_tok, cfg.moe_intermediate_size, compute_bytes
    return fsdp * (2 * e + k * (8 * e / c + 3 * e + 3 * f / tensor)), fsdp * k * (e + 2 * f / tensor)


def moe_dispatch_bytes(cfg, rows: int, seq: int, fsdp: int, tensor: int, compute_bytes: int) -> int:
    """One MoE layer's dispatch buffers on one device, one gather, as its backward holds them:
    b' T c fsdp (2e + k (8e / c + 3e + 3F / t)) (`moe_mlp_terms`, none), b' the rows per
    gather (b, or the largest divisor of b with b' fsdp T <= `MAX_GATHERED_TOKENS`: the
    dispatch runs in chunks of rows)."""
    from rljax.models.moe import MAX_GATHERED_TOKENS

    chunk = max([d for d in range(1, rows + 1) if rows % d == 0 and d * fsdp * seq <= MAX_GATHERED_TOKENS] or [1])
    return int(chunk * seq * compute_bytes * moe_mlp_terms(cfg, fsdp, tensor, compute_bytes)[0])


def activation_bytes(cfg, rows: int, seq: int, tensor: int, compute_bytes: int, remat: str,
                     attention: str = "xla", fsdp: int = 1, fused: bool = True) -> int:
    """Activations kept for the backward pass of one micro-batch on one device.

    b = rows per device, T = tokens per row, L layers, e hidden, h heads, k kv heads,
    D head dim, m intermediate, t = tensor ways (splits h, k, m), c = compute bytes.
    Per token per layer, saved for backward without remat:
        A = c * (4e + (2h + 2k) D / t + 3m / t)         layer input, 2 norms, residual,
                                                       q k v (roped), attention output,
                                                       gate, up, silu(gate)*up
    Unfused (`fused=False`, XLA:CPU, which keeps an elementwise op's inputs for its
    backward rather than fusing it into a neighbour's), also
        A += c * (h + k) D / t                        q k before RoPE
    Every attention kernel recomputes its scores in the backward (the xla one too:
    `rljax.models.attention.xla_attention`), so only the layer whose backward runs holds
        S = (4 + c) * h T / t                           xla attention's [T, T] probs per
                                                       head (f32 + compute copy); 0 for
                                                       a flash kernel; unfused + 4 h T / t,
                                                       the scores before the softmax
    (SmolLM2-135M, fp32, 8 packed rows x 224 tokens: XLA:CPU's compiled train step holds
    38.4 KB per token per layer; unfused A is 36.9 KB).
      none:      L b T A                                + one layer's b T S
      save_dots: L b T c (3e + (h + 2k) D / t + 2m / t)  + one layer's b T (A + S)
      full:      L b T c e                              + one layer's b T (A + S)
    A mixture-of-experts layer replaces the MLP terms 3m / t and 2m / t by its dispatch
    buffers per token of this device (`moe_mlp_terms`).
    """
    e, h, k, d, L = (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                     cfg.num_hidden_layers)
    c = compute_bytes
    mlp_none, mlp_dots = moe_mlp_terms(cfg, fsdp, tensor, c) if cfg.is_moe else (
        3 * cfg.intermediate_size / tensor, 2 * cfg.intermediate_size / tensor)
    per_token = c * (4 * e + (2 * h + 2 * k) * d / tensor + mlp_none)
    scores = (4 + c) * h * seq / tensor if attention == "xla" else 0  # the other kernels are flash-style
    if not fused:
        per_token += c * (h + k) * d / tensor
        scores += 4 * h * seq / tensor if attention == "xla" else 0
    if remat == "none":
        return int(L * rows * seq * per_token + rows * seq * scores)
    one_layer = rows * seq * (per_token + scores)
    if remat == "save_dots":
        return int(L * rows * seq * c * (3 * e + (h + 2 * k) * d / tensor + mlp_dots) + one_layer)
    if remat == "full":
        return int(L * rows * seq * c * e + one_layer)
    raise ValueError(f"unknown remat {remat!r}")


def logits_bytes(cfg, rows: int, seq: int, tensor: int, backend: str = "gpu") -> int:
    """Chunked log-probs: 2 x b x c x V / t float32, a chunk's logits and their gradient
    (chunks are recomputed, never all stored), c the chunk the model computes on `backend`
    (`rljax.algos.log_probs.positions_per_chunk`: at most 256 positions, within 1 GiB;
    256 MiB on CPU) or all T."""
    from rljax.algos.log_probs import logits_chunk_bytes, positions_per_chunk

    vocab = math.ceil(cfg.vocab_size / tensor)
    chunk = positions_per_chunk(seq, rows, vocab, logits_chunk_bytes(backend)) or seq
    return int(2 * rows * chunk * vocab * 4)


def kv_cache_bytes(cfg, seqs: int, length: int, mesh, dtype_bytes: int, head_dim: int | None = None) -> int:
    """2 (k and v) x L x ceil(seqs / (data x fsdp)) x len x ceil(k / t) x D x bytes; D: the
    pool's head_dim (`head_dim`, default the model's)."""
    from rljax.parallel import data_parallel_size

    per_device_seqs = math.ceil(seqs / data_parallel_size(mesh))
    kv_heads = math.ceil(cfg.num_key_value_heads / mesh.shape["tensor"])
    return 2 * cfg.num_hidden_layers * per_device_seqs * length * kv_heads * (head_dim or cfg.head_dim) * dtype_bytes


def pool_head_dim(cfg, attention: str, backend: str) -> int:
    """The KV pool's head_dim when `attention` (`rollout.attention`) runs on `backend`:
    the TPU kernel's pool pads it to the 128 lanes (`rljax.rollout.attention.cache_head_dim`)."""
    from rljax.rollout.attention import cache_head_dim, resolve_paged_attention

    return cache_head_dim(resolve_paged_attention(attention, backend), cfg.head_dim)


@dataclass(frozen=True)
class RolloutPlan:
    """The replicas of `rollout.tensor_parallel_size >= 1` (`rljax.rollout.replicas`).

    weight_dtype: the dtype the replicas hold the weights in (`rollout.weight_dtype`).
    weights_bytes: one replica device's share of the weights (split over tp only), in it.
    uncast_weights_bytes: the same in the trainer's parameter dtype (what an uncast
        hand-off moves and a replica holds).
    kv_bytes: one replica device's share of its pool (`kv_bytes_per_device`).
    sequences: full-length sequences (prompt + response, whole pages each) the pool's
        usable pages hold (page 0 is the null page).
    handoff_bytes: the hand-off's transient per device: the new copy of the weights
        exists until the sampler drops the old one (with a cast, on devices shared with
        training, also the cast copy in the training layout, until the reshard has read it).
    """

    dp: int
    tp: int
    weight_dtype: str
    uncast_weights_bytes: int
    pages: int
    page_size: int
    seq_len: int
    sequences: int
    weights_bytes: int
    kv_bytes: int
    handoff_bytes: int


def rollout_plan(cfg, params, devices: int, rollout, seq_len: int, kv_seqs: int | None, kv_len: int | None,
                 dtype, weight_dtype: str, head_dim: int | None = None) -> RolloutPlan:
    """Per-device memory of the rollout replicas, holding the weights in `weight_dtype`.
    Pages: `rollout.num_pages` (each replica's pool), else room for `kv_seqs` (default
    `rollout.max_num_seqs`) sequences of `kv_len` (default prompt + response) tokens per
    replica, plus the null page. `head_dim`: the pool's (default the model's)."""
    from rljax.parallel import MeshConfig, ShardingError, abstract_mesh, planned_bytes, state_shardings
    from rljax.rollout.handoff import cast_shapes
    from rljax.rollout.kv_cache import CacheShape
    from rljax.rollout.replicas import kv_bytes_per_device

    tp, page_size = rollout.tensor_parallel_size, rollout.page_size
    dp = rollout.data_parallel_size or devices // tp
    if devices % tp or dp * tp > devices:
        raise ShardingError(f"rollout.data_parallel_size={dp} x rollout.tensor_parallel_size={tp} does not fit "
                            f"the {devices} devices")
    replica = abstract_mesh(MeshConfig(data=1, fsdp=1, tensor=tp), tp)
    replica_shardings = state_shardings(params, replica)
    uncast = planned_bytes(params, replica_shardings)
    weights = planned_bytes(cast_shapes(params, weight_dtype), replica_shardings)
    pages = rollout.num_pages or (kv_seqs or rollout.max_num_seqs) * -(-(kv_len or seq_len) // page_size) + 1
    shape = CacheShape(cfg.num_hidden_layers, pages, page_size, cfg.num_key_value_heads, head_dim or cfg.head_dim,
                       dtype)
    return RolloutPlan(dp=dp, tp=tp, weight_dtype=str(weight_dtype), uncast_weights_bytes=uncast, pages=pages, page_size=page_size, seq_len=seq_len,
                       sequences=(pages - 1) // -(-seq_len // page_size), weights_bytes=weights,
                       kv_bytes=kv_bytes_per_device(shape, tp), handoff_bytes=weights)


def dcn_traffic(mesh_config, params_bytes: int, grads_bytes: int, micro_batches: int,
                forward_micro_batches: int, handoff_bytes: int) -> list[tuple[str, int]]:
    """Bytes each chip sends over the data-center network in one step (an RL step, or a
    supervised optimizer step), from the per-chip shards: `params_bytes` (parameters in
    the compute dtype), `grads_bytes` (gradients). The collectives are hierarchical: the
    slow hop is a ring over the `n` slices among the chips at the same place in each.

    fsdp over `n = dcn_fsdp` slices: each all-gather of the weights brings (n - 1) shards
    over DCN, each reduce-scatter of the gradients sends (n - 1) shards: per train
    micro-batch 2 all-gathers (forward, backward) and 1 reduce-scatter; per forward
    micro-batch (old / reference log-probs) 1 all-gather; the hand-off brings each
    replica the (n - 1) / n of the weights other slices hold (`handoff_bytes`: a replica
    chip's weights). data over `n = dcn_data` slices: a ring all-reduce of the gradients,
    2 (n - 1) / n of them, per train micro-batch (the accumulator is reduced inside the
    micro-batch loop); the parameters are replicated over data, so nothing else crosses."""
    rows = []
    n = mesh_config.dcn_fsdp
    if n > 1:
        rows.append((f"fsdp over {n} slices: train all-gathers + reduce-scatter ({micro_batches} micro-batches)",
                     micro_batches * (n - 1) * (2 * params_bytes + grads_bytes)))
        if forward_micro_batches:
            rows.append((f"fsdp over {n} slices: log-prob forwards' all-gathers ({forward_micro_batches} "
                         "micro-batches)", forward_micro_batches * (n - 1) * params_bytes))
        if handoff_bytes:
            rows.append((f"fsdp over {n} slices: weight hand-off into the replicas", handoff_bytes * (n - 1) // n))
    n = mesh_config.dcn_data
    if n > 1:
        rows.append((f"data over {n} slices: gradient all-reduce ({micro_batches} micro-batches)",
                     micro_batches * 2 * (n - 1) * grads_bytes // n))
    return rows


def make_plan(run, *, devices: int | None = None, device_memory_gb: float | None = None,
              micro_batch: int | None = None, seq_len: int | None = None, kv_seqs: int | None = None,
              kv_len: int | None = None, kv_dtype: str | None = None, reference: bool = False,
              critic: bool = False, backend: str = "gpu") -> Plan:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from rljax.algos.registry import get_adv_estimator
    from rljax.models import DTypePolicy, init_model
    from rljax.models.attention import resolve_attention
    from rljax.models.lora import add_adapters, split_trainable
    from rljax.parallel import (abstract_mesh, check_batch, data_parallel_size, mesh_desc, optimizer_shardings,
                                planned_bytes, state_shardings)
    from rljax.rl.actor_critic import packs_sequences
    from rljax.rl.async_config import device_counts
    from rljax.rl.packing import row_factor
    from rljax.rl.config import RLConfig
    from rljax.rollout.config import SamplerConfig
    from rljax.train.optim import make_optimizer

    rl = run if isinstance(run, RLConfig) else None  # `run`: a RunConfig or an RLConfig (`load`)
    section, trainer = run.model, run.trainer
    n = devices or jax.device_count()
    # an asynchronous trainer.mode splits the devices: the mesh trains on its share, the replicas sample on theirs
    n_train, n_rollout = device_counts(rl, n, 1) if rl else (n, n)
    split = n_train != n
    mesh = abstract_mesh(run.mesh, n_train)
    cfg = model_config_of(section)
    policy = DTypePolicy(section.param_dtype, section.compute_dtype)

    # params, optimizer state, gradients: abstract shapes + the rules table. With LoRA the
    # optimizer state and gradients are the adapters' only (`rljax.models.lora.split_trainable`)
    def build():
        decoder = init_model(cfg, policy=policy, remat=section.remat, attention=section.attention)
        if section.lora.enabled:
            add_adapters(decoder, section.lora)
        return decoder

    model = nnx.eval_shape(build)
    params = nnx.state(model, nnx.Param)
    trainable, _ = split_trainable(model, params)
    param_shardings = state_shardings(params, mesh)
    p_bytes = planned_bytes(params, param_shardings)
    trainable_shardings = state_shardings(trainable, mesh)
    t_bytes = planned_bytes(trainable, trainable_shardings)
    optimizer, _ = make_optimizer(rl.actor.optim if rl else run.optim, trainer.total_steps)
    opt_shapes = jax.eval_shape(optimizer.init, trainable)
    o_bytes = planned_bytes(opt_shapes, optimizer_shardings(optimizer, trainable_shardings, mesh))
    lora = section.lora.enabled

    dp = data_parallel_size(mesh)
    # an RL step's optimizer step sees a mini-batch of ppo_mini_batch_size prompts x rollout.n rows
    batch = rl.actor.ppo_mini_batch_size * rl.rollout.n if rl else run.data.batch_size
    per_device_micro = rl.actor.ppo_micro_batch_size_per_device if rl else 0
    micro = micro_batch or per_device_micro * dp or trainer.micro_batch_size or batch
    seq = seq_len or (rl.row_length if rl else run.data.max_length)
    check_batch(micro, mesh, name="micro-batch")
    num_micro = max(batch // micro, 1)
    rows = micro // dp
    # packed mini-batches (`rljax.rl.packing`): a device's rows f times fewer and f times as long
    factor = row_factor(micro, dp) if rl and num_micro > 1 and packs_sequences(
        rl.actor, rl.algorithm.rollout_correction) else 1
    rows, packed_seq = rows // factor, seq * factor
    tensor = mesh.shape["tensor"]
    c = jnp.dtype(policy.compute).itemsize
    total_params = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
    trained_params = sum(math.prod(x.shape) for x in jax.tree.leaves(trainable))
    per_device_params = p_bytes // jnp.dtype(policy.param).itemsize

    if rl:
        reference = reference or rl.actor.kl_loss or rl.algorithm.use_kl_in_reward
        critic = critic or get_adv_estimator(rl.algorithm.adv_estimator).needs_critic
    else:
        reference = reference or (trainer.algorithm == "dpo" and not run.dpo.reference_free)
    plan = Plan(title=[
        f"rljax plan: {cfg.model_type}, {_count(total_params)} params; {mesh_desc(mesh)} on {n_train} devices"
        f"{' (abstract)' if devices else ''}"
        + (f"; trainer.mode={rl.trainer.mode}: {n_train} of the {n} devices train, the other {n_rollout} sample"
           if split else ""),
        f"param {policy.param_dtype}, compute {policy.compute_dtype}; micro-batch {micro} rows "
        f"({rows * factor} per device) x {seq} tokens, {num_micro} micro-batch(es) per step"
        + (f" (packed: {rows} x {packed_seq} per device)" if factor > 1 else "") + f"; remat={section.remat}, "
        f"attention={section.attention}"
        + (f"; LoRA rank {section.lora.rank} on {','.join(section.lora.target_modules)}: {_count(trained_params)} "
           f"trained params ({trained_params / total_params:.2%})" if lora else "")
        + (f" (-> {resolve_attention(section.attention, backend, policy.compute_dtype, cfg.head_dim)} on "
           f"{backend})" if section.attention == "auto" else ""),
    ])
    plan.add(f"params ({policy.param_dtype})" + (" (frozen base + adapters)" if lora else ""), p_bytes)
    plan.add("optimizer state (AdamW mu + nu)" + (" (adapters only)" if lora else ""), o_bytes)
    plan.add("gradients" + (" (accumulator + one micro-batch's)" if num_micro > 1 else "")
             + (" (adapters only)" if lora else ""), t_bytes * (2 if num_micro > 1 else 1))
    if policy.compute_dtype != policy.param_dtype:
        plan.add(f"params cast to {policy.compute_dtype} (live through the step)", per_device_params * c)
    layer_params = (total_params - cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
                    - cfg.hidden_size) // cfg.num_hidden_layers
    if cfg.is_moe:  # experts stay split over fsdp: only the rest of a layer is gathered
        expert_params = 3 * cfg.num_experts * cfg.hidden_size * cfg.moe_intermediate_size
        layer_params -= expert_params
        experts = {k: v for k, v in params["layers"].items() if k.startswith("expert_")}
        plan.add(f"expert weights, part of params ({cfg.num_experts} experts over fsdp={mesh.shape['fsdp']}, "
                 f"{-(-cfg.num_experts // mesh.shape['fsdp'])} per device)",
                 planned_bytes(experts, state_shardings(experts, mesh)), count=False)
        plan.add("MoE dispatch buffers, one layer (in the activations)",
                 moe_dispatch_bytes(cfg, rows, packed_seq, mesh.shape["fsdp"], tensor, c), count=False)
    if mesh.shape["fsdp"] > 1:
        plan.add("one layer's weights all-gathered over fsdp (x2, prefetch)" + (" (not the experts)" if cfg.is_moe
                                                                                 else ""),
                 2 * layer_params // tensor * c)
    reference_bytes = 0 if lora else p_bytes  # LoRA: the reference is the base with adapters off
    if reference:
        plan.add(f"reference model ({policy.param_dtype}, frozen)" + (": the base, adapters off (no copy)" if lora
                                                                    else ""), reference_bytes)
    if critic and lora:  # the critic reads the actor's base arrays (`rljax.models.lora.sharing_base`)
        from rljax.models.heads import ScalarHeadModel

        critic_model = nnx.eval_shape(lambda: ScalarHeadModel(build(), rngs=nnx.Rngs(0)))
        critic_trained, _ = split_trainable(critic_model, nnx.state(critic_model, nnx.Param))
        critic_shardings = state_shardings(critic_trained, mesh)
        ct_bytes = planned_bytes(critic_trained, critic_shardings)
        co_bytes = planned_bytes(jax.eval_shape(optimizer.init, critic_trained),
                                 optimizer_shardings(optimizer, critic_shardings, mesh))
        plan.add("critic: adapters + head, optimizer, gradients (the actor's base: no copy)",
                 ct_bytes + co_bytes + ct_bytes)
    elif critic:
        plan.add("critic: params + optimizer + gradients", p_bytes + o_bytes + t_bytes)
    kernel = resolve_attention(section.attention, backend, policy.compute_dtype, cfg.head_dim)
    for remat in ("none", "save_dots", "full"):
        act = activation_bytes(cfg, rows, packed_seq, tensor, c, remat, kernel, mesh.shape["fsdp"],
                               fused=backend != "cpu")
        plan.add(f"activations, remat={remat}" + (" (configured)" if remat == section.remat else ""),
                 act, count=remat == section.remat)
    plan.add("logits, chunked log-probs", logits_bytes(cfg, rows, packed_seq, tensor, backend))

    # the sampler's KV cache: on the training mesh (tp = 0), or the replicas' below; a supervised
    # config has no sampler: the engine's defaults
    sampler = rl.sampler_config() if rl else SamplerConfig()
    seqs = kv_seqs or sampler.max_num_seqs
    length = kv_len or sampler.max_model_len
    kv_bytes = jnp.dtype(kv_dtype or policy.compute).itemsize
    head_dim = pool_head_dim(cfg, sampler.attention, backend)
    plan.kv.append((f"kv cache: {seqs} seqs x {length} tokens ({kv_dtype or policy.compute_dtype})",
                    kv_cache_bytes(cfg, seqs, length, mesh, kv_bytes, head_dim)))
    per_token = kv_cache_bytes(cfg, data_parallel_size(mesh), 1, mesh, kv_bytes, head_dim)
    plan.kv.append(("kv cache per cached token (one sequence)", per_token))
    if rl and rl.rollout.tensor_parallel_size:  # replicas: their pools replace the training-mesh sampler's
        plan.rollout = rollout_plan(cfg, params, n_rollout, rl.rollout, rl.row_length, kv_seqs, kv_len,
                                    jnp.dtype(kv_dtype or policy.compute), rl.rollout_weight_dtype, head_dim)
        if not split and plan.rollout.weights_bytes != plan.rollout.uncast_weights_bytes:
            from rljax.rollout.handoff import cast_shapes

            # the cast copy in the training layout lives until the reshard has read it
            cast_bytes = planned_bytes(cast_shapes(params, rl.rollout_weight_dtype), param_shardings)
            plan.rollout = dataclasses.replace(plan.rollout, handoff_bytes=plan.rollout.handoff_bytes + cast_bytes)
        plan.kv = []
    if run.mesh.num_slices > 1:
        steps = rl.actor.ppo_epochs * max(rl.data.batch_size // rl.actor.ppo_mini_batch_size, 1) if rl else 1
        forward_passes = 0
        if rl:  # the old log-probs (unless the rollout's or the update's are used) and the reference's
            from rljax.rl.batch import old_log_probs_from_update

            old_forward = not (rl.algorithm.rollout_correction.bypass_mode or old_log_probs_from_update(rl))
            forward_passes = int(old_forward) + int(reference)
        forward_micro = forward_passes * max(rl.data.batch_size * rl.rollout.n // micro, 1) if rl else 0
        plan.dcn = dcn_traffic(run.mesh, per_device_params * c, t_bytes, steps * num_micro, forward_micro,
                               plan.rollout.weights_bytes if plan.rollout is not None else 0)
    if device_memory_gb:
        limit = int(device_memory_gb * 1e9)
        free = limit - p_bytes - o_bytes - (reference_bytes if reference else 0)  # what stays resident while sampling
        fraction = sampler.kv_cache.memory_fraction
        note = (f"device memory {device_memory_gb:g} GB: training needs {plan.total / GiB:.2f} GiB -> "
                + ("fits" if plan.total <= limit else "DOES NOT FIT"))
        if plan.rollout is None:
            note += (f"; a sampler beside params + optimizer state gets {fraction:g} x {max(free, 0) / GiB:.2f} GiB "
                     f"free = {int(max(free, 0) * fraction) // max(per_token, 1):,} cached tokens per device")
        plan.notes.append(note)
        if plan.rollout is not None and split:  # the replicas have devices of their own
            r = plan.rollout
            sampling = r.weights_bytes + r.kv_bytes
            plan.notes.append(
                f"a rollout device: rollout weights + KV pool = {sampling / GiB:.2f} GiB, "
                f"{(sampling + r.handoff_bytes) / GiB:.2f} GiB while new weights arrive -> "
                + ("fits" if sampling + r.handoff_bytes <= limit else "DOES NOT FIT"))
        elif plan.rollout is not None:  # the replicas share the training devices: what is resident while sampling
            r = plan.rollout
            sampling = p_bytes + o_bytes + (reference_bytes if reference else 0) + r.weights_bytes + r.kv_bytes
            plan.notes.append(
                f"while the replicas sample: params + optimizer state{' + reference' if reference else ''} + "
                f"rollout weights + KV pool = {sampling / GiB:.2f} GiB per device, "
                f"{(sampling + r.handoff_bytes) / GiB:.2f} GiB during the hand-off -> "
                + ("fits" if sampling + r.handoff_bytes <= limit else "DOES NOT FIT"))
    return plan


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def render(plan: Plan) -> str:
    rollout_rows = []
    if plan.rollout is not None:
        r = plan.rollout
        rollout_rows = [(f"rollout weights per device (split over tp, {r.weight_dtype})", r.weights_bytes)]
        if r.uncast_weights_bytes != r.weights_bytes:
            rollout_rows.append(("  uncast (rollout.weight_dtype = the parameters' dtype)", r.uncast_weights_bytes))
        rollout_rows += [("rollout kv cache per device (one replica's pool / tp)", r.kv_bytes),
                         ("weight hand-off transient per device (new copy)", r.handoff_bytes)]
    width = max(len(name) for name, _ in plan.rows + plan.kv + rollout_rows + plan.dcn) + 2
    lines = [*plan.title, "", f"{'per device':<{width}}{'GiB':>10}{'bytes':>18}"]
    for name, nbytes in plan.rows:
        lines.append(f"{name:<{width}}{nbytes / GiB:>10.3f}{nbytes:>18,}")
    lines.append(f"{'total for training (configured remat)':<{width}}{plan.total / GiB:>10.3f}{plan.total:>18,}")
    if plan.kv:
        lines.append("")
    for name, nbytes in plan.kv:
        lines.append(f"{name:<{width}}{nbytes / GiB:>10.3f}{nbytes:>18,}")
    if plan.rollout is not None:
        r = plan.rollout
        lines += ["", f"rollout: {r.dp} replicas (data_parallel_size) x {r.tp} devices (tensor_parallel_size); "
                      f"{r.pages} pages of {r.page_size} tokens per replica = {r.sequences} sequences of "
                      f"{r.seq_len} tokens (prompt + response)"]
        for name, nbytes in rollout_rows:
            lines.append(f"{name:<{width}}{nbytes / GiB:>10.3f}{nbytes:>18,}")
    if plan.dcn:
        total = sum(nbytes for _, nbytes in plan.dcn)
        lines += ["", "over the data-center network (DCN), per chip per step (dcn_traffic's ring estimates)"]
        for name, nbytes in plan.dcn + [("total DCN bytes per chip per step", total)]:
            lines.append(f"{name:<{width}}{nbytes / GiB:>10.3f}{nbytes:>18,}")
    lines += ["", *plan.notes]
    lines += [
        "",
        "formulas (b rows/device, T tokens, L layers, e hidden, h/k heads/kv heads, D head dim, m mlp, V vocab,",
        " t tensor ways, c compute bytes): per token per layer A = c(4e + (2h+2k)D/t + 3m/t),",
        " S = (4+c)hT/t (xla attention probs, one layer's: every kernel recomputes them);",
        " none = LbTA + bTS; save_dots = LbTc(3e+(h+2k)D/t+2m/t) + bT(A+S);",
        " full = LbTce + bT(A+S); logits = 2 b c V/t 4 (c: a chunk, <= 256 positions, <= 1 GiB; 256 MiB on cpu); kv = 2 L ceil(seqs/(data*fsdp)) len ceil(k/t) D c.",
        " params/optimizer/gradients: exact shard shapes from the logical-axis rules.",
    ]
    if plan.rollout is not None:
        lines += [
            " rollout (tp >= 1): weights on a 1 x 1 x tp mesh by the same rules; kv = pages x 2 L page k D c / t",
            " (t = tp when it divides k, else 1); sequences = (pages - 1) / ceil((prompt + response) / page);",
            " pages = rollout.num_pages, else --kv-seqs (default rollout.max_num_seqs) x ceil(len / page) + 1",
            " per replica.",
        ]
    return "\n".join(lines)


def _micro_key(run) -> tuple[str, int, int]:
    """(the config key that sets the micro-batch, the rows one unit of it is, the mini-batch
    rows it must divide): an RL actor's per-device micro-batch, or a supervised run's."""
    from rljax.parallel import abstract_mesh, data_parallel_size
    from rljax.rl.config import RLConfig

    if isinstance(run, RLConfig):
        import jax

        dp = data_parallel_size(abstract_mesh(run.mesh, jax.device_count()))
        return "actor.ppo_micro_batch_size_per_device", dp, run.actor.ppo_mini_batch_size * run.rollout.n
    return "trainer.micro_batch_size", 1, run.data.batch_size


def check_fits(run, budget: int, sharing: int, *, kv: bool, backend: str) -> Plan:
    """The plan of `run` (`make_plan`), or a `ConfigError` before anything is built when
    it does not fit: `sharing` devices' totals (the training state, activations, logits;
    with `kv`, the sampler's pool) against `budget` bytes (on CPU the host's free memory,
    which all its devices share; on an accelerator one device's). The message names the
    largest micro-batch that fits, or `model.remat: full` when none does as configured."""
    from rljax.config import ConfigError

    def need(plan: Plan) -> int:
        return sharing * (plan.total + (plan.kv[0][1] if kv and plan.kv else 0))

    plan = make_plan(run, backend=backend)
    if need(plan) <= budget:
        return plan
    key, unit, mini = _micro_key(run)
    fits = None
    for per in (p for p in range(mini // unit, 0, -1) if mini % (p * unit) == 0):
        smaller = need(make_plan(run, micro_batch=per * unit, backend=backend))
        if smaller <= budget:
            fits = f"{key}={per} fits ({smaller / GiB:.2f} GiB)"
            break
    if fits is None:
        remat = dataclasses.replace(run, model=dataclasses.replace(run.model, remat="full"))
        least = need(make_plan(remat, micro_batch=unit, backend=backend))
        fits = (f"model.remat=full at {key}=1 fits ({least / GiB:.2f} GiB)" if least <= budget else
                f"no micro-batch fits, not even with model.remat=full at {key}=1 ({least / GiB:.2f} GiB): "
                "more devices or a smaller model")
    raise ConfigError(
        f"memory: the plan needs {need(plan) / GiB:.2f} GiB ({sharing} device(s) x {need(plan) / sharing / GiB:.2f} "
        f"GiB: `rljax plan`) and {budget / GiB:.2f} GiB is free: " + fits)


def main(args) -> int:
    from rljax.config import ConfigError
    from rljax.parallel import ShardingError

    try:
        plan = make_plan(load(args.config, args.overrides), devices=args.devices,
                         device_memory_gb=args.device_memory_gb, micro_batch=args.micro_batch, seq_len=args.seq_len,
                         kv_seqs=args.kv_seqs, kv_len=args.kv_len, kv_dtype=args.kv_dtype, reference=args.reference,
                         critic=args.critic, backend=args.backend)
    except (ConfigError, ShardingError) as e:
        raise SystemExit(f"plan: {e}") from None
    print(render(plan))
    return 0
