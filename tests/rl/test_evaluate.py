"""`rljax eval` and validation: reference-answer perplexity against a hand computation
from the model's logits, and `rljax eval --checkpoint` reproducing the trainer's own
validation of that checkpoint."""

import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from rljax.cli import main
from rljax.rl.evaluate import reference_nll, reference_samples
from rljax.rl.forwards import make_log_prob_fn
from rljax.rl.trainer import RLTrainer

from .test_rl_train import make_config

pytestmark = pytest.mark.slow

VAL = 'data.val_files=["synthetic:arithmetic/rl?n=12&seed=5&digits=1"]'


def test_reference_perplexity_matches_a_hand_computation(tmp_path):
    cfg = make_config(tmp_path, "trainer.total_steps=1", VAL)
    trainer = RLTrainer(cfg)
    try:
        tok = trainer.tokenizer
        prompts = {"prompt_ids": [tok.encode("<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n"),
                                  tok.encode("<|im_start|>user\n9+9=<|im_end|>\n<|im_start|>assistant\n")],
                   "ground_truth": ["7", "18"], "extra_info": [{}, {"answer": "18!"}]}
        samples = reference_samples(prompts, tok, max_tokens=8)
        assert samples[0].response_ids == tok.encode("7") + [tok.eos_token_id]
        assert samples[1].response_ids == tok.encode("18!") + [tok.eos_token_id]  # extra_info answer wins
        params = trainer.actor.state.params
        nll, count = reference_nll(make_log_prob_fn(trainer.actor.graphdef, 1.0), params, samples, cfg, 1)
        model = nnx.merge(trainer.actor.graphdef, params)
        for s, got, n in zip(samples, nll, count):
            ids = np.asarray([s.prompt_ids + s.response_ids], np.int32)
            logits = np.asarray(jax.device_get(model(ids, np.ones_like(ids))), np.float64)[0]
            logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
                - logits.max(-1, keepdims=True)
            p = len(s.prompt_ids)
            want = -sum(logp[t - 1, ids[0, t]] for t in range(p, ids.shape[1]))
            assert n == len(s.response_ids)
            np.testing.assert_allclose(got, want, rtol=1e-5)
    finally:
        trainer.close()


def test_eval_of_a_checkpoint_reproduces_the_trainers_validation(tmp_path):
    cfg = make_config(tmp_path, "trainer.total_steps=1", "actor.optim.lr=1e-2", VAL, "trainer.test_freq=1",
                      "rollout.val_kwargs.n=1", "rollout.val_kwargs.temperature=0.0")
    trainer = RLTrainer(cfg)
    history = trainer.fit()  # validates before and after its step, saves at the end
    final = history[-1]
    run_dir = os.path.join(cfg.trainer.default_local_dir, cfg.trainer.experiment_name)
    out = tmp_path / "eval.json"
    assert main(["eval", os.path.join(run_dir, "config.yaml"), "--checkpoint", run_dir, "--out", str(out),
                 "--work-dir", str(tmp_path / "eval")]) == 0
    metrics = json.loads(out.read_text())
    acc = "val-core/synthetic/arithmetic/reward/mean@1"  # the digit-fraction reward of make_config
    ppl = "val-aux/synthetic/arithmetic/reference/ppl"
    assert metrics[acc] == final[acc]  # greedy: the same responses
    assert "val-core/synthetic/arithmetic/reward/pass@1" in metrics
    assert np.isfinite(metrics[ppl]) and metrics[ppl] > 1.0
    np.testing.assert_allclose(metrics[ppl], final[ppl], rtol=1e-5)  # the trained weights, restored
    assert abs(metrics[ppl] - history[0][ppl]) > 1e-3 * history[0][ppl]  # ... not the initial ones
