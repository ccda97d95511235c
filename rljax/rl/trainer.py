"""The RL loop (PPO, GRPO and relatives): a short loop over pure, jitted pieces.

    prompts ─► producer: sampler (rollout.n each) ─► rewards
            ─► old / ref log-probs, values ─► advantages
            ─► ppo_epochs x mini-batches of critic and actor updates ─► new weights into the sampler

Everything heavy is a jitted function of arrays: the forward passes here, the train step
of `rljax.train.steps` (shared with SFT / DPO), the estimators and losses of
`rljax.algos`. A run resumes from its last checkpoint (actor, critic, KL coefficient,
data position) with `trainer.resume_mode=auto`. A SIGTERM (mid-rollout included: the
step's rollout and update finish) stops it after a step every process agrees on, saved
(`rljax.runs.Run.preempted`).

Modules, one job each: the run's folder, checkpoints, resume and metrics (`rljax.runs`,
shared with the supervised loop), the rollouts (`rljax.rl.producer`: depth 0 in
`trainer.mode: sync`, each step samples with its own weights; `rljax.rl.async_producer`:
depth 1 in `one_step_off`, the next step samples while this one trains), the typed step
batch (`rljax.rl.batch`), the trained modules and their mini-batch updates
(`rljax.rl.learner`), the jitted forwards outside
the optimizer (`rljax.rl.forwards`), KL in the reward, rollout correction and advantages
(`rljax.rl.advantage_stage`), what a step reports (`rljax.rl.step_metrics`); here, the
loop. Each stage returns a new `StepBatch`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.algos.kl import get_kl_controller
from rljax.checkpoint import abstract_like
from rljax.config import ConfigError
from rljax.data import make_dataset
from rljax.hostsync import exchange_objects
from rljax.memory import memory_metrics
from rljax.models.attention import resolve_attention
from rljax.models.heads import ScalarHeadModel
from rljax.models.lora import sharing_base
from rljax.parallel import make_mesh, state_shardings
from rljax.rl.advantage_stage import AdvantageStage
from rljax.rl.agent_rollout import agent_config
from rljax.rl.async_config import run_split
from rljax.rl.async_producer import (OneStepOffProducer, rollout_from_json, rollout_to_json,
                                     staleness_metrics)
from rljax.rl.async_stream import StreamProducer, off_policy_metrics, update_off_policy_metrics
from rljax.rl.batch import BatchFields, StepBatch, build_batch
from rljax.rl.config import RLConfig
from rljax.rl.evaluate import validate
from rljax.rl.forwards import BatchForwards, make_log_prob_fn
from rljax.rl.generation import Generation, make_sampler
from rljax.rl.learner import make_learner
from rljax.rl.actor_critic import (ActorBatch, CriticBatch, actor_objective, critic_objective, packs_sequences,
                                   shares_prompts)
from rljax.rl.producer import SyncProducer
from rljax.rl.scoring import ScoredRollout, score_completions
from rljax.rl.step_metrics import Timer, batch_metrics, rollout_mismatch, throughput
from rljax.rl.warmup import run_warmup_sft
from rljax.runs import Run
from rljax.train.setup import build_decoder, peak_flops
from rljax.train.skip_guard import SkipGuard


def training_attention(decoder, mesh) -> str:
    """The attention kernel the decoder's training forwards run on the mesh's platform."""
    return resolve_attention(decoder.attention, mesh.devices.flat[0].platform, decoder.policy.compute,
                             decoder.config.head_dim)


class RLTrainer:
    """Holds the run's pieces; `step()` runs one RL iteration, `fit()` the whole run."""

    def __init__(self, cfg: RLConfig):
        # the config is checked first (every problem one line, before any work); prompts are "rl" rows
        self.run = Run(dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, format="rl")))
        cfg, self.tokenizer = self.run.config, self.run.tokenizer
        self.mesh = make_mesh(cfg.mesh, trainer_devices(cfg))
        if cfg.warmup_sft.enable:
            cfg = self.run.config = run_warmup_sft(cfg, self.run.directory)
        self.cfg = cfg
        a, r, alg = cfg.actor, cfg.rollout, cfg.algorithm

        decoder = build_decoder(cfg.model, self.tokenizer, mesh=self.mesh)
        if a.router_replay and not decoder.config.is_moe:
            raise ConfigError(f"actor.router_replay: the model ({decoder.config.model_type}) is dense; routing "
                              "replay needs a mixture of experts (qwen3_moe, mixtral)")
        corr = alg.rollout_correction
        objective, totals = actor_objective(a, r.temperature, corr)
        self.actor = make_learner(decoder, a.optim, objective, totals, cfg, self.mesh, a.ppo_mini_batch_size,
                                  a.ppo_micro_batch_size_per_device, a.ppo_epochs, a.shuffle, ActorBatch,
                                  cfg.trainer.seed, "actor", pack=packs_sequences(a, corr),
                                  share_prompts=shares_prompts(a, corr, training_attention(decoder, self.mesh)))
        self.fields = BatchFields.of(cfg)  # the optional fields of every step batch
        self.advantage_stage = AdvantageStage.of(cfg)
        self.reference = None  # with LoRA the reference is the policy with its adapters off: no copy
        if (a.kl_loss or alg.use_kl_in_reward) and not cfg.model.lora.enabled:  # frozen copy of the initial policy
            params = self.actor.state.params
            self.reference = jax.device_put(jax.tree.map(jnp.copy, params), state_shardings(params, self.mesh))
        self.critic = None
        if self.fields.values:
            # the critic starts from the actor's model; with LoRA it reads the actor's base arrays (no copy)
            backbone = (sharing_base(decoder) if cfg.model.lora.enabled
                        else build_decoder(cfg.model, self.tokenizer, mesh=self.mesh))
            critic_module = ScalarHeadModel(backbone, rngs=nnx.Rngs(cfg.trainer.seed + 1))
            c = cfg.critic
            self.critic = make_learner(critic_module, c.optim, critic_objective(c), None, cfg, self.mesh,
                                       c.ppo_mini_batch_size, c.ppo_micro_batch_size_per_device, c.ppo_epochs,
                                       True, CriticBatch, cfg.trainer.seed + 1, "critic")
        critic_graph = None if self.critic is None else self.critic.graphdef
        self.forwards = BatchForwards.of(cfg, self.actor.graphdef, critic_graph)
        self.agent_config = agent_config(cfg.agent) if cfg.agent else None
        self.kl_ctrl = get_kl_controller(alg.kl_ctrl)

        self.generation = Generation(cfg, decoder, self.tokenizer, self.agent_config,
                                     lambda: self.actor.params, self.mesh)
        fg = alg.filter_groups
        self.producer = SyncProducer(lambda prompts, params, offset: self.run_rollout(prompts, params, offset),
                                     lambda: next(self.train_data), cfg.data.batch_size, fg if fg.enable else None,
                                     self.fields.reward_baselines)
        self.mode = cfg.trainer.mode
        if self.mode == "one_step_off":  # depth 1: the next step's rollout runs while this step trains
            self.producer = OneStepOffProducer(self.producer, self.generation.update_params,
                                               self.generation.replicas.main_thread, cfg.async_.timeout_s)
            self.run.on_close(self.producer.close)
        # reference-answer perplexity in validation is scored at temperature 1
        self.val_log_probs = None if self.agent_config is not None else (
            self.forwards.log_probs if r.temperature == 1.0 else make_log_prob_fn(self.actor.graphdef, 1.0))
        self.run.on_close(self.generation.close)
        # every process reads the whole batch: rollouts are split over replicas, not processes
        self.train_data = make_dataset(cfg.data, self.tokenizer, "train", process_index=0, process_count=1)
        self.flops_peak = peak_flops(cfg.trainer.peak_flops_per_device) * jax.device_count()
        self.step_count = self._resume()
        self.skips = SkipGuard(cfg.trainer.max_consecutive_skipped_steps, "actor.optim.lr", a.optim.lr,
                               self.run.checkpointer, int(jax.device_get(self.actor.state.skipped_steps)))
        self.val_sampler = None  # async: validation samples on the trainer's devices, beside the stream
        if self.mode == "async":
            self.producer = self._stream_producer()
            states, _ = self.generation.replicas.hand_off(self.actor.params)
            self.generation.replicas.install(states, self.step_count)
            self.producer.start(self.step_count, self._stream_snapshot)
            self.run.on_close(self.producer.close)
            return
        self.generation.update_params(self.actor.params)
        if self.mode != "sync":  # the sampler now holds the restored weights; the checkpoint's batch is pending
            self.producer.restore(self._pending_batch, self.step_count)

    def _stream_producer(self) -> StreamProducer:
        """`trainer.mode: async`'s producer over the rollout replicas (`rljax.rl.async_stream`)."""
        cfg, generation = self.cfg, self.generation
        rewards = generation.replica_rewards()

        def score(completions, prompts) -> ScoredRollout:
            defer = generation.batch_rewards is not None
            return generation.settle(score_completions(completions, rewards, self.tokenizer, prompts, cfg, 0, defer))

        a = cfg.async_

        def exchange(name: str, value):  # several processes: through the coordination service
            return exchange_objects(f"stream/{name}", value, a.timeout_s, f"the rollout stream's {name}")

        return StreamProducer(generation.replicas, lambda: next(self.train_data), self.train_data.get_state, score,
                              cfg.sampling_params, cfg.data.batch_size, cfg.trainer.total_steps, a.max_staleness,
                              a.on_stale, a.segment_steps, a.timeout_s, generation.replicas.main_thread, exchange)

    # ---- one iteration -----------------------------------------------------------------

    def rollout(self, timer: Timer) -> ScoredRollout:
        """The step's rollout. sync: its prompts submitted to the producer with the
        sampler's policy version (this step's), and collected at once (depth 0).
        one_step_off: the batch submitted by the previous step (sampled one version ago)
        is collected, the sampler gets this step's weights, and the next step's prompts
        go to the producer (`rljax.rl.async_producer`)."""
        cfg, k = self.cfg, self.step_count
        if self.mode == "async":  # formed by the stream producer while the previous step trained
            with timer("wait_rollout"):
                return self.producer.collect(k)
        if self.mode == "sync":
            with timer("gen"):
                self.producer.submit(next(self.train_data), k, cfg.sampling_params(k))
                return self.producer.collect()
        if not self.producer.pending:  # the run's first step: nothing was sampled ahead
            self.producer.submit(next(self.train_data), k, cfg.sampling_params(k))
        with timer("wait_rollout"):
            rollout = self.producer.collect()
        with timer("update_weights"):
            rollout.metrics.update(self.producer.update_weights(self.actor.params, k))
        if k + 1 < cfg.trainer.total_steps:
            self.producer.submit(next(self.train_data), k, cfg.sampling_params(k + 1))
        return rollout

    def run_rollout(self, prompts: dict[str, list], params, offset: int) -> ScoredRollout:
        """One rollout of sampling and scoring (`rljax.rl.generation.Generation.rollout`)."""
        return self.generation.rollout(prompts, params, offset)

    def make_batch(self, rollout: ScoredRollout, timer: Timer) -> tuple[StepBatch, dict[str, float]]:
        """The rollout -> the finished step batch (forwards, then the advantage stage) and
        the stage's metrics; the KL controller moves to its update."""
        cfg = self.cfg
        samples = rollout.samples
        # group ids -> 0..G-1 (dynamic sampling draws them from several generation batches)
        _, group_ids = np.unique([s.group_id for s in samples], return_inverse=True)
        for s, g in zip(samples, group_ids):
            s.group_id = int(g)
        batch = build_batch(samples, cfg.row_bucket, cfg.row_length, pad_id=self.tokenizer.pad_token_id or 0)
        if self.fields.reward_baselines:
            batch = dataclasses.replace(batch, reward_baselines=np.asarray([s.baseline for s in samples], np.float32))
        batch = self.forwards.run(batch, self.mesh, timer, self.actor.params, self.reference,
                                  None if self.critic is None else self.critic.params)
        with timer("adv"):
            batch, metrics, self.kl_ctrl = self.advantage_stage(batch, self.kl_ctrl)
        self.fields.check(batch)
        return batch, metrics

    def step(self) -> dict[str, float]:
        timer = Timer(lambda phase: self.run.tracker.phase(self.step_count + 1, phase))
        start = time.perf_counter()
        with timer("step"):
            rollout = self.rollout(timer)
            batch, stage_metrics = self.make_batch(rollout, timer)
            metrics = {**rollout.metrics, **stage_metrics}
            batch, update_metrics = self.update(batch, timer)
            metrics.update(update_metrics)
            # updates skipped as non-finite keep the old weights; too many in a row stop the run
            attempted = self.actor.updates_per_step(batch.rows)
            skipped = self.skips.check_total(self.step_count + 1, int(jax.device_get(self.actor.state.skipped_steps)),
                                             attempted, metrics)
            with timer("update_weights"):
                if skipped < attempted:  # the sampler never runs on non-finite weights
                    self.skips.check_params(self.step_count + 1, self.actor.state.params,
                                            "the sampler keeps the previous weights", "actor parameters")
                if self.mode == "sync":  # one_step_off: at the next step's start, once its rollout is done
                    metrics.update(self.generation.update_params(self.actor.params))
                elif self.mode == "async":  # installed by the producer when due (rljax.rl.async_stream)
                    metrics.update(self.producer.publish(self.actor.params, self.step_count + 1))
        if self.mode != "sync":
            metrics.update(self.async_metrics(rollout, timer.seconds, start, time.perf_counter()))
            metrics.update(update_off_policy_metrics(metrics) if self.forwards.reuse_rollout_log_probs else
                           off_policy_metrics(batch.rollout_log_probs, batch.old_log_probs, batch.response_mask))
        self.step_count += 1
        metrics.update(batch_metrics(batch, rollout.samples))
        metrics.update(rollout_mismatch(batch))
        metrics.update(timer.seconds)
        metrics.update(throughput(batch, time.perf_counter() - start, metrics["timing_s/update_actor"],
                                  self.cfg.actor.ppo_epochs, self.actor_flops_per_token, self.flops_peak))
        metrics.update(memory_metrics())
        return metrics

    def update(self, batch: StepBatch, timer: Timer) -> tuple[StepBatch, dict[str, float]]:
        """The critic's and the actor's updates on `batch`. -> (the batch, with the
        old log-probs the actor's update gave when it gives them; the updates' metrics)."""
        metrics: dict[str, float] = {}
        # mini-batch order: a function of (seed, step), so a resumed run shuffles as the original
        rng = np.random.default_rng([self.cfg.trainer.seed, self.step_count])
        if self.critic is not None:
            with timer("update_critic"):
                metrics.update(self.critic.update(batch, self.mesh, rng)[0])
        with timer("update_actor"):
            actor_metrics, per_row = self.actor.update(batch, self.mesh, rng, self.reference)
            metrics.update(actor_metrics)
        if self.fields.old_log_probs_from_update:  # the update's own forward gave them
            batch = dataclasses.replace(batch, old_log_probs=per_row["old_log_probs"])
        return batch, metrics

    def async_metrics(self, rollout: ScoredRollout, seconds: dict[str, float], start: float,
                      end: float) -> dict[str, float]:
        """An asynchronous step's staleness (`rljax.rl.async_producer.staleness_metrics`)
        and idle fractions over its wall time: the trainer's, waiting for the rollout; the
        sampler's, with no rollout running."""
        wall = max(end - start, 1e-9)
        return {**staleness_metrics(rollout.samples, self.step_count),
                "async/trainer_idle_fraction": seconds.get("timing_s/wait_rollout", 0.0) / wall,
                "async/sampler_idle_fraction": 1.0 - self.producer.busy_seconds(start, end) / wall}

    def actor_flops_per_token(self, seq_len: int) -> float:
        return nnx.merge(self.actor.graphdef, self.actor.params).config.flops_per_token(seq_len)

    # ---- validation, checkpoints, the run ----------------------------------------------

    def validate(self) -> dict[str, float]:
        """`rljax.rl.evaluate.validate` with the current policy (asynchronous modes: handed
        to the sampler once the rollout in flight is done)."""
        run_rollout = self.run_rollout
        if self.mode == "async":  # the replicas serve the stream: validation samples on the trainer's devices
            if self.val_sampler is None:
                self.val_sampler = make_sampler(self.cfg, nnx.merge(self.actor.graphdef, self.actor.params))
                self.run.on_close(self.val_sampler.close)
            self.val_sampler.update_params(self.actor.params)
            run_rollout = self.generation.rollout_with(self.val_sampler)
        elif self.mode != "sync":
            self.producer.update_weights(self.actor.params, self.step_count)
        return validate(self.cfg, self.tokenizer, run_rollout, self.val_log_probs, self.actor.params,
                        self.mesh)

    def save(self) -> None:
        state: dict[str, Any] = {"actor": self.actor.state}
        if self.critic is not None:
            state["critic"] = self.critic.state
        meta: dict[str, Any] = {"kl_coef": float(self.kl_ctrl.value)}
        data_state = self.train_data.get_state()
        if self.mode == "async":  # the stream as it was at the install of this version (rljax.rl.async_stream)
            meta["stream"] = self.producer.snapshot(self.step_count)
            data_state = meta["stream"]["data_state"]
        elif self.mode != "sync":  # the finished, untrained batch of the next step (the data is past its prompts)
            pending = self.producer.pending_rollout()
            meta["pending_rollout"] = None if pending is None else rollout_to_json(pending)
        self.run.save(self.step_count, state, data_state, **meta)

    def _resume(self) -> int:
        """Restore the actor, the critic, the KL coefficient and the data position
        (`rljax.runs.Run.resume`); -> the step the run continues after."""
        target: dict[str, Any] = {"actor": abstract_like(self.actor.state)}
        if self.critic is not None:
            target["critic"] = abstract_like(self.critic.state)
        found = self.run.resume(target, self.train_data)
        self._pending_batch = self._stream_snapshot = None
        if found is None:
            return 0
        self._stream_snapshot = found.meta.get("stream")
        pending = found.meta.get("pending_rollout")
        self._pending_batch = None if pending is None else rollout_from_json(pending)
        self.actor.state = found.state["actor"]
        if self.critic is not None:
            self.critic.state = found.state["critic"]
        self.kl_ctrl = dataclasses.replace(self.kl_ctrl, value=found.meta["kl_coef"])
        return int(found.step)

    def fit(self) -> list[dict[str, float]]:
        cfg = self.cfg.trainer
        history = []
        error = None
        try:
            if self.step_count == 0 and self.cfg.data.val_files:
                val = self.validate()
                self.run.tracker.log(0, val)
                history.append({"step": 0, **val})
            while self.step_count < cfg.total_steps:
                self._at = self.step_count + 1  # the step a stop message names
                metrics = self.step()
                step = self.step_count
                if self.run.validation_due(step):
                    start = time.perf_counter()
                    metrics.update(self.validate())
                    metrics["timing_s/testing"] = time.perf_counter() - start
                self.run.tracker.log(step, metrics)
                history.append({"step": step, **metrics})
                preempted = self.run.preempted(step)  # a SIGTERM to any process, mid-rollout included
                if self.skips.save_now(self.run.save_due(step) or preempted):  # never a step whose update was skipped
                    self.save()
                if preempted:  # every process saved its last good step
                    raise self.run.preemption_stop(step)
            self.skips.finish(self.step_count)
        except BaseException as e:  # Ctrl-C included: the save in flight is finished, one line says where we are
            error = e
            raise
        finally:
            self.close(error)
        return history

    def close(self, error: BaseException | None = None) -> None:
        """Finish the save in flight and release the tracker, sampler, reward workers and
        reward sources (`rljax.runs.Run.close`). `error`: what ended the run."""
        self.run.close(error, getattr(self, "_at", self.step_count))


def train_rl(cfg: RLConfig) -> list[dict[str, float]]:
    """Run (or resume) an RL run under its mesh (so activation layouts are pinned)."""
    with jax.set_mesh(make_mesh(cfg.mesh, trainer_devices(cfg))):
        return RLTrainer(cfg).fit()


def trainer_devices(cfg: RLConfig) -> tuple | None:
    """The devices of the trainer's mesh: all (None) in sync mode, else the trainer's
    share (`rljax.rl.async_config.split_devices`)."""
    return None if cfg.trainer.mode == "sync" else run_split(cfg).trainer
