"""Multi-turn agent rollouts for the RL loop (when the config has an `agent:` section).

Each prompt becomes `rollout.n` episodes of `rljax.agent` (tools or an environment),
run concurrently against the sampler's async API so they share its continuous batching.
A trajectory keeps the exact sampled tokens (mask 1, with their log-probs) and the
observation tokens (mask 0); its score is the task reward of the final assistant message
(the configured reward sources, `rljax.rewards.sources`, as single-turn) plus the tool /
environment rewards of the episode.
With routing replay (`actor.router_replay`, MoE) its sample also carries `expert_ids`
`[P + R, L, k]`, like a single-turn sample's, stitched from its turns' records
(`rljax.agent.trajectory.stitch_routing`).

How the `agent:` section meets the rest of the RL config:

- ``agent.tool_config_path``: a relative path is looked up in the working directory, then
  in the source tree (next to ``configs/``), so ``rljax train path/to/rljax/configs/...``
  works from any directory.
- The response budget of an episode (sampled + observation tokens) is
  ``min(agent.max_response_tokens, rollout.response_length)``: a trajectory always fits
  the training row ``data.max_prompt_length + rollout.response_length``.
- The agent renders its own prompt (with the tools' schemas in the chat template); a prompt
  longer than ``data.max_prompt_length`` is an error naming the lengths (raise it: tool
  schemas make prompts longer than the single-turn ones).
- A turn ends on the chat template's end-of-turn token (passed to the sampler as a stop
  token, whatever the model config's EOS is).
- A data row that carries a ``tools`` column different from the agent's tools (key order
  included: templates render schemas as JSON) gets a warning: the model is prompted with
  the agent's tools, not the row's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from rljax.agent import AgentConfig, AgentLoop, Episode, RolloutSamplerAdapter, collect_metrics
from rljax.agent.tools.registry import load_tools
from rljax.config import load_section
from rljax.rewards.sources import RewardBatch, RewardSources
from rljax.rl.batch import Sample
from rljax.rl.reward_config import OverlongBufferConfig
from rljax.rl.scoring import ScoredRollout, assign_scores
from rljax.rollout.params import SamplingParams

TRUNCATED = ("max_response_tokens", "max_tokens_per_turn", "length", "overflow")
_SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def resolve_tool_config_path(path: str) -> str:
    """An existing file for `path`: as given (absolute or relative to the working
    directory), else relative to the rljax source tree; `FileNotFoundError` otherwise."""
    candidates = [path] if os.path.isabs(path) else [path, os.path.join(_SOURCE_ROOT, path)]
    for candidate in candidates:
        if os.path.isfile(candidate):
            return os.path.abspath(candidate)
    raise FileNotFoundError(f"agent.tool_config_path: no file {path!r} (looked at {candidates})")


def agent_config(section: AgentConfig | Mapping[str, Any]) -> AgentConfig:
    """The RL config's `agent:` section (or a YAML mapping of it, `rljax.bench.agent`) with
    its tool config path resolved."""
    cfg = section if isinstance(section, AgentConfig) else load_section(AgentConfig, section, "agent")
    if cfg.tool_config_path:
        cfg = dataclasses.replace(cfg, tool_config_path=resolve_tool_config_path(cfg.tool_config_path))
    return cfg


def final_answer(messages: list[dict[str, Any]]) -> str:
    """The content of the last assistant message (what the task reward grades)."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            return str(message.get("content") or "")
    return ""


def _check_row_tools(prompts: dict[str, list], schemas: list[dict]) -> None:
    # compared as JSON text: key order matters, chat templates render schemas with `tojson`
    rendered = json.dumps(schemas)
    for tools in prompts.get("tools") or []:
        if tools and schemas and json.dumps(list(tools)) != rendered:
            names = [t.get("function", t).get("name") for t in tools]
            warnings.warn(
                f"an RL data row declares tools {names} that differ from the agent's tools "
                f"{[s['function']['name'] for s in schemas]} (agent.tool_config_path); episodes are "
                "prompted with the agent's tools", stacklevel=3)
            return


def agent_generate_and_score(sampler, rewards: RewardSources, tokenizer, prompts: dict[str, list],
                             params: SamplingParams, config: AgentConfig, group_offset: int = 0,
                             overlong_buffer: OverlongBufferConfig | None = None, defer: bool = False) -> ScoredRollout:
    """`params.n` agent episodes per prompt, scored by `rewards`; group ids start at
    `group_offset`. The rule or custom function grades the final answer; a reward model
    scores the whole trajectory's tokens (prompt, sampled turns and observations, exactly
    as trained on) and a verifier grades the final answer with the conversation before it.

    `params.max_tokens` (the rollout's response length) caps each episode's response budget;
    with `overlong_buffer` enabled, DAPO's overlong shaping penalises an episode whose whole
    response (sampled turns and observations) reaches into the last `len` tokens of it.
    """
    config = dataclasses.replace(config, max_response_tokens=min(config.max_response_tokens, params.max_tokens))
    tools = load_tools(config.tool_config_path) if config.tool_config_path else None
    loop = AgentLoop(RolloutSamplerAdapter(sampler), tokenizer, config, tools=tools)
    _check_row_tools(prompts, [t.schema for t in loop.tools.values()])
    stop = tuple(sorted(loop.tool_formatter.turn_end_ids))
    episodes = []
    for i, messages in enumerate(prompts["raw_prompt"]):
        for k in range(params.n):
            # one random stream per episode, kept for all its turns (later turns sample at
            # later positions, so they continue the stream; `rljax.rollout.sampling`)
            stream = params.stream + (group_offset + i) * params.n + k
            episodes.append(Episode(
                messages=list(messages), group_id=group_offset + i,
                sampling_params=SamplingParams(
                    n=1, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
                    min_p=params.min_p, seed=params.seed, stream=stream,
                    stop_token_ids=tuple(params.stop_token_ids) + stop),
                metadata={"index": i},
            ))
    trajectories = asyncio.run(loop.run(episodes))

    max_model_len = getattr(getattr(sampler, "config", None), "max_model_len", None)
    if max_model_len is not None:
        limit = max_model_len - params.max_tokens  # = data.max_prompt_length in the trainer
        longest = max(len(t.prompt_ids) for t in trajectories)
        if longest > limit:
            raise ValueError(
                f"an agent prompt has {longest} tokens (with the tools' schemas rendered by the chat "
                f"template) > data.max_prompt_length={limit}; raise data.max_prompt_length")

    items = []
    for t in trajectories:
        i = t.metadata["index"]
        items.append({"data_source": prompts["data_source"][i], "solution_str": final_answer(t.messages),
                      "ground_truth": prompts["ground_truth"][i], "extra_info": prompts["extra_info"][i],
                      "uid": int(t.group_id)})
    conversations = [t.messages[:-1] if t.messages and t.messages[-1].get("role") == "assistant" else t.messages
                     for t in trajectories]
    batch = RewardBatch(items, [list(t.prompt_ids) + list(t.response_ids) for t in trajectories], conversations)
    samples = [Sample(prompt_ids=list(t.prompt_ids), response_ids=list(t.response_ids),
                      response_mask=list(t.response_mask), response_log_probs=list(t.rollout_log_probs),
                      group_id=int(t.group_id), truncated=t.termination in TRUNCATED, expert_ids=t.expert_ids)
               for t in trajectories]
    records = [{"data_source": item["data_source"], "prompt_index": int(t.group_id),
                "solution_str": item["solution_str"], "num_turns": float(t.num_turns),
                "tool_calls": float(t.tool_calls), "tool_use": float(t.tool_calls > 0)}
               for t, item in zip(trajectories, items)]
    rollout = ScoredRollout(samples, collect_metrics(trajectories), records)
    assign_scores(rollout, batch, rewards.score(batch), np.asarray([float(t.reward) for t in trajectories]),
                  config.max_response_tokens, overlong_buffer, defer)
    metrics = rollout.metrics
    metrics["agent/tool_use_rate"] = float(np.mean([t.tool_calls > 0 for t in trajectories]))
    return rollout
