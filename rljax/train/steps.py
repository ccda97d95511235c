"""The jitted train step, shared by every objective.

An objective is a pure function `objective(model, micro_batch, frozen, totals, key) ->
(AggTerms, metrics)`: the loss as a numerator and a denominator that are *sums* over the
micro-batch (see `rljax.algos.aggregation`), and a dict of scalar metrics that are means
over it. `totals` is `totals_fn(mini_batch)` evaluated once on the whole mini-batch (or
None): global counts an objective that sums several differently normalised terms needs
(e.g. the RL actor's policy, KL and entropy terms). `key` is a PRNG key for randomness
inside the loss (Clip-Cov's random token selection); objectives without randomness ignore
it. It is derived from the state, never drawn from a global seed:

    key(step, m) = fold_in(fold_in(wrap_key_data(state.rng), state.step), m)

for micro-batch m of the optimizer step `state.step`, so every step and every micro-batch
draws fresh noise, and a resumed run (its `TrainState` restored: rng and step) draws
exactly the noise the uninterrupted run draws. `state.rng` itself never changes. LoRA
dropout's masks derive from the same key (`rljax.models.lora.set_dropout_key`): the
train step's forwards are the only training forwards.

The step splits the global mini-batch into `num_micro_batches`, scans over them
accumulating the gradient of the numerator, the numerator and the denominator, and divides
once at the end:

    loss = sum_m num_m / sum_m den_m,      grad = sum_m grad(num_m) / sum_m den_m

which is exactly the loss and gradient of the whole mini-batch (not a mean of micro-batch
means). Sums over devices are global because the batch is one sharded array. Metrics are
weighted by each micro-batch's denominator. A metric named `ROWS` + name is not a scalar
but one value per row of the micro-batch (e.g. the RL actor's detached token log-probs):
the step returns it for the whole mini-batch, rows in the batch's order.

A step whose loss or gradient is not finite keeps the old parameters and optimizer state
and increments `skipped_steps`. Nothing in the step talks to the host; the state is
donated, so parameters are updated in place.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from rljax.algos.aggregation import AggTerms
from rljax.models.lora import set_dropout_key

# objective(model, micro_batch, frozen, totals, key) -> (AggTerms, metrics)
Objective = Callable[[nnx.Module, dict, Any, Any, jax.Array], tuple[AggTerms, dict]]

ROWS = "rows/"  # the prefix of a per-row output among an objective's metrics


def step_key(rng: jax.Array, step: jax.Array, micro_batch: jax.Array | int) -> jax.Array:
    """The objective's PRNG key for micro-batch `micro_batch` of optimizer step `step`:
    fold_in(fold_in(key(rng), step), micro_batch), with `rng` the state's raw key data."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.wrap_key_data(rng), step), micro_batch)


@struct.dataclass
class TrainState:
    params: Any  # nnx.State of the trained module's Params
    opt_state: Any
    step: jax.Array  # int32 scalar: optimizer steps taken (skipped ones included)
    skipped_steps: jax.Array  # int32 scalar
    rng: jax.Array  # uint32 key data; the objective's per-step keys derive from it (`step_key`)


def init_train_state(params, optimizer: optax.GradientTransformation, seed: int = 0) -> TrainState:
    return TrainState(
        params=params,
        opt_state=optimizer.init(params),
        step=jnp.zeros((), jnp.int32),
        skipped_steps=jnp.zeros((), jnp.int32),
        rng=jax.random.key_data(jax.random.key(seed)),
    )


def split_micro_batches(batch: dict, num_micro_batches: int) -> dict:
    """[B, ...] -> [M, B/M, ...] with micro-batch m = rows m, M+m, 2M+m, ... Each device's
    contiguous block of rows stays on that device (no resharding); the order of rows does
    not matter because the step sums over all micro-batches."""

    def split(x):
        b = x.shape[0]
        return x.reshape(b // num_micro_batches, num_micro_batches, *x.shape[1:]).swapaxes(0, 1)

    return jax.tree.map(split, batch)


def make_train_step(
    graphdef: nnx.GraphDef,
    objective: Objective,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    num_micro_batches: int = 1,
    state_sharding: Any = None,
    batch_sharding: Any = None,
    frozen_sharding: Any = None,
    totals_fn: Callable[[dict], Any] | None = None,
    base_sharding: Any = None,
    live: Callable[[Any], jax.Array] | None = None,
):
    """Build `step(state, batch, frozen, base) -> (state, metrics)`, jitted with the given
    shardings and the state donated. `graphdef` is split from the model once, by the
    caller; `frozen` carries arrays that are read but not trained (a reference model);
    `base` the module's own weights that are not trained (LoRA: the base model, see
    `rljax.models.lora.split_trainable`; None or empty in full fine-tuning). Gradients
    and optimizer state exist for `state.params` only.

    `live(micro_batch)` (a bool scalar), when given, skips the micro-batches where it is
    false (`lax.cond`: they cost nothing): they add 0 to every sum and per-row output.
    That is exact for micro-batches whose terms are 0, e.g. ones without a real token under
    an objective that sums over tokens and rows (packed mini-batches, `rljax.rl.packing`)."""

    def micro_step(params, micro_batch, frozen, totals, key, base):
        def numerator(p):
            model = nnx.merge(graphdef, p) if base is None else nnx.merge(graphdef, p, base)
            set_dropout_key(model, key)  # a training forward: LoRA dropout on (if configured)
            terms, metrics = objective(model, micro_batch, frozen, totals, key)
            return terms.numerator, (terms.denominator, metrics)

        (num, (den, metrics)), grads = jax.value_and_grad(numerator, has_aux=True)(params)
        return grads, num, den, metrics

    def step(state: TrainState, batch: dict, frozen, base):
        totals = totals_fn(batch) if totals_fn is not None else None
        micro = split_micro_batches(batch, num_micro_batches)
        first = jax.tree.map(lambda x: x[0], micro)
        keys = jax.vmap(lambda m: step_key(state.rng, state.step, m))(jnp.arange(num_micro_batches))
        def split_rows(metrics):
            rows = {k: v for k, v in metrics.items() if k.startswith(ROWS)}
            return {k: v for k, v in metrics.items() if k not in rows}, rows

        grads0, num0, den0, metrics0 = jax.eval_shape(micro_step, state.params, first, frozen, totals, keys[0], base)

        def run(mb, key):
            grads, num, den, metrics = micro_step(state.params, mb, frozen, totals, key, base)
            return (grads, num, den, *split_rows(metrics))

        nothing = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (grads0, num0, den0, *split_rows(metrics0)))

        def body(carry, xs):
            mb, key = xs
            if live is None:
                grads, num, den, metrics, rows = run(mb, key)
            else:
                grads, num, den, metrics, rows = jax.lax.cond(live(mb), run, lambda mb, key: nothing, mb, key)
            g_acc, n_acc, d_acc, m_acc = carry
            weighted = jax.tree.map(lambda m: m * den, metrics)
            return (
                jax.tree.map(jnp.add, g_acc, grads),
                n_acc + num,
                d_acc + den,
                jax.tree.map(jnp.add, m_acc, weighted),
            ), rows

        (grads, num, den, metric_sums), rows = jax.lax.scan(body, nothing[:4], (micro, keys))
        loss = num / den
        grads = jax.tree.map(lambda g: g / den, grads)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        updates, new_opt_state = optimizer.update(grads, state.opt_state, state.params)
        new_params = optax.apply_updates(state.params, updates)
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)  # noqa: E731
        new_state = state.replace(
            params=keep(new_params, state.params),
            opt_state=keep(new_opt_state, state.opt_state),
            step=state.step + 1,
            skipped_steps=state.skipped_steps + (~finite).astype(jnp.int32),
        )
        metrics = {name: total / den for name, total in metric_sums.items()}
        # [M, B/M, ...] -> [B, ...]: micro-batch m holds rows m, M + m, ... (`split_micro_batches`)
        metrics.update({name: jnp.swapaxes(x, 0, 1).reshape(-1, *x.shape[2:]) for name, x in rows.items()})
        metrics.update({
            "train/loss": loss,
            "train/grad_norm": grad_norm,
            "train/lr": schedule(state.step),
            "train/skipped_steps": new_state.skipped_steps,
            "train/loss_denominator": den,
        })
        return new_state, metrics

    return jax.jit(
        step,
        in_shardings=(state_sharding, batch_sharding, frozen_sharding, base_sharding),
        out_shardings=(state_sharding, None),
        donate_argnums=(0,),
    )
