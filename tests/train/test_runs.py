"""The run scaffold (`rljax.runs`): the run-kind rule every command uses
(`rljax.commands.run_kinds`) and the loaders' refusal of a run of the other kind, the
folder a run writes before any training, resume / save / close, and the decoder's one
log-prob entry point (`Decoder.token_log_probs`) against the pure chunked math it calls."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from rljax.algos.log_probs import log_probs_from_hidden, token_log_probs
from rljax.checkpoint import abstract_like
from rljax.config import ConfigError, load_config
from rljax.models import ModelConfig, init_model
from rljax.commands.run_kinds import RUN_CONFIGS, checkpoint_kind, run_kind
from rljax.runs import Run, saved_config
from rljax.train.run_config import RunConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SFT = os.path.join(ROOT, "configs", "sft_tiny.yaml")


@pytest.mark.parametrize("raw,kind", [
    ({"trainer": {"algorithm": "sft"}}, "supervised"),
    ({"trainer": {"algorithm": "dpo"}, "dpo": {"beta": 0.2}}, "supervised"),
    ({"trainer": {"algorithm": "grpo"}}, "rl"),
    ({"trainer": {"algorithm": "ppo"}, "actor": {}, "critic": {}}, "rl"),
    ({"model": {"tokenizer": "char"}}, "supervised"),  # unset, no RL sections: sft
    ({}, "supervised"),
])
def test_run_kind_from_the_algorithm_or_the_sections(raw, kind):
    assert run_kind(raw) == kind
    assert RUN_CONFIGS[kind].__name__ == ("RLConfig" if kind == "rl" else "RunConfig")


def test_run_kind_refuses_an_unset_algorithm_with_rl_sections_and_unknown_names():
    with pytest.raises(ConfigError, match=r"trainer\.algorithm: not set, and x\.yaml has RL sections "
                                          r"\(actor, rollout\); set it to one of .*grpo"):
        run_kind({"rollout": {"n": 4}, "actor": {}, "model": {}}, "x.yaml")
    with pytest.raises(ConfigError, match=r"unknown 'grpoo'; did you mean 'grpo'"):
        run_kind({"trainer": {"algorithm": "grpoo"}})


@pytest.mark.parametrize("algorithm,kind", [("grpo", "rl"), ("dpo", "supervised")])
def test_each_checkpoint_loader_refuses_a_run_of_the_other_kind(tmp_path, algorithm, kind):
    from rljax.rl.config import RLConfig
    from rljax.rl.policy_checkpoint import load_policy
    from rljax.train.export import load_run_config

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"trainer": {"algorithm": algorithm}}))
    assert checkpoint_kind(str(run_dir)) == kind
    if kind == "rl":
        with pytest.raises(ValueError, match=r"trainer\.algorithm=grpo, not a supervised run; an RL run's policy is "
                                             r"exported by rljax\.rl\.policy_checkpoint\.export_policy"):
            load_run_config(str(run_dir))
    else:
        with pytest.raises(ValueError, match=r"a supervised run's checkpoint, with no RL policy in it"):
            load_policy(RLConfig(), str(run_dir), mesh=None)


def _tiny_cfg(tmp_path, *overrides):
    return load_config(RunConfig, SFT, [f"trainer.default_local_dir={tmp_path}", "trainer.logger=[jsonl]",
                                        "trainer.async_save=false", "trainer.total_steps=10", "trainer.save_freq=4",
                                        "trainer.test_freq=5", *overrides])


def test_run_writes_its_folder_before_training_and_decides_when_to_save_and_validate(tmp_path):
    run = Run(_tiny_cfg(tmp_path))
    try:
        directory = os.path.join(tmp_path, "sft_tiny")
        assert run.directory == directory
        saved = saved_config(directory)
        assert run_kind(saved) == "supervised"
        # synthetic specs are materialised once, under the run, and the saved config names the files
        for split in ("train_files", "val_files"):
            (path,) = saved["data"][split]
            assert path == getattr(run.config.data, split)[0] and path.startswith(os.path.join(directory, "data"))
            assert os.path.exists(path)
        assert os.path.isdir(os.path.join(directory, "tokenizer"))
        assert [s for s in range(1, 11) if run.save_due(s)] == [4, 8, 10]
        assert [s for s in range(1, 11) if run.validation_due(s)] == [5, 10]
    finally:
        run.close(None, 0)
    no_val = Run(_tiny_cfg(tmp_path, "data.val_files=[]", "trainer.experiment_name=no_val"))
    no_val.close(None, 0)
    assert not any(no_val.validation_due(s) for s in range(1, 11))


class _Data:
    def __init__(self):
        self.state = None

    def set_state(self, state):
        self.state = state


def test_resume_restores_state_data_and_meta_and_close_runs_every_closer(tmp_path):
    state = {"w": jnp.arange(4.0)}
    run = Run(_tiny_cfg(tmp_path))
    assert run.resume(abstract_like(state), _Data()) is None
    run.save(4, state, {"position": 7}, kl_coef=0.5)
    closed = []
    run.on_close(lambda: closed.append("first"))

    def failing():
        raise RuntimeError("worker pool would not stop")

    run.on_close(failing)
    run.on_close(lambda: closed.append("last"))
    with pytest.raises(RuntimeError, match="worker pool"):  # every closer runs; the first failure is raised
        run.close(None, 4)
    assert closed == ["first", "last"]

    again, data = Run(_tiny_cfg(tmp_path)), _Data()
    try:
        found = again.resume(abstract_like(state), data)
        assert found.step == 4 and data.state == {"position": 7}
        assert found.meta["kl_coef"] == 0.5 and found.meta["step"] == 4
        assert found.meta["config"]["trainer"]["experiment_name"] == "sft_tiny"
        np.testing.assert_array_equal(found.state["w"], np.arange(4.0))
    finally:
        again.close(None, 4)
    with open(os.path.join(tmp_path, "sft_tiny", "config.yaml")) as f:
        assert yaml.safe_load(f)["trainer"]["total_steps"] == 10


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_decoder_token_log_probs_is_the_chunked_math_bit_for_bit(temperature):
    config = ModelConfig.from_hf_dict({"model_type": "qwen2", "vocab_size": 40, "hidden_size": 32,
                                       "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                       "num_key_value_heads": 2, "tie_word_embeddings": True})
    model = init_model(config, seed=3)
    ids = jax.random.randint(jax.random.key(0), (2, 300), 0, 40)  # more than one 256-position chunk
    mask = jnp.ones_like(ids).at[1, :17].set(0)
    hidden = model.hidden_states(ids, attention_mask=mask)
    want_lp, want_ent = log_probs_from_hidden(hidden, model.unembedding(), ids, temperature=temperature,
                                              compute_entropy=True)
    lp, ent = model.token_log_probs(ids, mask, temperature=temperature, entropy=True)
    np.testing.assert_array_equal(lp, want_lp)
    np.testing.assert_array_equal(ent, want_ent)
    np.testing.assert_array_equal(model.token_log_probs(ids, mask, temperature=temperature),
                                  log_probs_from_hidden(hidden, model.unembedding(), ids, temperature=temperature))
    # and the same numbers as the full-logits path
    np.testing.assert_allclose(lp, token_log_probs(model(ids, mask), ids, temperature), rtol=1e-5, atol=1e-5)
