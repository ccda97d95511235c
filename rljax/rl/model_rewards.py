"""Model-based rewards on top of the rule-based ones (config `reward.reward_model`,
`reward.verifier`): a trained reward model and a generative verifier.

Per sample, in order:

    rule    the RewardManager's score (registry by data_source, or the custom function);
            0 where no rule applies (a data_source with no registered function)
    RM      `ScalarHeadScorer` on the exact `prompt_ids + response_ids` (re-rendered
            through the RM's own chat template only when its vocabulary differs)
    judge   `GenerativeVerifier` with greedy decoding in rljax's sampler

and each model score is combined into the running score by its section's `combine`:
``replace`` -> ``weight * model``, ``add`` -> ``running + weight * model``. The result is
the sample's score (then `reward.overlong_buffer`, if enabled), placed on its last
response token like any rule score. Per-sample extras ``reward_model_score``,
``verifier_score`` and ``verifier_output`` go to the rollout records; metrics
``reward_model/score/{mean,max,min}``, ``verifier/parse_failures``,
``verifier/score/mean``.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from rljax.config import ConfigError
from rljax.rewards.registry import has_reward_fn
from rljax.rewards.result import RewardResult, collect_extras
from rljax.rewards.verifier import DEFAULT_TEMPLATE, GenerativeVerifier, parse_score, parse_yes_no
from rljax.rl.config import RLConfig

logger = logging.getLogger("rljax.rewards")

PARSERS = {"yes_no": parse_yes_no, "score": parse_score}


def combine(running: np.ndarray, model: np.ndarray, mode: str, weight: float) -> np.ndarray:
    """`replace`: ``weight * model``; `add`: ``running + weight * model``."""
    if mode == "replace":
        return (weight * model).astype(np.float32)
    if mode == "add":
        return (running + weight * model).astype(np.float32)
    raise ValueError(f"combine must be 'replace' or 'add', got {mode!r}")


def sampler_generate_fn(sampler, max_tokens: int) -> Callable[[list[list[int]]], list[list[int]]]:
    """Greedy `generate_fn` for `GenerativeVerifier` over an rljax `Sampler`. A prompt
    that leaves no room for `max_tokens` in the sampler's `max_model_len` is not sent:
    its (empty) verdict is unparseable and scores the failure score."""
    from rljax.rollout.params import SamplingParams

    params = SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens)
    limit = sampler.config.max_model_len - max_tokens

    def generate(prompts: list[list[int]]) -> list[list[int]]:
        fits = [i for i, p in enumerate(prompts) if 0 < len(p) <= limit]
        if len(fits) < len(prompts):
            logger.warning("verifier: %d of %d grading prompts exceed %d tokens (reward.verifier.max_model_len - "
                           "max_tokens); they score the failure score", len(prompts) - len(fits), len(prompts), limit)
        out: list[list[int]] = [[] for _ in prompts]
        for c in sampler.generate([prompts[i] for i in fits], params) if fits else []:
            out[fits[int(c.request_index)]] = list(c.token_ids)
        return out

    return generate


class ModelRewards:
    """Rule scores, then the reward model's and the verifier's (see the module docstring).

    `scorer`: a `RewardModelScorer` (token ids in, float32 scores out); `rm_reuses_ids`:
    score the policy's token ids as they are (same vocabulary), else re-render each
    sample's chat (`raw_prompt` + the decoded response) with `scorer.score_messages`.
    `verifier`: a `GenerativeVerifier`; `before_verify` runs before each verification
    rollout (the self-verifier loads the current policy weights there)."""

    def __init__(
        self,
        *,
        scorer=None,
        rm_combine: str = "replace",
        rm_weight: float = 1.0,
        rm_reuses_ids: bool = True,
        verifier: GenerativeVerifier | None = None,
        verifier_combine: str = "replace",
        verifier_weight: float = 1.0,
        before_verify: Callable[[], None] | None = None,
        closers: Sequence[Callable[[], None]] = (),
    ):
        self.scorer = scorer
        self.rm_combine, self.rm_weight, self.rm_reuses_ids = rm_combine, float(rm_weight), rm_reuses_ids
        self.verifier = verifier
        self.verifier_combine, self.verifier_weight = verifier_combine, float(verifier_weight)
        self.before_verify = before_verify
        self._closers = list(closers)

    def rule_scores(self, reward_manager, items: Sequence[Mapping[str, Any]]) -> RewardResult:
        """The manager's scores of the items a rule applies to; 0 (and no extras) elsewhere."""
        if getattr(reward_manager, "uses_registry", False):
            # a data source with no rule scores 0 here: `has_reward_fn` says so once, loudly
            applies = [i for i, item in enumerate(items) if has_reward_fn(item["data_source"])]
        else:
            applies = list(range(len(items)))
        if len(applies) == len(items):
            return reward_manager.score(items)
        scores = np.zeros(len(items), np.float32)
        per_sample: list[dict[str, Any] | None] = [None] * len(items)
        metrics: dict[str, float] = {}
        errors: dict[int, str] = {}
        if applies:
            sub = reward_manager.score([items[i] for i in applies])
            scores[applies] = sub.scores
            for k, i in enumerate(applies):
                per_sample[i] = {key: values[k] for key, values in sub.extras.items()}
            metrics = dict(sub.metrics)
            errors = {applies[k]: message for k, message in sub.errors.items()}
        return RewardResult(scores, collect_extras(per_sample, len(items)), metrics, errors)

    def reward_model_scores(self, items, samples, raw_prompts) -> np.ndarray:
        if self.rm_reuses_ids:
            return np.asarray(self.scorer.score([list(s.prompt_ids) + list(s.response_ids) for s in samples]),
                              np.float32)
        if raw_prompts is None:
            raise ValueError("reward model with its own tokenizer: the batch has no raw_prompt to re-render")
        chats = [list(raw) + [{"role": "assistant", "content": item["solution_str"]}]
                 for raw, item in zip(raw_prompts, items)]
        return np.asarray(self.scorer.score_messages(chats), np.float32)

    def score(self, reward_manager, items: Sequence[Mapping[str, Any]], samples: Sequence[Any],
              raw_prompts: Sequence[Any] | None = None) -> RewardResult:
        """`items` (RewardManager items), `samples` (their token ids) and `raw_prompts`
        (chat messages of each item's prompt) -> the combined `RewardResult`."""
        rule = self.rule_scores(reward_manager, items)
        scores = np.asarray(rule.scores, np.float32)
        extras, metrics, errors = dict(rule.extras), dict(rule.metrics), dict(rule.errors)
        if self.scorer is not None:
            rm = self.reward_model_scores(items, samples, raw_prompts)
            extras["reward_model_score"] = [float(v) for v in rm]
            if rm.size:
                metrics.update({"reward_model/score/mean": float(rm.mean()), "reward_model/score/max": float(rm.max()),
                                "reward_model/score/min": float(rm.min())})
            scores = combine(scores, rm, self.rm_combine, self.rm_weight)
        if self.verifier is not None:
            if self.before_verify is not None:
                self.before_verify()
            graded = [dict(item) if raw_prompts is None else {**item, "prompt": raw}
                      for item, raw in zip(items, raw_prompts if raw_prompts is not None else [None] * len(items))]
            verdict = self.verifier(graded)
            extras["verifier_score"] = [float(v) for v in verdict.scores]
            extras["verifier_output"] = list(verdict.extras["verifier_output"])
            metrics.update(verdict.metrics)
            for i, message in verdict.errors.items():
                errors.setdefault(i, f"verifier: {message}")
            scores = combine(scores, np.asarray(verdict.scores, np.float32), self.verifier_combine,
                             self.verifier_weight)
        return RewardResult(scores, extras, metrics, errors)

    def close(self) -> None:
        for close in self._closers:
            close()
        self._closers = []


# ---- from the config ---------------------------------------------------------------------


def _checked_dir(key: str, path: str) -> str:
    if not path:
        raise ConfigError(f"{key}: required when enabled (an HF folder)")
    if not os.path.isdir(path):
        raise ConfigError(f"{key}={path!r}: no such directory")
    if not os.path.exists(os.path.join(path, "config.json")):
        raise ConfigError(f"{key}={path!r}: no config.json in it (expected an HF model folder)")
    return path


def _own_tokenizer(path: str):
    """The folder's tokenizer if it has one (`save_hf(..., tokenizer=)` writes it), else None."""
    if not any(os.path.exists(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from rljax.data.tokenizer import load_hf_tokenizer

    return load_hf_tokenizer(path)


def _same_vocab(a, b) -> bool:
    return a is b or a.get_vocab() == b.get_vocab()


def _load(key: str, path: str, loader: Callable[[], Any]):
    from rljax.models.config import UnsupportedModelError
    from rljax.models.hf import CheckpointMismatchError

    try:
        return loader()
    except (CheckpointMismatchError, UnsupportedModelError, FileNotFoundError) as e:
        raise ConfigError(f"{key}={path!r}: {e}") from e


def build_model_rewards(cfg: RLConfig, tokenizer, policy=None, policy_params: Callable[[], Any] | None = None,
                        mesh=None) -> ModelRewards | None:
    """`ModelRewards` from `cfg.reward.{reward_model,verifier}`, or None when neither is
    enabled (the RL loop then scores with the RewardManager alone). `policy` (a Decoder)
    and `policy_params` (the current weights) serve `verifier.path: policy`."""
    rm_cfg, v_cfg = cfg.reward.reward_model, cfg.reward.verifier
    if not (rm_cfg.enable or v_cfg.enable):
        return None
    kwargs: dict[str, Any] = {}
    closers: list[Callable[[], None]] = []
    if rm_cfg.enable:
        from rljax.models.hf import load_hf_reward_model
        from rljax.rewards.reward_model import ScalarHeadScorer

        key = "reward.reward_model.path"
        path = _checked_dir(key, rm_cfg.path)
        if rm_cfg.batch_size < 1:
            raise ConfigError(f"reward.reward_model.batch_size: must be >= 1, got {rm_cfg.batch_size}")
        model = _load(key, path, lambda: load_hf_reward_model(path, rm_cfg.dtype, mesh=mesh))
        rm_tokenizer = _own_tokenizer(path) or tokenizer
        reuses_ids = _same_vocab(rm_tokenizer, tokenizer)
        vocab = model.backbone.config.vocab_size
        if reuses_ids and len(tokenizer) > vocab:
            raise ConfigError(f"{key}={path!r}: the reward model's vocab_size {vocab} is smaller than the "
                              f"policy tokenizer's {len(tokenizer)} tokens")
        kwargs.update(scorer=ScalarHeadScorer(model, rm_tokenizer, batch_size=rm_cfg.batch_size),
                      rm_combine=rm_cfg.combine, rm_weight=rm_cfg.weight, rm_reuses_ids=reuses_ids)
    if v_cfg.enable:
        from rljax.rollout.sampler import Sampler

        key = "reward.verifier.path"
        if v_cfg.max_tokens < 1:
            raise ConfigError(f"reward.verifier.max_tokens: must be >= 1, got {v_cfg.max_tokens}")
        before = None
        if v_cfg.path == "policy":
            if policy is None or policy_params is None:
                raise ConfigError(f"{key}=policy: needs the policy (build_model_rewards(policy=, policy_params=))")
            model, v_tokenizer = policy, tokenizer
        else:
            from rljax.models.hf import load_hf, load_hf_sharded

            path = _checked_dir(key, v_cfg.path)
            model = _load(key, path, lambda: load_hf_sharded(path, mesh, v_cfg.dtype) if mesh is not None
                          else load_hf(path, v_cfg.dtype))
            v_tokenizer = _own_tokenizer(path) or tokenizer
        sampler = Sampler(model, cfg.verifier_sampler_config())
        closers.append(sampler.close)
        if v_cfg.path == "policy":
            def before():
                sampler.update_params(policy_params())
        verifier = GenerativeVerifier(
            sampler_generate_fn(sampler, v_cfg.max_tokens), v_tokenizer, v_cfg.prompt_template or DEFAULT_TEMPLATE,
            PARSERS[v_cfg.parse], system_prompt=v_cfg.system_prompt or None, failure_score=v_cfg.failure_score)
        kwargs.update(verifier=verifier, verifier_combine=v_cfg.combine, verifier_weight=v_cfg.weight,
                      before_verify=before)
    return ModelRewards(closers=closers, **kwargs)
