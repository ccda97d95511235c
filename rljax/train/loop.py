"""The supervised training loop shared by SFT, reward-model and DPO training.

    batch (grain) -> shard onto the mesh -> jitted step -> metrics (one step late, so the
    host never waits on the device) -> validate / checkpoint every N steps

A run lives in `<trainer.default_local_dir>/<trainer.experiment_name>/`: `config.yaml`
(the resolved config), `tokenizer/`, `checkpoints/<step>/`, `metrics.jsonl`,
`tensorboard/`. With `trainer.resume_mode=auto` a restarted run continues from its last
complete checkpoint: same parameters, optimizer state, RNG and data position.
"""

from __future__ import annotations

import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from rljax.checkpoint import Checkpointer, RunError, abstract_like, close_after, finalized_steps, resume
from rljax.config import config_to_dict, save_config, validate
from rljax.data import make_dataset
from rljax.data.synthetic_spec import materialize
from rljax.parallel import check_batch, make_mesh, shard_batch
from rljax.tracking import Tracker
from rljax.train.objectives import make_eval_step
from rljax.train.optim import make_optimizer
from rljax.train.run_config import RunConfig
from rljax.train.setup import build_decoder, init_sharded_train_state, load_tokenizer, peak_flops, place
from rljax.train.steps import make_train_step
from rljax.train.tasks import make_task


def run_dir_of(cfg: RunConfig) -> str:
    return os.path.join(cfg.trainer.default_local_dir, cfg.trainer.experiment_name)


def _num_micro_batches(cfg: RunConfig, mesh) -> int:
    batch = cfg.data.batch_size
    micro = cfg.trainer.micro_batch_size or batch
    check_batch(batch, mesh, name="data.batch_size")
    if batch % micro:
        raise ValueError(f"trainer.micro_batch_size={micro} does not divide data.batch_size={batch}")
    check_batch(micro, mesh, name="trainer.micro_batch_size")
    return batch // micro


def _tokens(batch: dict) -> int:
    for key in ("attention_mask", "segment_ids", "chosen_attention_mask"):
        if key in batch:
            total = int(np.sum(np.asarray(batch[key]) > 0))
            if key == "chosen_attention_mask":
                total += int(np.sum(np.asarray(batch["rejected_attention_mask"]) > 0))
            return total
    return 0


def _seq_len(batch: dict) -> int:
    key = "input_ids" if "input_ids" in batch else "chosen_input_ids"
    return int(batch[key].shape[1])


def train(cfg: RunConfig) -> dict:
    """Run (or resume) training; return the last logged metrics."""
    validate(cfg, jax.device_count())  # every config problem, as one line, before any work
    mesh = make_mesh(cfg.mesh)
    with jax.set_mesh(mesh):
        return _train(cfg, mesh)


def _train(cfg: RunConfig, mesh) -> dict:
    run_dir = run_dir_of(cfg)
    os.makedirs(run_dir, exist_ok=True)
    if jax.process_index() == 0:
        save_config(cfg, os.path.join(run_dir, "config.yaml"))
    num_micro = _num_micro_batches(cfg, mesh)
    tokenizer = load_tokenizer(cfg.model)
    if jax.process_index() == 0:
        tokenizer.save_pretrained(os.path.join(run_dir, "tokenizer"))

    decoder = build_decoder(cfg.model, tokenizer, mesh=mesh)
    task = make_task(cfg, decoder, mesh)
    if cfg.data.format != task.data_format:
        raise ValueError(
            f"data.format={cfg.data.format!r} but trainer.algorithm={cfg.trainer.algorithm!r} "
            f"reads {task.data_format!r} data"
        )
    graphdef, params = place(task.module, mesh)
    optimizer, schedule = make_optimizer(cfg.optim, cfg.trainer.total_steps)
    state = init_sharded_train_state(params, optimizer, cfg.trainer.seed, mesh)
    state_sharding = jax.tree.map(lambda x: x.sharding, state)
    step_fn = make_train_step(graphdef, task.objective, optimizer, schedule, num_micro,
                              state_sharding=state_sharding, frozen_sharding=task.frozen_sharding)

    data_dir = os.path.join(run_dir, "data")
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(
        cfg.data,
        train_files=materialize(cfg.data.train_files, data_dir, "train"),
        val_files=materialize(cfg.data.val_files, data_dir, "val"),
    ))
    train_data = make_dataset(cfg.data, tokenizer, "train")
    checkpointer = Checkpointer(os.path.join(run_dir, "checkpoints"), cfg.trainer.max_to_keep, cfg.trainer.async_save)
    start = _maybe_resume(cfg, checkpointer, state, train_data)
    if start is not None:
        state, start_step = start
    else:
        start_step = 0

    tracker = Tracker(run_dir, cfg.trainer.logger, cfg.trainer.total_steps)
    tracker.start_at(start_step)  # metrics an earlier attempt logged after the checkpoint are dropped
    skips = SkipGuard(cfg.trainer.max_consecutive_skipped_steps, "optim.lr", cfg.optim.lr, checkpointer,
                      int(jax.device_get(state.skipped_steps)))
    flops_peak = peak_flops(cfg.trainer.peak_flops_per_device) * jax.device_count()
    model_config = decoder.config
    evaluate = make_eval_step(graphdef, task.objective) if cfg.data.val_files else None
    pending = None  # (step, device metrics, tokens, seq_len, data seconds) of the previous step
    last: dict = {}
    clock = [time.perf_counter()]

    def flush(pending) -> dict:
        """Fetch a step's metrics (the device has moved on to the next step by now)."""
        step, metrics, tokens, seq_len, data_s = pending
        host = {k: float(v) for k, v in jax.device_get(metrics).items()}
        now = time.perf_counter()
        elapsed, clock[0] = now - clock[0], now  # step 1 includes compilation
        host.update({
            "timing_s/step": elapsed,
            "timing_s/data": data_s,
            "perf/throughput": tokens * jax.process_count() / elapsed / jax.device_count(),  # tokens/s/device
            "perf/total_num_tokens": tokens,
            "perf/seq_len": seq_len,  # padded length of the step's batch (every process's)
        })
        if flops_peak:
            host["perf/mfu"] = tokens * model_config.flops_per_token(seq_len) / elapsed / flops_peak
        tracker.log(step, host)
        skips.check(step, host)
        return host

    step, error = start_step, None
    try:
        for step in range(start_step + 1, cfg.trainer.total_steps + 1):
            t0 = time.perf_counter()
            host_batch = next(train_data)
            data_state = train_data.get_state()
            batch = shard_batch(host_batch, mesh)
            data_s = time.perf_counter() - t0
            state, metrics = step_fn(state, batch, task.frozen)
            if pending is not None:
                last = flush(pending)
            pending = (step, metrics, _tokens(host_batch), _seq_len(batch), data_s)  # the agreed length
            is_last = step == cfg.trainer.total_steps
            validate_now = evaluate is not None and (
                is_last or (cfg.trainer.test_freq and step % cfg.trainer.test_freq == 0))
            save_now = is_last or (cfg.trainer.save_freq and step % cfg.trainer.save_freq == 0)
            if validate_now or save_now:  # log this step before the pause, so its timing is its own
                last, pending = flush(pending), None
            if validate_now:
                val = _validate(evaluate, state.params, task.frozen, cfg, tokenizer, mesh)
                tracker.log(step, val)
                last.update(val)
            if save_now:
                skips.check_params(step, state.params, f"checkpoint {step} not written")
                checkpointer.save(step, state, data_state, {"step": step, "config": config_to_dict(cfg)})
            if validate_now or save_now:
                clock[0] = time.perf_counter()
    except BaseException as e:  # Ctrl-C included: the save in flight is finished, one line says where we are
        error = e
        raise
    finally:
        try:
            close_after(checkpointer, error, step)
        finally:
            tracker.close()
    return last


def _maybe_resume(cfg: RunConfig, checkpointer: Checkpointer, state, train_data):
    """(restored state, step) of the checkpoint `trainer.resume_mode` names (a damaged
    latest one skipped: `rljax.checkpoint.resume`), or None to start from scratch."""
    found = resume(cfg.trainer.resume_mode, checkpointer, abstract_like(state), cfg.trainer.resume_fallback)
    if found is None:
        return None
    train_data.set_state(found.data_state)
    if jax.process_index() == 0:
        print(f"resumed from {found.path}", flush=True)
    return found.state, found.step


class NonFiniteError(RunError):
    """Training produced non-finite values it cannot recover from; the message says
    what to try and which checkpoint holds the last good weights."""


@jax.jit
def params_finite(params) -> jax.Array:
    """True when every parameter is finite: one fused reduction on device."""
    leaves = jax.tree.leaves(params)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])) if leaves else jnp.bool_(True)


class SkipGuard:
    """Stops a run whose updates keep being skipped as non-finite (`train/skipped_steps`
    counts them on device; the step keeps the old weights), and one whose weights became
    non-finite through an update that was not skipped. Shared by the supervised and the
    RL loop; the error says what to try and which checkpoint is the last good one.

    `limit`: trainer.max_consecutive_skipped_steps (0: never stop); `lr_key`/`lr`: the
    learning rate to name; `skipped`: the skipped-step count the run starts with."""

    HINT = ("try a lower {lr_key} (now {lr:g}), check the data for empty or broken rows (a zero loss "
            "denominator, inf/nan inputs), and with bf16 use model.compute_dtype=float32 (overflow)")

    def __init__(self, limit: int, lr_key: str, lr: float, checkpointer: Checkpointer, skipped: int = 0):
        self.limit, self.lr_key, self.lr, self.checkpointer = limit, lr_key, lr, checkpointer
        self.skipped_total = skipped
        self.consecutive = 0

    def _last_good(self) -> str:
        try:
            self.checkpointer.wait()  # a save in flight holds finite weights (checked before it)
        except RunError:
            pass
        done = finalized_steps(self.checkpointer.directory)
        return (f"the last good checkpoint is {self.checkpointer.path(done[-1])}" if done
                else "no checkpoint was written")

    def count(self, step: int, skipped: int, attempted: int = 1, metrics: dict | None = None) -> None:
        """`skipped` of the `attempted` optimizer steps of training step `step` (one for
        supervised training, the mini-batch updates of an RL step) were skipped; raise
        once `limit` in a row were (a step with some updates through ends the streak)."""
        self.consecutive = self.consecutive + attempted if attempted and skipped >= attempted else 0
        if not self.limit or self.consecutive < self.limit:
            return
        metrics = metrics or {}
        seen = ", ".join(f"{k}={metrics[k]:.4g}" for k in ("train/loss", "train/grad_norm") if k in metrics)
        raise NonFiniteError(
            f"{self.consecutive} consecutive optimizer steps were skipped, up to step {step}: loss or gradient not "
            f"finite{f' ({seen})' if seen else ''}; stopped (trainer.max_consecutive_skipped_steps={self.limit}): "
            + self.HINT.format(lr_key=self.lr_key, lr=self.lr) + f"; {self._last_good()}")

    def check(self, step: int, metrics: dict) -> None:
        """A supervised step's host metrics (`train/skipped_steps` is the running total)."""
        self.check_total(step, int(metrics.get("train/skipped_steps", self.skipped_total)), 1, metrics)

    def check_total(self, step: int, total: int, attempted: int, metrics: dict | None = None) -> int:
        """`count` from the state's running total of skipped updates; returns how many of
        this step's `attempted` updates were skipped."""
        skipped, self.skipped_total = total - self.skipped_total, total
        self.count(step, skipped, attempted, metrics)
        return skipped

    def check_params(self, step: int, params, consequence: str, what: str = "parameters") -> None:
        """Raise if `params` hold a non-finite value (an update with finite loss and
        gradient overflowed): `consequence` says what was not done with them."""
        if bool(params_finite(params)):
            return
        raise NonFiniteError(
            f"{what} are not finite after step {step} (an update with finite loss and gradient overflowed); "
            f"{consequence}: " + self.HINT.format(lr_key=self.lr_key, lr=self.lr) + f"; {self._last_good()}")


def _validate(evaluate, params, frozen, cfg: RunConfig, tokenizer, mesh) -> dict:
    """Loss (and objective metrics) over the whole validation split, normalised once."""
    val_cfg = dataclasses.replace(cfg.data, shuffle=False)
    numerator = denominator = 0.0
    sums: dict[str, float] = {}
    for host_batch in make_dataset(val_cfg, tokenizer, "val"):
        num, den, weighted = jax.device_get(evaluate(params, shard_batch(host_batch, mesh), frozen))
        numerator += float(num)
        denominator += float(den)
        for k, v in weighted.items():
            sums[k] = sums.get(k, 0.0) + float(v)
    if denominator == 0:
        return {}
    out = {"val/loss": numerator / denominator}
    out.update({f"val/{k}": v / denominator for k, v in sums.items()})
    return out
