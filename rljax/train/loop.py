"""The supervised training loop shared by SFT, reward-model and DPO training.

    batch (grain) -> shard onto the mesh -> jitted step -> metrics (one step late, so the
    host never waits on the device) -> validate / checkpoint every N steps

The run's folder, config, tokenizer, data, checkpoints, resume and metrics are the
shared scaffold's (`rljax.runs.Run`); what differs between SFT, reward-model and DPO
training is the task (`rljax.train.tasks`). With `trainer.resume_mode=auto` a restarted
run continues from its last complete checkpoint: same parameters, optimizer state, RNG
and data position. A SIGTERM stops it after a step every process agrees on, saved
(`rljax.runs.Run.preempted`).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

from rljax.checkpoint import abstract_like
from rljax.data import make_dataset
from rljax.memory import memory_metrics
from rljax.models.lora import join
from rljax.parallel import check_batch, make_mesh, shard_local_batch
from rljax.runs import Run
from rljax.train.objectives import make_eval_step
from rljax.train.optim import make_optimizer
from rljax.train.run_config import RunConfig
from rljax.train.setup import build_decoder, init_sharded_train_state, peak_flops, place_trainable
from rljax.train.skip_guard import SkipGuard
from rljax.train.steps import make_train_step
from rljax.train.tasks import make_task


def num_micro_batches(cfg: RunConfig, mesh) -> int:
    """Micro-batches per step: `data.batch_size / trainer.micro_batch_size` (0: one), both
    split evenly over the mesh's data x fsdp."""
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
    run = Run(cfg)  # the config is checked first: every problem one line, before any work
    mesh = make_mesh(cfg.mesh)
    with jax.set_mesh(mesh):
        return _train(run, mesh)


def _train(run: Run, mesh) -> dict:
    cfg, tokenizer = run.config, run.tokenizer
    num_micro = num_micro_batches(cfg, mesh)
    decoder = build_decoder(cfg.model, tokenizer, mesh=mesh)
    task = make_task(cfg, decoder, mesh)
    if cfg.data.format != task.data_format:
        raise ValueError(
            f"data.format={cfg.data.format!r} but trainer.algorithm={cfg.trainer.algorithm!r} "
            f"reads {task.data_format!r} data"
        )
    graphdef, params, base = place_trainable(task.module, mesh)  # LoRA: adapters (+ head), frozen base
    optimizer, schedule = make_optimizer(cfg.optim, cfg.trainer.total_steps)
    state = init_sharded_train_state(params, optimizer, cfg.trainer.seed, mesh)
    state_sharding = jax.tree.map(lambda x: x.sharding, state)
    step_fn = make_train_step(graphdef, task.objective, optimizer, schedule, num_micro,
                              state_sharding=state_sharding, frozen_sharding=task.frozen_sharding)

    train_data = make_dataset(cfg.data, tokenizer, "train")
    found = run.resume(abstract_like(state), train_data)
    state, start_step = (state, 0) if found is None else (found.state, found.step)
    skips = SkipGuard(cfg.trainer.max_consecutive_skipped_steps, "optim.lr", cfg.optim.lr, run.checkpointer,
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
            **memory_metrics(),
        })
        if flops_peak:
            host["perf/mfu"] = tokens * model_config.flops_per_token(seq_len) / elapsed / flops_peak
        run.tracker.log(step, host)
        skips.check(step, host)
        return host

    step, error = start_step, None
    try:
        for step in range(start_step + 1, cfg.trainer.total_steps + 1):
            t0 = time.perf_counter()
            host_batch = next(train_data)
            data_state = train_data.get_state()
            batch = shard_local_batch(host_batch, mesh)
            data_s = time.perf_counter() - t0
            state, metrics = step_fn(state, batch, task.frozen, base)
            if pending is not None:
                last = flush(pending)
            pending = (step, metrics, _tokens(host_batch), _seq_len(batch), data_s)  # the agreed length
            preempted = run.preempted(step)  # a SIGTERM to any process: all save this step and stop
            validate_now = run.validation_due(step)
            save_due = run.save_due(step) or skips.owed or preempted
            if validate_now or save_due:  # log this step before the pause, so its timing is its own
                last, pending = flush(pending), None
            save_now = save_due and skips.save_now(save_due)  # never a step whose update was skipped
            if validate_now:
                val = _validate(evaluate, join(state.params, base), task.frozen, cfg, tokenizer, mesh)
                run.tracker.log(step, val)
                last.update(val)
            if save_now:
                skips.check_params(step, state.params, f"checkpoint {step} not written")
                run.save(step, state, data_state)
            if validate_now or save_due:
                clock[0] = time.perf_counter()
            if preempted:
                raise run.preemption_stop(step)
        skips.finish(step)
    except BaseException as e:  # Ctrl-C included: the save in flight is finished, one line says where we are
        error = e
        raise
    finally:
        run.close(error, step)
    return last


def _validate(evaluate, params, frozen, cfg: RunConfig, tokenizer, mesh) -> dict:
    """Loss (and objective metrics) over the whole validation split, normalised once."""
    val_cfg = dataclasses.replace(cfg.data, shuffle=False)
    numerator = denominator = 0.0
    sums: dict[str, float] = {}
    for host_batch in make_dataset(val_cfg, tokenizer, "val"):
        num, den, weighted = jax.device_get(evaluate(params, shard_local_batch(host_batch, mesh), frozen))
        numerator += float(num)
        denominator += float(den)
        for k, v in weighted.items():
            sums[k] = sums.get(k, 0.0) + float(v)
    if denominator == 0:
        return {}
    out = {"val/loss": numerator / denominator}
    out.update({f"val/{k}": v / denominator for k, v in sums.items()})
    return out
