"""Multi-turn agent rollouts for the RL loop (when the config has an `agent:` section).

Each prompt becomes `rollout.n` episodes of `rljax.agent` (tools or an environment),
run concurrently against the sampler's async API so they share its continuous batching.
A trajectory keeps the exact sampled tokens (mask 1, with their log-probs) and the
observation tokens (mask 0); its score is the task reward of the final assistant message
(`compute_score`, as single-turn) plus the tool / environment rewards of the episode.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from rljax.agent import AgentConfig, Episode, RolloutSamplerAdapter, collect_metrics, run_episodes
from rljax.agent.config import from_dict as agent_config_from_dict
from rljax.rl.batch import Sample
from rljax.rl.rollout import ScoredRollout
from rljax.rollout.params import SamplingParams


def agent_config(raw: dict[str, Any]) -> AgentConfig:
    return agent_config_from_dict(AgentConfig, raw, "agent")


def final_answer(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "assistant":
            return str(message.get("content") or "")
    return ""


def agent_generate_and_score(sampler, reward_manager, tokenizer, prompts: dict[str, list], params: SamplingParams,
                             config: AgentConfig, group_offset: int = 0) -> ScoredRollout:
    episodes = []
    for i, messages in enumerate(prompts["raw_prompt"]):
        for k in range(params.n):
            seed = None if params.seed is None else params.seed * 1009 + (group_offset + i) * params.n + k
            episodes.append(Episode(
                messages=list(messages), group_id=group_offset + i,
                sampling_params=SamplingParams(n=1, temperature=params.temperature, top_p=params.top_p,
                                               top_k=params.top_k, min_p=params.min_p, seed=seed),
                metadata={"index": i},
            ))
    trajectories = asyncio.run(run_episodes(RolloutSamplerAdapter(sampler), episodes, tokenizer, config))
    items = []
    for t in trajectories:
        i = t.metadata["index"]
        items.append({"data_source": prompts["data_source"][i], "solution_str": final_answer(t.messages),
                      "ground_truth": prompts["ground_truth"][i], "extra_info": prompts["extra_info"][i]})
    result = reward_manager.score(items)
    samples, records = [], []
    for t, item, task_score in zip(trajectories, items, np.asarray(result.scores, np.float32)):
        score = float(task_score) + float(t.reward)
        samples.append(Sample(prompt_ids=list(t.prompt_ids), response_ids=list(t.response_ids),
                              response_mask=list(t.response_mask), response_log_probs=list(t.rollout_log_probs),
                              group_id=int(t.group_id), score=score,
                              truncated=t.termination in ("max_response_tokens", "length", "overflow")))
        records.append({"data_source": item["data_source"], "prompt_index": int(t.group_id), "score": score,
                        "solution_str": item["solution_str"], "num_turns": float(t.num_turns),
                        "tool_calls": float(t.tool_calls)})
    metrics = {**result.metrics, **collect_metrics(trajectories)}
    return ScoredRollout(samples, metrics, records)
