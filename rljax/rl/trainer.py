"""The RL loop (PPO, GRPO and relatives): a short loop over pure, jitted pieces.

    prompts ─► sampler (rollout.n each) ─► rewards ─► old / ref log-probs, values
            ─► advantages ─► ppo_epochs x mini-batches of critic and actor updates
            ─► new weights into the sampler

Everything heavy is a jitted function of arrays: the forward passes here, the train step
of `rljax.train.steps` (shared with SFT / DPO), the estimators and losses of
`rljax.algos`. A run resumes from its last checkpoint (actor, critic, KL coefficient,
data position) with `trainer.resume_mode=auto`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.algos.kl import FULL_KL, apply_kl_to_rewards, get_kl_controller, kl_from_hidden, kl_penalty
from rljax.algos.logprobs import log_probs_from_hidden
from rljax.algos.registry import get_adv_estimator_fn
from rljax.algos.rollout_correction import compute_rollout_correction_and_rejection_mask
from rljax.checkpoint import Checkpointer, abstract_like, close_after, resume
from rljax.config import config_to_dict, save_config
from rljax.config import validate as validate_config  # (`validate` is the RL validation)
from rljax.data import make_dataset
from rljax.data.synthetic_spec import materialize
from rljax.models.heads import ScalarHeadModel
from rljax.parallel import data_parallel_size, make_mesh, shard_batch, state_shardings
from rljax.rl.agent_rollout import agent_config
from rljax.rl.batch import build_batch
from rljax.rl.config import RLConfig
from rljax.rl.evaluate import validate
from rljax.rl.generation import make_reward_manager, make_round_fn, make_sampler
from rljax.rl.model_rewards import build_model_rewards
from rljax.rl.objectives import actor_objective, aligned_values, correction_kwargs, critic_objective
from rljax.rl.rollout import ScoredRollout, dynamic_sampling, sampling_params
from rljax.rl.warmup import run_warmup_sft
from rljax.tracking import Tracker
from rljax.train.optim import OptimConfig, make_optimizer
from rljax.train.loop import SkipGuard
from rljax.train.setup import build_decoder, init_sharded_train_state, load_tokenizer, peak_flops, place
from rljax.train.steps import TrainState, make_train_step

ACTOR_KEYS = ("input_ids", "attention_mask", "response_mask", "old_log_probs", "advantages")
CRITIC_KEYS = ("input_ids", "attention_mask", "response_mask", "values", "returns")


class Timer:
    """`with timer("gen"): ...` accumulates seconds into timing_s/gen."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        yield
        self.seconds[f"timing_s/{name}"] = self.seconds.get(f"timing_s/{name}", 0.0) + time.perf_counter() - start


@dataclass
class Learner:
    """A trained module: its graph, its TrainState and its jitted update step."""

    graphdef: nnx.GraphDef
    state: TrainState
    step: Callable
    mini_batch_rows: int
    epochs: int
    shuffle: bool
    keys: tuple[str, ...]

    def update(self, batch: dict[str, np.ndarray], mesh, rng: np.random.Generator, frozen=None) -> dict[str, float]:
        """`epochs` passes over the batch in mini-batches, one optimizer step each."""
        rows = batch["input_ids"].shape[0]
        outputs = []
        for _ in range(self.epochs):
            order = rng.permutation(rows) if self.shuffle else np.arange(rows)
            for start in range(0, rows, self.mini_batch_rows):
                idx = order[start : start + self.mini_batch_rows]
                mini = shard_batch({k: batch[k][idx] for k in self.keys}, mesh)
                self.state, metrics = self.step(self.state, mini, frozen)
                outputs.append(metrics)
        host = jax.device_get(outputs)
        return {k: float(np.mean([m[k] for m in host])) for k in host[0]}


def make_learner(module: nnx.Module, optim: OptimConfig, objective, totals_fn, cfg: RLConfig, mesh,
                 mini_prompts: int, micro_per_device: int, epochs: int, shuffle: bool, keys, seed: int) -> Learner:
    graphdef, params = place(module, mesh)
    optimizer, schedule = make_optimizer(optim, cfg.trainer.total_steps * _updates_per_step(cfg, mini_prompts, epochs))
    state = init_sharded_train_state(params, optimizer, seed, mesh)
    mini_rows = mini_prompts * cfg.rollout.n
    micro_rows = micro_per_device * data_parallel_size(mesh) if micro_per_device else mini_rows
    if (cfg.data.batch_size * cfg.rollout.n) % mini_rows or mini_rows % micro_rows:
        raise ValueError(
            f"rows per step {cfg.data.batch_size}x{cfg.rollout.n} must be a multiple of the mini-batch "
            f"{mini_prompts}x{cfg.rollout.n} rows, itself a multiple of the micro-batch {micro_rows} rows"
        )
    step = make_train_step(graphdef, objective, optimizer, schedule, mini_rows // micro_rows,
                           state_sharding=jax.tree.map(lambda x: x.sharding, state), totals_fn=totals_fn)
    return Learner(graphdef, state, step, mini_rows, epochs, shuffle, tuple(keys))


def _updates_per_step(cfg: RLConfig, mini_prompts: int, epochs: int) -> int:
    return max(1, cfg.data.batch_size // mini_prompts) * epochs


def make_log_prob_fn(graphdef: nnx.GraphDef, temperature: float):
    """Jitted aligned token log-probs of `input_ids` under the given params (chunked)."""

    @jax.jit
    def log_probs(params, input_ids, attention_mask):
        model = nnx.merge(graphdef, params)
        hidden = model.hidden_states(input_ids, attention_mask=attention_mask)
        return log_probs_from_hidden(hidden, model.unembedding(), input_ids, temperature=temperature)

    return log_probs


def make_full_kl_fn(graphdef: nnx.GraphDef, temperature: float):
    """Jitted aligned exact KL(pi || pi_ref) over the vocabulary per position, `(params,
    reference params, input_ids, attention_mask) -> [B, T]`; chunked over positions
    (`rljax.algos.kl.kl_from_hidden`), never [B, T, vocab]."""

    @jax.jit
    def full_kl(params, reference, input_ids, attention_mask):
        model, ref = nnx.merge(graphdef, params), nnx.merge(graphdef, reference)
        hidden = model.hidden_states(input_ids, attention_mask=attention_mask)
        ref_hidden = ref.hidden_states(input_ids, attention_mask=attention_mask)
        return kl_from_hidden(hidden, model.unembedding(), ref_hidden, ref.unembedding(), temperature=temperature)

    return full_kl


def make_value_fn(graphdef: nnx.GraphDef):
    @jax.jit
    def values(params, input_ids, attention_mask):
        return aligned_values(nnx.merge(graphdef, params), {"input_ids": input_ids, "attention_mask": attention_mask})

    return values


def _stats(prefix: str, values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {}
    return {f"{prefix}/mean": float(values.mean()), f"{prefix}/max": float(values.max()),
            f"{prefix}/min": float(values.min())}


def batch_metrics(batch: dict[str, np.ndarray], samples) -> dict[str, float]:
    """verl's data metrics: scores, rewards, advantages, returns, values, lengths."""
    mask = batch["response_mask"] > 0
    seq_score = batch["token_level_scores"].sum(-1)
    out = {}
    out.update(_stats("critic/score", seq_score))
    out.update(_stats("critic/rewards", batch["token_level_rewards"].sum(-1)))
    out.update(_stats("critic/advantages", batch["advantages"][mask]))
    out.update(_stats("critic/returns", batch["returns"][mask]))
    if "values" in batch:
        out.update(_stats("critic/values", batch["values"][mask]))
    response_lengths = np.asarray([len(s.response_ids) for s in samples], np.float32)
    out.update(_stats("response_length", response_lengths))
    out["response_length/clip_ratio"] = float(np.mean([s.truncated for s in samples]))
    out.update(_stats("prompt_length", np.asarray([len(s.prompt_ids) for s in samples], np.float32)))
    return out


class RLTrainer:
    """Holds the run's pieces; `step()` runs one RL iteration, `fit()` the whole run."""

    def __init__(self, cfg: RLConfig):
        validate_config(cfg, jax.device_count())  # every config problem, as one line, before any work
        self.run_dir = os.path.join(cfg.trainer.default_local_dir, cfg.trainer.experiment_name)
        os.makedirs(self.run_dir, exist_ok=True)
        data_dir = os.path.join(self.run_dir, "data")
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(
            cfg.data, format="rl", train_files=materialize(cfg.data.train_files, data_dir, "train"),
            val_files=materialize(cfg.data.val_files, data_dir, "val")))
        self.mesh = make_mesh(cfg.mesh)
        self.tokenizer = load_tokenizer(cfg.model)
        if jax.process_index() == 0:
            save_config(cfg, os.path.join(self.run_dir, "config.yaml"))
            self.tokenizer.save_pretrained(os.path.join(self.run_dir, "tokenizer"))
        if cfg.warmup_sft.enable:
            cfg = run_warmup_sft(cfg, self.run_dir)
        self.cfg = cfg
        a, r, alg = cfg.actor, cfg.rollout, cfg.algorithm

        decoder = build_decoder(cfg.model, self.tokenizer, mesh=self.mesh)
        corr = alg.rollout_correction
        objective, totals = actor_objective(a, r.temperature, corr)
        keys = ACTOR_KEYS + (("ref_log_probs",) if a.use_kl_loss and a.kl_loss_type != FULL_KL else ()) + (
            ("rollout_is_weights",) if corr.rollout_is is not None and not corr.bypass_mode else ())
        self.actor = make_learner(decoder, a.optim, objective, totals, cfg, self.mesh, a.ppo_mini_batch_size,
                                  a.ppo_micro_batch_size_per_device, a.ppo_epochs, a.shuffle, keys, cfg.trainer.seed)
        self.log_probs = make_log_prob_fn(self.actor.graphdef, r.temperature)
        # KL-in-reward "full": the exact KL(pi_old || pi_ref) per position, chunked over the vocabulary
        self.full_kl = (make_full_kl_fn(self.actor.graphdef, r.temperature)
                        if alg.use_kl_in_reward and alg.kl_penalty == FULL_KL else None)
        # decoupled rollout correction: weights and rejections on the step batch (bypass: in the loss)
        self.rollout_correction = (jax.jit(functools.partial(compute_rollout_correction_and_rejection_mask,
                                                             **correction_kwargs(corr)))
                                   if corr.enabled and not corr.bypass_mode else None)
        self.reference = None
        if a.use_kl_loss or alg.use_kl_in_reward:  # frozen copy of the initial policy
            params = self.actor.state.params
            self.reference = jax.device_put(jax.tree.map(jnp.copy, params), state_shardings(params, self.mesh))
        self.critic = None
        if alg.adv_estimator == "gae":
            critic_module = ScalarHeadModel(build_decoder(cfg.model, self.tokenizer, mesh=self.mesh),
                                            rngs=nnx.Rngs(cfg.trainer.seed + 1))
            c = cfg.critic
            self.critic = make_learner(critic_module, c.optim, critic_objective(c), None, cfg, self.mesh,
                                       c.ppo_mini_batch_size, c.ppo_micro_batch_size_per_device, c.ppo_epochs,
                                       True, CRITIC_KEYS, cfg.trainer.seed + 1)
            self.values = make_value_fn(self.critic.graphdef)
        self.agent_config = agent_config(cfg.agent) if cfg.agent else None
        self.kl_ctrl = get_kl_controller(alg.kl_ctrl.type, alg.kl_ctrl.kl_coef, alg.kl_ctrl.target_kl, alg.kl_ctrl.horizon)
        self.advantage_fn = get_adv_estimator_fn(alg.adv_estimator)

        self.sampler = make_sampler(cfg, decoder)
        self.rewards = make_reward_manager(cfg)
        # reward.reward_model / reward.verifier: None unless enabled
        self.model_rewards = build_model_rewards(cfg, self.tokenizer, decoder, lambda: self.actor.state.params,
                                                 self.mesh)
        # reference-answer perplexity in validation is scored at temperature 1
        self.val_log_probs = None if self.agent_config is not None else (
            self.log_probs if r.temperature == 1.0 else make_log_prob_fn(self.actor.graphdef, 1.0))
        self.train_data = make_dataset(cfg.data, self.tokenizer, "train")
        self.checkpointer = Checkpointer(os.path.join(self.run_dir, "checkpoints"), cfg.trainer.max_to_keep,
                                         cfg.trainer.async_save)
        self.tracker = Tracker(self.run_dir, cfg.trainer.logger, cfg.trainer.total_steps)
        self.flops_peak = peak_flops(cfg.trainer.peak_flops_per_device) * jax.device_count()
        self.step_count = self._maybe_resume()
        self.skips = SkipGuard(cfg.trainer.max_consecutive_skipped_steps, "actor.optim.lr", a.optim.lr,
                               self.checkpointer, int(jax.device_get(self.actor.state.skipped_steps)))
        self.sampler.update_params(self.actor.state.params)

    # ---- one iteration -----------------------------------------------------------------

    def rollout(self, timer: Timer) -> ScoredRollout:
        cfg = self.cfg
        params = sampling_params(cfg, self.step_count)

        def generate_round(prompts, offset):
            return self.generate_round(prompts, params, offset)

        with timer("gen"):
            if cfg.algorithm.filter_groups.enable:
                fg = cfg.algorithm.filter_groups
                rollout = dynamic_sampling(lambda: next(self.train_data), generate_round, cfg.data.batch_size,
                                           fg.max_num_gen_batches, fg.metric)
            else:
                prompts = next(self.train_data)
                rollout = generate_round(prompts, 0)
                if cfg.algorithm.adv_estimator == "remax":  # greedy baseline per prompt
                    greedy = dataclasses.replace(params, n=1, temperature=0.0)
                    base = self.generate_round(prompts, greedy, 0)
                    baselines = {s.group_id: s.score for s in base.samples}
                    rollout.metrics["critic/reward_baseline/mean"] = float(np.mean(list(baselines.values())))
                    for s in rollout.samples:
                        s.baseline = baselines[s.group_id]
        return rollout

    def generate_round(self, prompts: dict[str, list], params, offset: int) -> ScoredRollout:
        """One round of sampling and scoring: single-turn, or agent episodes when the
        config has an `agent` section."""
        round_fn = make_round_fn(self.sampler, self.rewards, self.tokenizer, self.cfg, self.agent_config,
                                 self.model_rewards)
        return round_fn(prompts, params, offset)

    def make_batch(self, rollout: ScoredRollout, timer: Timer) -> dict[str, np.ndarray]:
        cfg = self.cfg
        samples = rollout.samples
        # group ids -> 0..G-1 (dynamic sampling draws them from several rounds)
        _, group_ids = np.unique([s.group_id for s in samples], return_inverse=True)
        for s, g in zip(samples, group_ids):
            s.group_id = int(g)
        row = cfg.data.max_prompt_length + cfg.rollout.response_length
        batch = build_batch(samples, cfg.data.bucket_size or row, row, pad_id=self.tokenizer.pad_token_id or 0)
        ids, mask = shard_batch({"i": batch["input_ids"], "m": batch["attention_mask"]}, self.mesh).values()
        a, alg = cfg.actor, cfg.algorithm
        with timer("old_log_prob"):
            if a.use_rollout_log_probs or alg.rollout_correction.bypass_mode:
                batch["old_log_probs"] = batch["rollout_log_probs"].copy()
            else:
                batch["old_log_probs"] = np.asarray(self.log_probs(self.actor.state.params, ids, mask))
        if (a.use_kl_loss and a.kl_loss_type != FULL_KL) or (alg.use_kl_in_reward and alg.kl_penalty != FULL_KL):
            with timer("ref"):
                batch["ref_log_probs"] = np.asarray(self.log_probs(self.reference, ids, mask))
        if self.full_kl is not None:
            with timer("ref"):
                batch["full_kl"] = np.asarray(self.full_kl(self.actor.state.params, self.reference, ids, mask))
        if self.critic is not None:
            with timer("values"):
                batch["values"] = np.asarray(self.values(self.critic.state.params, ids, mask)) * batch["response_mask"]
        with timer("adv"):
            self._advantages(batch, samples, rollout.metrics)
        return batch

    def _advantages(self, batch, samples, metrics) -> None:
        cfg, alg = self.cfg, self.cfg.algorithm
        rewards = batch["token_level_scores"]
        if alg.use_kl_in_reward:
            kld = batch["full_kl"] if alg.kl_penalty == FULL_KL else kl_penalty(
                batch["old_log_probs"], batch["ref_log_probs"], alg.kl_penalty)
            rewards, kl_metrics = apply_kl_to_rewards(rewards, kld, batch["response_mask"], self.kl_ctrl.value)
            kl_metrics = {k: float(v) for k, v in kl_metrics.items()}
            self.kl_ctrl = self.kl_ctrl.update(kl_metrics["actor/reward_kl_penalty"], cfg.data.batch_size)
            metrics.update(kl_metrics)
        batch["token_level_rewards"] = np.asarray(rewards, np.float32)
        if self.rollout_correction is not None:
            # after the KL penalty, before the advantages, as verl's trainer: rejected tokens leave
            # response_mask (every later use: advantages, actor and critic losses, their denominators)
            weights, kept, corr_metrics = self.rollout_correction(
                batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"])
            batch["response_mask"] = np.asarray(kept, np.float32)
            if weights is not None:
                batch["rollout_is_weights"] = np.asarray(weights, np.float32)
            metrics.update({k: float(v) for k, v in corr_metrics.items()})
        baselines = np.asarray([s.baseline for s in samples], np.float32)
        advantages, returns = self.advantage_fn(
            token_level_rewards=batch["token_level_rewards"], response_mask=batch["response_mask"],
            values=batch.get("values"), index=batch["group_ids"], reward_baselines=baselines,
            gamma=alg.gamma, lam=alg.lam, norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo)
        batch["advantages"] = np.asarray(advantages, np.float32)
        batch["returns"] = np.asarray(returns, np.float32)

    def step(self) -> dict[str, float]:
        timer = Timer()
        start = time.perf_counter()
        with timer("step"):
            rollout = self.rollout(timer)
            batch = self.make_batch(rollout, timer)
            metrics = dict(rollout.metrics)
            # mini-batch order: a function of (seed, step), so a resumed run shuffles as the original
            rng = np.random.default_rng([self.cfg.trainer.seed, self.step_count])
            if self.critic is not None:
                with timer("update_critic"):
                    metrics.update(self.critic.update(batch, self.mesh, rng))
            with timer("update_actor"):
                metrics.update(self.actor.update(batch, self.mesh, rng, self.reference))
            # updates skipped as non-finite keep the old weights; too many in a row stop the run
            attempted = self.actor.epochs * -(-batch["input_ids"].shape[0] // self.actor.mini_batch_rows)
            skipped = self.skips.check_total(self.step_count + 1, int(jax.device_get(self.actor.state.skipped_steps)),
                                             attempted, metrics)
            with timer("update_weights"):
                if skipped < attempted:  # the sampler never runs on non-finite weights
                    self.skips.check_params(self.step_count + 1, self.actor.state.params,
                                            "the sampler keeps the previous weights", "actor parameters")
                self.sampler.update_params(self.actor.state.params)
        self.step_count += 1
        metrics.update(batch_metrics(batch, rollout.samples))
        diff = np.abs(batch["rollout_log_probs"] - batch["old_log_probs"])[batch["response_mask"] > 0]
        metrics["training/rollout_probs_diff_max"] = float(diff.max()) if diff.size else 0.0
        metrics["training/rollout_probs_diff_mean"] = float(diff.mean()) if diff.size else 0.0
        metrics.update(timer.seconds)
        tokens = float(batch["attention_mask"].sum())
        elapsed = time.perf_counter() - start
        metrics["perf/total_num_tokens"] = tokens
        metrics["perf/throughput"] = tokens / elapsed / jax.device_count()
        if self.flops_peak:
            seq = batch["input_ids"].shape[1]
            flops = tokens * self.actor_flops_per_token(seq) * self.cfg.actor.ppo_epochs
            metrics["perf/mfu"] = flops / metrics["timing_s/update_actor"] / self.flops_peak
        return metrics

    def actor_flops_per_token(self, seq_len: int) -> float:
        return nnx.merge(self.actor.graphdef, self.actor.state.params).config.flops_per_token(seq_len)

    # ---- validation, checkpoints, the run ----------------------------------------------

    def validate(self) -> dict[str, float]:
        """`rljax.rl.evaluate.validate` with the current policy."""
        return validate(self.cfg, self.tokenizer, self.generate_round, self.val_log_probs, self.actor.state.params,
                        self.mesh)

    def save(self) -> None:
        state: dict[str, Any] = {"actor": self.actor.state}
        if self.critic is not None:
            state["critic"] = self.critic.state
        meta = {"step": self.step_count, "kl_coef": float(self.kl_ctrl.value), "config": config_to_dict(self.cfg)}
        self.checkpointer.save(self.step_count, state, self.train_data.get_state(), meta)

    def _maybe_resume(self) -> int:
        target: dict[str, Any] = {"actor": abstract_like(self.actor.state)}
        if self.critic is not None:
            target["critic"] = abstract_like(self.critic.state)
        found = resume(self.cfg.trainer.resume_mode, self.checkpointer, target, self.cfg.trainer.resume_fallback)
        step = 0 if found is None else found.step
        self.tracker.start_at(step)  # metrics an earlier attempt logged after the checkpoint are dropped
        if found is None:
            return 0
        self.actor.state = found.state["actor"]
        if self.critic is not None:
            self.critic.state = found.state["critic"]
        self.kl_ctrl = dataclasses.replace(self.kl_ctrl, value=found.meta["kl_coef"])
        self.train_data.set_state(found.data_state)
        if jax.process_index() == 0:
            print(f"resumed from {found.path}", flush=True)
        return int(step)

    def fit(self) -> list[dict[str, float]]:
        cfg = self.cfg.trainer
        history = []
        error = None
        try:
            if self.step_count == 0 and self.cfg.data.val_files:
                val = self.validate()
                self.tracker.log(0, val)
                history.append({"step": 0, **val})
            while self.step_count < cfg.total_steps:
                self._at = self.step_count + 1  # the step a stop message names
                metrics = self.step()
                step = self.step_count
                if self.cfg.data.val_files and (step == cfg.total_steps or (cfg.test_freq and step % cfg.test_freq == 0)):
                    start = time.perf_counter()
                    metrics.update(self.validate())
                    metrics["timing_s/testing"] = time.perf_counter() - start
                self.tracker.log(step, metrics)
                history.append({"step": step, **metrics})
                if step == cfg.total_steps or (cfg.save_freq and step % cfg.save_freq == 0):
                    self.save()
        except BaseException as e:  # Ctrl-C included: the save in flight is finished, one line says where we are
            error = e
            raise
        finally:
            self.close(error)
        return history

    def close(self, error: BaseException | None = None) -> None:
        """Finish the save in flight and release the sampler, reward workers and model
        rewards; every one is closed even if another fails. `error`: what ended the run
        (see `rljax.checkpoint.close_after`)."""
        closers = [lambda: close_after(self.checkpointer, error, getattr(self, "_at", self.step_count)),
                   self.tracker.close, self.sampler.close, self.rewards.close]
        if self.model_rewards is not None:
            closers.append(self.model_rewards.close)
        first = None
        for close in closers:
            try:
                close()
            except BaseException as e:  # noqa: PERF203
                first = first or e
        if first is not None and error is None:
            raise first


def train_rl(cfg: RLConfig) -> list[dict[str, float]]:
    """Run (or resume) an RL run under its mesh (so activation layouts are pinned)."""
    with jax.set_mesh(make_mesh(cfg.mesh)):
        return RLTrainer(cfg).fit()
