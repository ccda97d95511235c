"""Every program a supervised run (SFT, reward model, DPO) executes, as (jitted function,
abstract arguments) pairs: the train step and the validation forward.

The functions are the run's own: the train step of `rljax.train.steps.make_train_step`
with the algorithm's objective (`rljax.train.objectives`), and the validation forward of
`rljax.train.objectives.make_eval_step`, on the module the algorithm trains (the decoder;
for `rm` a `ScalarHeadModel` over it) and, for `dpo` with a reference, the frozen copy of
the decoder's weights in the same layout. What differs per algorithm is one entry of
`TASKS` (as in `rljax.train.tasks`, shapes only). Only the arguments are new:
`jax.ShapeDtypeStruct`s with the shardings a run gives its arrays (`rljax.tpu.programs`).

Row shapes, as the run makes them: a train step's batch is `data.batch_size` rows padded
to the longest bucket (`data.max_length`), laid out by the format's own collate
(`rljax.data.formats`: an sft row is one sequence, a preference row a chosen and a
rejected sequence, one forward over both), cut in `data.batch_size /
trainer.micro_batch_size` micro-batches inside the step. The validation forward sees one
validation batch (`data.val_batch_size`, default `data.batch_size`, rows of the same
length); it exists only when `data.val_files` is set (the run validates).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax
import numpy as np
from flax import nnx

from rljax.data.batching import BatchLayout
from rljax.data.formats import get_format
from rljax.models import DTypePolicy, ModelConfig, init_model
from rljax.models.attention import choose_attention, compiling_for
from rljax.models.heads import ScalarHeadModel
from rljax.parallel import batch_sharding, make_mesh, state_shardings
from rljax.tpu.programs import Program, RunPrograms, _abstract, _platform, model_config
from rljax.train.loop import num_micro_batches
from rljax.train.objectives import dpo_objective, make_eval_step, rm_objective, sft_objective
from rljax.train.optim import make_optimizer
from rljax.train.run_config import RunConfig
from rljax.train.setup import train_state_shardings
from rljax.train.steps import init_train_state, make_train_step


@dataclass(frozen=True)
class AbstractTask:
    """What one supervised algorithm trains, shapes only (`rljax.train.tasks.Task`'s parts).

    module: builds the trained module from a decoder builder (under `nnx.eval_shape`).
    objective: `(cfg, reference graphdef or None) -> objective`.
    reference: whether the step reads a frozen copy of the decoder's weights (DPO).
    lm_head: whether the module projects onto the vocabulary (the reward model's scalar
        head does not: its model FLOPs leave the unembedding out).
    """

    module: Callable[[RunConfig, Callable[[], nnx.Module]], nnx.Module]
    objective: Callable[[RunConfig, nnx.GraphDef | None], Callable]
    reference: Callable[[RunConfig], bool] = lambda cfg: False
    lm_head: bool = True


# trainer.algorithm -> its task (the keys of `rljax.train.tasks.TASKS`)
TASKS: dict[str, AbstractTask] = {
    "sft": AbstractTask(lambda cfg, decoder: decoder(), lambda cfg, ref: sft_objective()),
    "rm": AbstractTask(lambda cfg, decoder: ScalarHeadModel(decoder(), rngs=nnx.Rngs(cfg.model.init_seed + 1)),
                       lambda cfg, ref: rm_objective(cfg.rm), lm_head=False),
    "dpo": AbstractTask(lambda cfg, decoder: decoder(), lambda cfg, ref: dpo_objective(cfg.dpo, ref),
                        reference=lambda cfg: not cfg.dpo.reference_free),
}


def abstract_batch(cfg: RunConfig, rows: int, mesh) -> dict:
    """The step batch of `rows` rows at the longest bucket, as `data.format`'s collate
    makes it (keys, dtypes), rows split over the mesh's data x fsdp."""
    layout = BatchLayout((cfg.data.max_length,), 0, rows)
    batch = get_format(cfg.data.format).collate([], layout)
    sharding = batch_sharding(mesh)
    return {k: jax.ShapeDtypeStruct(np.shape(v), np.asarray(v).dtype, sharding=sharding) for k, v in batch.items()}


def supervised_programs(cfg: RunConfig, devices: list, *, config: ModelConfig | None = None,
                        single_micro_batch: bool = False) -> RunPrograms:
    """The run's programs on `devices`: the train step, and the validation forward when
    the run validates. `config` replaces the model's (fewer layers, for the roofline);
    `single_micro_batch` compiles the step with one micro-batch (the roofline's)."""
    algorithm = cfg.trainer.algorithm
    task = TASKS[algorithm]
    model = config or model_config(cfg)
    section = cfg.model
    policy = DTypePolicy(section.param_dtype, section.compute_dtype)
    mesh = make_mesh(cfg.mesh, devices)
    platform = _platform(mesh)
    length = cfg.data.max_length
    pair = 2 if cfg.data.format == "preference" else 1  # sequences per row (chosen + rejected)
    reference = task.reference(cfg)
    notes: list[str] = []

    def decoder():
        return init_model(model, seed=section.init_seed, policy=policy, remat=section.remat,
                          attention=section.attention)

    # model FLOPs per sequence token: the trained module's training pass, plus the reference's forward
    head = 0.0 if task.lm_head else 2.0 * model.vocab_size * model.hidden_size  # the unembedding it skips
    train_flops = model.flops_per_token(length) - 3 * head
    eval_flops = model.flops_per_token(length, training=False) - head
    attention = section.attention
    if attention == "auto":
        attention = choose_attention(platform, policy.compute, model.head_dim)
    splash = attention == "splash"
    train_kernel = model.attention_flops_per_token(length, training=True) if splash else 0.0
    eval_kernel = model.attention_flops_per_token(length, training=False) if splash else 0.0
    if reference:
        train_flops += model.flops_per_token(length, training=False)
        eval_flops += model.flops_per_token(length, training=False)
        train_kernel += eval_kernel
        eval_kernel *= 2

    programs: list[Program] = []
    # built outside `jax.set_mesh`, lowered under the abstract mesh (`Program.lower`), as the RL programs
    with compiling_for(platform):
        graphdef, params = nnx.split(nnx.eval_shape(lambda: task.module(cfg, decoder)))
        frozen = frozen_sharding = ref_graph = None
        if reference:  # the initial policy's weights, frozen, laid out like the policy's
            ref_graph, ref_params = nnx.split(nnx.eval_shape(decoder))
            frozen_sharding = state_shardings(ref_params, mesh)
            frozen = _abstract(ref_params, frozen_sharding)
        objective = task.objective(cfg, ref_graph)
        optimizer, schedule = make_optimizer(cfg.optim, cfg.trainer.total_steps)
        state_sharding = train_state_shardings(params, optimizer, mesh)
        state = _abstract(jax.eval_shape(lambda p: init_train_state(p, optimizer, cfg.trainer.seed), params),
                          state_sharding)
        micro = 1 if single_micro_batch else num_micro_batches(cfg, mesh)
        step = make_train_step(graphdef, objective, optimizer, schedule, micro, state_sharding=state_sharding,
                               frozen_sharding=frozen_sharding)
        rows = cfg.data.batch_size
        shape = f"{rows} pairs x {length}" if pair == 2 else f"{rows}x{length}"
        tokens = rows * pair * length
        # base None: no LoRA here (the step merges the trained params alone)
        programs.append(Program(f"{algorithm} train step [{shape}, {micro} micro]", "train", step,
                                (state, abstract_batch(cfg, rows, mesh), frozen, None), tokens, tokens * train_flops,
                                len(devices), mesh, kernel_flops=tokens * train_kernel / len(devices)))
        if cfg.data.val_files:
            rows = cfg.data.val_batch_size or cfg.data.batch_size
            tokens = rows * pair * length
            users = f"{algorithm}{' + reference' if reference else ''}"
            shape = f"{rows} pairs x {length}" if pair == 2 else f"{rows}x{length}"
            programs.append(Program(f"validation forward ({users}) [{shape}]",
                                    "forward", make_eval_step(graphdef, objective),
                                    (state.params, abstract_batch(cfg, rows, mesh), frozen), tokens,
                                    tokens * eval_flops, len(devices), mesh,
                                    kernel_flops=tokens * eval_kernel / len(devices)))
        else:
            notes.append("data.val_files is empty: the run does not validate (no validation forward)")
    return RunPrograms(programs, mesh, None, 0, model, notes)
