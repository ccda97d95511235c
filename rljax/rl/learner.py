"""A trained module of the RL loop (the actor, the critic): its TrainState on the mesh and
the mini-batch updates of one RL step.

The update itself is the shared jitted train step (`rljax.train.steps.make_train_step`);
here the step batch's view its objective reads (`inputs`, e.g.
`rljax.rl.actor_critic.ActorBatch`) is cut into `ppo_mini_batch_size x rollout.n` row
mini-batches, one optimizer step each, `ppo_epochs` times. A learner that packs
(`rljax.rl.packing`) packs each mini-batch's sequences into its first micro-batches, and
the train step skips the empty ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.hostsync import fetch, shard_global_batch
from rljax.models.lora import join
from rljax.parallel import data_parallel_size
from rljax.rl.batch import StepBatch, present, select_rows, take
from rljax.rl.config import RLConfig
from rljax.rl.packing import Packing, pack_rows, row_factor, unpack
from rljax.train.optim import OptimConfig, make_optimizer
from rljax.train.setup import init_sharded_train_state, place_trainable, train_state_shardings
from rljax.train.steps import ROWS, TrainState, make_train_step


@dataclass
class Learner:
    """A trained module: its graph, its TrainState and its jitted update step."""

    graphdef: nnx.GraphDef
    state: TrainState
    step: Callable
    mini_batch_rows: int
    epochs: int
    shuffle: bool
    inputs: type  # the view of the step batch the objective reads (`rljax.rl.batch.take`)
    base: nnx.State  # the module's frozen weights (LoRA: the base model; else empty), never donated
    name: str  # "actor" | "critic": the prefix of the train step's metrics (verl's actor/grad_norm, critic/lr)
    micro_rows: int  # rows of a micro-batch, over all devices
    devices: int  # data-parallel devices a micro-batch is split over
    # pack each mini-batch's sequences into rows this many rows long (`rljax.rl.packing`), and the
    # step skips empty micro-batches; 0: no packing
    pack_factor: int
    share_prompts: bool  # packed rows hold a prompt once for all its samples

    @property
    def params(self) -> nnx.State:
        """The whole module's state: trained params and frozen base (the same arrays)."""
        return join(self.state.params, self.base)

    def update(self, batch: StepBatch, mesh, rng: np.random.Generator, frozen=None
               ) -> tuple[dict[str, float], dict[str, np.ndarray]]:
        """`epochs` passes over the batch in mini-batches, one optimizer step each. -> (the
        metrics, averaged over the updates; the train step's `train/*` metrics are named
        after the module (`actor/grad_norm`, `critic/lr`, as verl names them); the
        objective's per-row outputs (`rljax.train.steps.ROWS`), by name, for the whole
        batch in its row order, from the first pass)."""
        view = take(self.inputs, batch)
        rows = batch.rows
        outputs, orders, packings = [], [], []
        for _ in range(self.epochs):
            order = rng.permutation(rows) if self.shuffle else np.arange(rows)  # [rows]
            for start in range(0, rows, self.mini_batch_rows):
                orders.append(order[start : start + self.mini_batch_rows])
                mini = select_rows(view, orders[-1])
                packing = None
                if self.pack_factor:
                    mini, packing = pack_rows(mini, self.micro_rows, self.devices, self.pack_factor,
                                              self.share_prompts)
                packings.append(packing)
                mini = dataclasses.replace(mini, **shard_global_batch(present(mini), mesh))
                self.state, metrics = self.step(self.state, mini, frozen, self.base)
                outputs.append(metrics)
        host = jax.tree.map(fetch, outputs)  # per-row outputs span every process's rows
        per_row: dict[str, np.ndarray] = {}
        for name in (k for k in host[0] if k.startswith(ROWS)):
            first = host[: -(-rows // self.mini_batch_rows)]  # the first pass covers every row once
            minis = [m[name] if p is None else unpack(m[name], p) for m, p in zip(first, packings)]
            full = np.zeros((rows, *minis[0].shape[1:]), minis[0].dtype)
            for values, order in zip(minis, orders):
                full[order] = values
            per_row[name.removeprefix(ROWS)] = full
        named = lambda k: f"{self.name}/{k.removeprefix('train/')}" if k.startswith("train/") else k  # noqa: E731
        summary = {named(k): float(np.mean([m[k] for m in host])) for k in host[0] if not k.startswith(ROWS)}
        summary[f"{self.name}/micro_batches"] = float(np.mean([self._micro_batches_run(p) for p in packings]))
        return summary, per_row

    def _micro_batches_run(self, packing: Packing | None) -> int:
        """Micro-batches the train step ran on a mini-batch (packed: those holding a token)."""
        return self.mini_batch_rows // self.micro_rows if packing is None else packing.micro_batches

    def updates_per_step(self, rows: int) -> int:
        """Optimizer steps `update` takes on a batch of `rows` rows."""
        return self.epochs * -(-rows // self.mini_batch_rows)


@dataclass(frozen=True)
class LearnerUpdate:
    """The optimizer and the jitted train step of a trained module, built from its
    params' shapes and layout only (concrete or `nnx.eval_shape` params alike), so a run
    and ahead-of-time compilation (`rljax compile`) build the very same program."""

    optimizer: Any
    step: Callable  # step(state, mini_batch, frozen, base) -> (state, metrics), the state donated
    state_sharding: TrainState  # of NamedShardings
    mini_rows: int
    micro_rows: int
    # the step takes mini-batches packed into rows this many rows long and skips micro-batches
    # without a token (`rljax.rl.packing.row_factor`); 0: unpacked mini-batches
    pack_factor: int


def learner_update(graphdef: nnx.GraphDef, params, optim: OptimConfig, objective, totals_fn, cfg: RLConfig, mesh,
                   mini_prompts: int, micro_per_device: int, epochs: int, pack: bool = False) -> LearnerUpdate:
    """The optimizer (scheduled over every update of the run) and the train step on
    `mini_prompts x rollout.n` row mini-batches cut in micro-batches of `micro_per_device`
    rows per data-parallel device (0: one). `pack`: the mini-batches are packed
    (`rljax.rl.packing`), worth it with more than one micro-batch only."""
    optimizer, schedule = make_optimizer(optim, cfg.trainer.total_steps * _updates_per_step(cfg, mini_prompts, epochs))
    mini_rows = mini_prompts * cfg.rollout.n
    micro_rows = micro_per_device * data_parallel_size(mesh) if micro_per_device else mini_rows
    if (cfg.data.batch_size * cfg.rollout.n) % mini_rows or mini_rows % micro_rows:
        raise ValueError(
            f"rows per step {cfg.data.batch_size}x{cfg.rollout.n} must be a multiple of the mini-batch "
            f"{mini_prompts}x{cfg.rollout.n} rows, itself a multiple of the micro-batch {micro_rows} rows"
        )
    sharding = train_state_shardings(params, optimizer, mesh)
    factor = row_factor(micro_rows, data_parallel_size(mesh)) if pack and mini_rows > micro_rows else 0
    step = make_train_step(graphdef, objective, optimizer, schedule, mini_rows // micro_rows,
                           state_sharding=sharding, totals_fn=totals_fn, live=_holds_a_token if factor else None)
    return LearnerUpdate(optimizer, step, sharding, mini_rows, micro_rows, factor)


def _holds_a_token(micro_batch) -> jax.Array:
    return jnp.any(micro_batch.attention_mask > 0)


def make_learner(module: nnx.Module, optim: OptimConfig, objective, totals_fn, cfg: RLConfig, mesh,
                 mini_prompts: int, micro_per_device: int, epochs: int, shuffle: bool, inputs: type,
                 seed: int, name: str, pack: bool = False, share_prompts: bool = False) -> Learner:
    """Place `module` on the mesh, build its optimizer and train step (`learner_update`,
    over the trainable params: with LoRA the adapters and a head) and its sharded
    TrainState; the frozen base stays beside it. `inputs`: the view of the step batch
    `objective` reads (with packing's fields when `pack`; `share_prompts`: a prompt once for
    its samples in packed rows); `name` prefixes its metrics."""
    graphdef, params, base = place_trainable(module, mesh)
    update = learner_update(graphdef, params, optim, objective, totals_fn, cfg, mesh, mini_prompts,
                            micro_per_device, epochs, pack)
    state = init_sharded_train_state(params, update.optimizer, seed, mesh)
    return Learner(graphdef, state, update.step, update.mini_rows, epochs, shuffle, inputs, base, name,
                   update.micro_rows, data_parallel_size(mesh), update.pack_factor,
                   share_prompts and bool(update.pack_factor))


def _updates_per_step(cfg: RLConfig, mini_prompts: int, epochs: int) -> int:
    return max(1, cfg.data.batch_size // mini_prompts) * epochs
