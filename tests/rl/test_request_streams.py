"""Sampling noise is per request: a key per (seed, stream, sample index, absolute
position). An agent episode keeps one stream for all its turns and never reuses a key
(before, each turn restarted its step counter at 0 and redrew turn 1's noise); the RL
loop numbers its requests by (step, prompt), so streams are unique within a run."""

from __future__ import annotations

import asyncio

import jax
import numpy as np
import pytest

from rljax.agent import AgentConfig, Episode, run_episodes
from rljax.agent import Environment, EnvStep
from rljax.agent.rollout_adapter import RolloutSamplerAdapter
from rljax.data.tokenizer import build_char_tokenizer
from rljax.rl.config import RLConfig
from rljax.rl.request_streams import TRAIN, VALIDATION, request_stream
from rljax.rollout import KVCacheConfig, Sampler, SamplerConfig
from rljax.rollout.params import SamplingParams
from rljax.rollout.sampling import row_keys
from rljax.train.run_config import ModelRunConfig
from rljax.train.setup import build_decoder
from tests.tiny_models import tiny_qwen2_hf


class ThreeTurns(Environment):
    """Answers any assistant turn with a user turn, and ends after the third."""

    def __init__(self):
        self.turns = 0

    async def reset(self):
        return [{"role": "user", "content": "1+1="}]

    async def step(self, text):
        self.turns += 1
        return EnvStep([{"role": "user", "content": "again"}], 0.0, self.turns >= 3)

    async def close(self):
        pass


@pytest.fixture(scope="module")
def tiny():
    tok = build_char_tokenizer()
    section = ModelRunConfig(tokenizer="char", hf_config=tiny_qwen2_hf())
    decoder = build_decoder(section, tok)
    config = SamplerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=256,
                           kv_cache=KVCacheConfig(page_size=8, num_pages=128))
    with Sampler(decoder, config) as sampler:
        yield tok, sampler


def test_request_streams_are_unique_and_in_range():
    assert request_stream(TRAIN, 0, 5) != request_stream(TRAIN, 1, 5) != request_stream(VALIDATION, 0, 5)
    assert request_stream(TRAIN, 2**31 - 1, 2**32 - 1) < 2**63 <= request_stream(VALIDATION, 0, 0) < 2**64
    with pytest.raises(ValueError, match="out of range"):
        request_stream(TRAIN, 0, 2**32)
    cfg = RLConfig()
    assert cfg.sampling_params(3).stream == request_stream(TRAIN, 3, 0)
    assert cfg.sampling_params(3, validation=True).stream == cfg.sampling_params(9, validation=True).stream


@pytest.mark.slow
def test_three_turn_episode_never_reuses_a_key(tiny):
    tok, sampler = tiny
    used = []  # (seed, stream, sample index, absolute position) of every kept token
    scheduler = sampler.engine.scheduler
    append = scheduler._append

    def spy(seq, token, log_prob):
        used.append((seq.request.seed, seq.request.params.stream, max(seq.sample_index, 0), len(seq.tokens)))
        return append(seq, token, log_prob)

    scheduler._append = spy
    try:
        # half the vocabulary ends a turn, so turns are short and end with "stop" (a turn
        # ending by length would end the episode)
        stops = tuple(range(0, len(tok), 2))
        params = SamplingParams(temperature=1.0, seed=3, stream=request_stream(TRAIN, 4, 17), stop_token_ids=stops)
        episodes = [Episode(environment=ThreeTurns(), sampling_params=params)]
        config = AgentConfig(max_turns=3, max_tokens_per_turn=32, max_response_tokens=200)
        (traj,) = asyncio.run(run_episodes(RolloutSamplerAdapter(sampler), episodes, tok, config))
    finally:
        scheduler._append = append
    assert traj.num_turns == 3
    assert len(used) == sum(traj.response_mask)  # every sampled token was seen
    keys = np.asarray(jax.random.key_data(row_keys(
        np.asarray([u[0] for u in used], np.uint32),
        np.asarray([divmod(u[1], 2**32) for u in used], np.uint32),
        np.asarray([u[2] for u in used], np.int32), np.asarray([u[3] for u in used], np.int32))))
    assert len({tuple(k) for k in keys}) == len(used), "an agent episode reused a sampling key"
