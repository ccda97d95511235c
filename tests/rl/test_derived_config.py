"""What an RL run derives from its config, each in one place on `RLConfig`: the row length
and its padding bucket, the sampler's engine settings, the requests' sampling params.
Expected values are written out by hand from the config's documented meaning."""

from __future__ import annotations

import numpy as np
import pytest

from rljax.config import ConfigError, load_config
from rljax.data.tokenizer import build_char_tokenizer
from rljax.rl.config import RLConfig
from rljax.rl.request_streams import TRAIN, VALIDATION, request_stream
from rljax.rl.scoring import ScoredRollout


def rl_config(*overrides: str) -> RLConfig:
    return load_config(RLConfig, None, ["data.max_prompt_length=8", "rollout.response_length=4", *overrides])


def prompts_of(tok, texts: list[str], answers: list[str]) -> dict[str, list]:
    return {"prompt_ids": [tok.encode(t) for t in texts], "ground_truth": answers,
            "extra_info": [{} for _ in texts], "data_source": ["toy"] * len(texts)}


class RecordingLogProbs:
    """Log-prob function stub: -0.5 at every real position; remembers the batch widths."""

    def __init__(self):
        self.shapes = []

    def __call__(self, params, ids, mask):
        self.shapes.append(np.shape(ids))
        return np.where(np.asarray(mask) > 0, -0.5, 0.0)


def test_validation_with_bucket_size_zero_pads_every_batch_to_the_row():
    """`data.bucket_size: 0` pads the reference-answer batch to the row (8 + 4 = 12
    tokens); each answer token costs 0.5 nats under the stub, so nll/token = 0.5."""
    from rljax.rl.evaluate import validate

    cfg = rl_config("data.bucket_size=0")
    tok = build_char_tokenizer()
    prompts = prompts_of(tok, ["1+1=", "2+2="], ["2", "4"])

    def rollout_fn(batch, params, offset):
        return ScoredRollout([], {}, [{"data_source": "toy", "prompt_index": offset + i, "score": 1.0,
                                       "solution_str": a} for i, a in enumerate(batch["ground_truth"])])

    log_probs = RecordingLogProbs()
    metrics = validate(cfg, tok, rollout_fn, log_probs, params=None, batches=[prompts])
    assert log_probs.shapes == [(2, 12)]
    assert metrics["val-aux/toy/reference/nll"] == pytest.approx(0.5)
    assert metrics["val-aux/toy/reference/ppl"] == pytest.approx(np.exp(0.5))


def test_row_bucket_is_the_bucket_size_or_the_row():
    assert (rl_config("data.bucket_size=5").row_length, rl_config("data.bucket_size=5").row_bucket) == (12, 5)
    assert rl_config("data.bucket_size=0").row_bucket == 12


def test_every_consumer_reads_the_one_row_length(monkeypatch, tmp_path):
    """Redefine `RLConfig.row_length` (to 40, not 8 + 4): the sampler, the verifier's
    sampler, the validation batch, the compile command's KV pool and the SFT warm-up all
    follow it, so none computes the row on its own."""
    import rljax.rl.warmup as warmup
    from rljax.rl.evaluate import reference_nll, reference_samples
    from rljax.tpu.programs import default_pages

    monkeypatch.setattr(RLConfig, "row_length", property(lambda self: 40))
    cfg = rl_config("data.bucket_size=0", "rollout.page_size=16", "rollout.max_num_seqs=3")
    assert cfg.row_bucket == 40
    assert cfg.sampler_config().max_model_len == 40
    assert cfg.verifier_sampler_config().max_model_len == 40 + 512
    assert default_pages(cfg) == 3 * 3 + 1  # 3 sequences of ceil(40 / 16) pages, plus the null page

    tok = build_char_tokenizer()
    log_probs = RecordingLogProbs()
    reference_nll(log_probs, None, reference_samples(prompts_of(tok, ["1+1="], ["2"]), tok, 4), cfg, 1)
    assert log_probs.shapes == [(1, 40)]

    seen = []
    monkeypatch.setattr(warmup, "train", seen.append)
    monkeypatch.setattr(warmup, "export_checkpoint", lambda *args: None)
    warm = load_config(RLConfig, None, ["data.max_prompt_length=8", "rollout.response_length=4",
                                        "warmup_sft.enable=true", "warmup_sft.train_files=[x.jsonl]"])
    warmup.run_warmup_sft(warm, str(tmp_path))
    assert seen[0].data.max_length == 40


def test_num_scheduler_steps_is_set_from_the_rollout_section(monkeypatch):
    import rljax.rl.generation as generation

    assert rl_config().sampler_config().num_scheduler_steps == 4  # the engine's default
    cfg = rl_config("rollout.num_scheduler_steps=2")
    assert cfg.sampler_config().num_scheduler_steps == 2
    monkeypatch.setattr(generation, "Sampler", lambda decoder, config: config)
    assert generation.make_sampler(cfg, decoder=None).num_scheduler_steps == 2  # what the run's sampler gets
    with pytest.raises(ConfigError, match=r"^rollout\.num_scheduler_steps: must be >= 1, got 0$"):
        rl_config("rollout.num_scheduler_steps=0")


def test_sampler_config_and_sampling_params_from_the_sections():
    cfg = rl_config("rollout.max_num_seqs=6", "rollout.max_num_batched_tokens=96", "rollout.page_size=8",
                    "rollout.num_pages=30", "rollout.kv_cache_memory_fraction=0.2", "rollout.attention=reference",
                    "rollout.enable_prefix_caching=false", "rollout.seed=7", "rollout.n=3", "rollout.temperature=0.9",
                    "rollout.top_p=0.8", "rollout.top_k=5", "rollout.min_p=0.1", "rollout.val_kwargs.n=2",
                    "rollout.val_kwargs.temperature=0.5", "reward.verifier.max_num_seqs=2",
                    "reward.verifier.num_pages=9", "reward.verifier.max_model_len=50")
    s = cfg.sampler_config()
    assert (s.max_num_seqs, s.max_num_batched_tokens, s.max_model_len, s.attention, s.enable_prefix_caching,
            s.seed, s.record_routing) == (6, 96, 12, "reference", False, 7, False)
    assert (s.kv_cache.page_size, s.kv_cache.num_pages, s.kv_cache.memory_fraction) == (8, 30, 0.2)
    assert rl_config().sampler_config().kv_cache.num_pages is None  # 0: sized by the memory fraction
    v = cfg.verifier_sampler_config()
    assert (v.max_num_seqs, v.max_num_batched_tokens, v.max_model_len, v.kv_cache.page_size, v.kv_cache.num_pages,
            v.kv_cache.memory_fraction, v.seed) == (2, 96, 50, 8, 9, 0.1, 7)
    p = cfg.sampling_params(step=5)
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p, p.max_tokens, p.seed, p.stream) == \
        (3, 0.9, 0.8, 5, 0.1, 4, 7, (5 << 32) | TRAIN)
    assert p.stream == request_stream(TRAIN, 5, 0)
    q = cfg.sampling_params(step=5, validation=True)
    assert (q.n, q.temperature, q.top_p, q.top_k, q.min_p, q.max_tokens, q.seed, q.stream) == \
        (2, 0.5, 1.0, 0, 0.0, 4, 7, 1 << 63)
    assert q.stream == request_stream(VALIDATION, 0, 0)


def test_several_processes_need_rollout_replicas_before_any_work(monkeypatch):
    """A multi-process run cannot sample on the training mesh (tp 0): the run check says
    so, naming the key, before the warm-up or any model is built; tp >= 1 passes."""
    import jax

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"^rollout.tensor_parallel_size: 0 samples on the training mesh"):
        rl_config().check_run(8)
    rl_config("rollout.tensor_parallel_size=1").check_run(8)
