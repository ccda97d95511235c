"""The model reward sources from the config (`reward.reward_model`, `reward.verifier`): a
trained reward model and a generative verifier, as `rljax.rewards.sources` sources with
their `Combine`.

Per sample, after the rule source (the RewardManager's score: registry by data_source, or
the custom function; 0 where no rule applies):

    RM      `RewardModelSource`: `ScalarHeadScorer` on the exact `prompt_ids + response_ids`
            (re-rendered through the RM's own chat template only when its vocabulary differs)
    judge   `VerifierSource`: `GenerativeVerifier` with greedy decoding in rljax's sampler

each combined into the running score by its section's `combine`: ``replace`` ->
``weight * model``, ``add`` -> ``running + weight * model``. The result is the sample's
score (then `reward.overlong_buffer`, if enabled), placed on its last response token like
any rule score. Per-sample extras ``reward_model_score``, ``verifier_score`` and
``verifier_output`` go to the rollout records; metrics ``reward_model/score/{mean,max,min}``,
``verifier/parse_failures``, ``verifier/score/mean``.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

from rljax.config import ConfigError
from rljax.rewards.sources import Combine, RewardModelSource, RewardSource, VerifierSource
from rljax.rewards.verifier import DEFAULT_TEMPLATE, GenerativeVerifier, parse_score, parse_yes_no
from rljax.rl.config import RLConfig

logger = logging.getLogger("rljax.rewards")

PARSERS = {"yes_no": parse_yes_no, "score": parse_score}


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


def _verifier_on_mesh(cfg: RLConfig, policy, policy_params, mesh):
    """One verifier sampler over `mesh` (the training mesh): the policy's, given its current
    weights before each verification (`path: policy`), or the folder's model."""
    from rljax.rollout.sampler import Sampler

    v_cfg = cfg.reward.verifier
    before = None
    if v_cfg.path == "policy":
        model = policy
    else:
        from rljax.models.hf import load_hf, load_hf_sharded

        model = _load("reward.verifier.path", v_cfg.path, lambda: load_hf_sharded(v_cfg.path, mesh, v_cfg.dtype)
                      if mesh is not None else load_hf(v_cfg.path, v_cfg.dtype))
    sampler = Sampler(model, cfg.verifier_sampler_config())
    if v_cfg.path == "policy":
        def before():
            sampler.update_params(policy_params())
    return sampler_generate_fn(sampler, v_cfg.max_tokens), before, [sampler.close]


def _verifier_on_replicas(cfg: RLConfig, replicas):
    """A verifier sampler on each local rollout replica (`rljax.rl.replica_rollout`): on
    the replica's own weights, which every hand-off updates (`path: policy`), or on its copy
    of the folder's model. A batch of grading prompts is cut over the replicas and the
    verdicts gathered from every process (`ReplicatedRollout.generate_everywhere`), so each
    process holds all of them: what lets a run of several processes grade."""
    from rljax.models.hf import load_hf_sharded
    from rljax.rollout.sampler import Sampler

    v_cfg, config = cfg.reward.verifier, cfg.verifier_sampler_config()
    if v_cfg.path == "policy":
        samplers = replicas.on_each_replica(lambda r, mesh: Sampler(replicas.model(r), config))
        replicas.follow(samplers)
    else:
        samplers = replicas.on_each_replica(lambda r, mesh: Sampler(_load(
            "reward.verifier.path", v_cfg.path, lambda: load_hf_sharded(v_cfg.path, mesh, v_cfg.dtype)), config))
    fns = {r: sampler_generate_fn(sampler, v_cfg.max_tokens) for r, sampler in samplers.items()}
    return (lambda prompts: replicas.generate_everywhere(fns, prompts)), None, [s.close for s in samplers.values()]


def build_model_rewards(cfg: RLConfig, tokenizer, policy=None, policy_params: Callable[[], Any] | None = None,
                        mesh=None, replicas=None) -> list[tuple[RewardSource, Combine]]:
    """The reward model's and the verifier's sources from `cfg.reward.{reward_model,verifier}`,
    in that order, with their `Combine`; empty when neither is enabled (the RL loop then
    scores with the rule source alone). `policy` (a Decoder) and `policy_params` (the
    current weights) serve `verifier.path: policy`. With `replicas` (a
    `ReplicatedRollout`), the verifier generates on the rollout replicas; else on `mesh`."""
    rm_cfg, v_cfg = cfg.reward.reward_model, cfg.reward.verifier
    steps: list[tuple[RewardSource, Combine]] = []
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
        steps.append((RewardModelSource(ScalarHeadScorer(model, rm_tokenizer, batch_size=rm_cfg.batch_size),
                                        reuses_ids), Combine(rm_cfg.combine, float(rm_cfg.weight))))
    if v_cfg.enable:
        key = "reward.verifier.path"
        if v_cfg.max_tokens < 1:
            raise ConfigError(f"reward.verifier.max_tokens: must be >= 1, got {v_cfg.max_tokens}")
        if v_cfg.path == "policy":
            if policy is None or policy_params is None:
                raise ConfigError(f"{key}=policy: needs the policy (build_model_rewards(policy=, policy_params=))")
            v_tokenizer = tokenizer
        else:
            path = _checked_dir(key, v_cfg.path)
            v_tokenizer = _own_tokenizer(path) or tokenizer
        if replicas is not None:
            generate, before, closers = _verifier_on_replicas(cfg, replicas)
        else:
            generate, before, closers = _verifier_on_mesh(cfg, policy, policy_params, mesh)
        verifier = GenerativeVerifier(
            generate, v_tokenizer, v_cfg.prompt_template or DEFAULT_TEMPLATE,
            PARSERS[v_cfg.parse], system_prompt=v_cfg.system_prompt or None, failure_score=v_cfg.failure_score)
        steps.append((VerifierSource(verifier, before, closers=closers), Combine(v_cfg.combine, float(v_cfg.weight))))
    return steps
