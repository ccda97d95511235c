"""LoRA in the supervised trainers: only the adapters train (the base stays bit-identical),
rank and target_modules decide what is trained, SFT learns and exports (merged and PEFT,
against transformers + peft), checkpoints hold only adapters and resume bit-exactly, and
DPO's reference is the policy with its adapters off."""

import dataclasses
import json
import os
import re

import jax
import numpy as np
import peft
import pytest
import torch
from transformers import AutoModelForCausalLM

from rljax.config import load_config
from rljax.data import make_dataset
from rljax.data.synthetic_spec import materialize
from rljax.models import save_hf
from rljax.models.lora import LoRAConfig
from rljax.parallel import make_mesh, shard_local_batch
from rljax.train.export import export_checkpoint
from rljax.train.loop import train
from rljax.train.objectives import sft_objective
from rljax.train.optim import OptimConfig, make_optimizer
from rljax.train.run_config import RunConfig
from rljax.train.setup import build_decoder, init_sharded_train_state, load_tokenizer, place_trainable
from rljax.train.steps import make_train_step

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "configs")
FAST = ["trainer.logger=[jsonl]", "data.batch_size=16", "trainer.async_save=false", "trainer.test_freq=0"]


def config(tmp_path, name, *overrides):
    return load_config(RunConfig, os.path.join(CONFIGS, name), [f"trainer.default_local_dir={tmp_path}", *FAST,
                                                                 *overrides])


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
def test_lora_sft_learns_exports_and_resumes_bit_exactly(tmp_path):
    # a frozen random unembedding of std 0.02 bounds the logits near 0: a wider init leaves the adapters room
    lora = ["model.lora.rank=8", "model.lora.alpha=16", "optim.lr=1e-2", "model.hf_config.initializer_range=0.2"]
    cfg = config(tmp_path, "sft_tiny.yaml", *lora, "trainer.total_steps=16", "trainer.save_freq=8",
                 "trainer.experiment_name=full")
    train(cfg)
    run_dir = os.path.join(str(tmp_path), "full")
    rows = [m for m in metrics(run_dir) if "train/loss" in m]
    print(f"LoRA SFT loss {rows[0]['train/loss']:.3f} -> {rows[-1]['train/loss']:.3f}")
    assert rows[-1]["train/loss"] < 0.8 * rows[0]["train/loss"]

    # the checkpoint holds adapters and their optimizer state only
    with open(os.path.join(run_dir, "checkpoints", "16", "state", "_METADATA")) as f:
        held = f.read()  # orbax's tree metadata: every saved leaf's path
    assert "q_proj_lora_a" in held and not re.search(r"[\"'](embed|q_proj|mlp_norm)[\"']", held)

    # resume from step 8 in a second run: steps 9..16 are bit-identical
    half = config(tmp_path, "sft_tiny.yaml", *lora, "trainer.total_steps=16", "trainer.save_freq=8",
                  "trainer.experiment_name=resumed", f"trainer.resume_mode={run_dir}/checkpoints/8")
    train(half)
    a, b = (metrics(os.path.join(str(tmp_path), n)) for n in ("full", "resumed"))
    after = lambda rows: [m["train/loss"] for m in rows if "train/loss" in m and m["step"] > 8]  # noqa: E731
    assert len(after(b)) == 8 and after(a) == after(b)  # bit-exact: the same float losses, steps 9..16

    ids = np.asarray([[5, 9, 12, 7, 3, 20, 11]], np.int32)
    merged = str(tmp_path / "merged")
    export_checkpoint(run_dir, merged)
    adapter = str(tmp_path / "adapter")
    export_checkpoint(run_dir, adapter, lora_format="peft")
    base_dir = str(tmp_path / "base")  # the run's random base model, as transformers reads it
    with jax.set_mesh(make_mesh(cfg.mesh)):
        plain = build_decoder(dataclasses.replace(cfg.model, lora=LoRAConfig()), load_tokenizer(cfg.model))
    save_hf(plain, base_dir)
    with torch.no_grad():
        full = AutoModelForCausalLM.from_pretrained(merged).eval()(torch.tensor(ids, dtype=torch.long)).logits.numpy()
        peft_model = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), adapter).eval()
        via_peft = peft_model(torch.tensor(ids, dtype=torch.long)).logits.numpy()
        base_logits = AutoModelForCausalLM.from_pretrained(base_dir).eval()(torch.tensor(ids)).logits.numpy()
    assert np.abs(via_peft - base_logits).max() > 1e-2  # training moved the adapters
    np.testing.assert_allclose(full, via_peft, atol=1e-5)

    # the PEFT folder as a run's starting point (model.lora.path): the trained function again
    start = dataclasses.replace(cfg.model, lora=dataclasses.replace(cfg.model.lora, path=adapter))
    with jax.set_mesh(make_mesh(cfg.mesh)):
        ours = np.asarray(build_decoder(start, load_tokenizer(cfg.model))(jax.numpy.asarray(ids)))
    np.testing.assert_allclose(ours, via_peft, atol=1e-5)


@pytest.mark.slow
def test_lora_dpo_reference_is_the_base_model(tmp_path):
    cfg = config(tmp_path, "dpo_tiny.yaml", "model.lora.rank=4", "optim.lr=1e-2", "trainer.total_steps=4",
                 "trainer.save_freq=0")
    train(cfg)
    rows = [m for m in metrics(os.path.join(str(tmp_path), cfg.trainer.experiment_name)) if "rewards/margins" in m]
    assert abs(rows[0]["rewards/margins"]) < 1e-6  # policy == reference (B = 0) at step 1
    assert abs(rows[-1]["rewards/margins"]) > 1e-4  # then the adapters move away from it


@pytest.mark.slow
def test_only_the_configured_adapters_train_the_base_stays_bit_identical_and_8_devices_equal_1(
        tmp_path, rank=2, targets=("v_proj", "down_proj")):
    cfg = config(tmp_path, "sft_tiny.yaml", f"model.lora.rank={rank}", f"model.lora.target_modules=[{','.join(targets)}]",
                 "data.max_length=32", "data.bucket_size=32",
                 "data.train_files=[\"synthetic:arithmetic/sft?n=64&seed=0&digits=2\"]")
    tokenizer = load_tokenizer(cfg.model)
    files = materialize(cfg.data.train_files, str(tmp_path), "train")
    data = make_dataset(dataclasses.replace(cfg.data, train_files=files), tokenizer, "train")
    batches = [next(data) for _ in range(3)]
    results = []
    for devices in (jax.devices(), jax.devices()[:1]):
        mesh = make_mesh(cfg.mesh, devices=devices)
        with jax.set_mesh(mesh):
            graphdef, params, base = place_trainable(build_decoder(cfg.model, tokenizer, mesh=mesh), mesh)
            names = {jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(params)}
            assert names == {f"['layers']['{t}_lora_{w}'].value" for t in targets for w in "ab"}
            assert params["layers"]["v_proj_lora_a"].get_value().shape[-1] == rank
            if len(devices) == 8:  # adapters are split like their base weights: A's embed rows over fsdp
                a = params["layers"]["v_proj_lora_a"].get_value()
                assert a.sharding.spec[1] == "fsdp" and len(a.addressable_shards) == 8
            before = jax.device_get(base)
            optimizer, schedule = make_optimizer(OptimConfig(lr=1e-2, weight_decay=0.0), 3)
            state = init_sharded_train_state(params, optimizer, 0, mesh)
            moments = {jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(state.opt_state)
                       if ".mu[" in jax.tree_util.keystr(k)}
            assert moments == {f"[1][0].mu{n}" for n in names}  # AdamW moments: adapters only
            step = make_train_step(graphdef, sft_objective(), optimizer, schedule)
            losses = []
            for batch in batches:
                state, m = step(state, shard_local_batch(batch, mesh), None, base)
                losses.append(float(m["train/loss"]))
            assert losses[-1] < losses[0]
            jax.tree.map(np.testing.assert_array_equal, jax.device_get(base), before)  # frozen: bit-identical
            trained = jax.device_get(state.params)
            assert all(np.abs(v).max() > 0 for k, v in jax.tree_util.tree_leaves_with_path(trained)
                       if "lora_b" in jax.tree_util.keystr(k))  # every B moved off zero
            results.append((losses, trained))
    (losses8, adapters8), (losses1, adapters1) = results
    np.testing.assert_allclose(losses8, losses1, atol=1e-5)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-5), adapters8, adapters1)


@pytest.mark.slow
def test_lora_dropout_acts_in_the_train_step_only_with_the_steps_key():
    """`model.lora.dropout`: the train step's forward drops (its loss differs from p = 0),
    the same (seed, step) draws the same masks, another step or seed others; every other
    forward (log-probs, the adapters-off reference, even under a train-step key) has none."""
    import jax.numpy as jnp
    from flax import nnx

    from rljax.models import init_model
    from rljax.models.lora import add_adapters, set_dropout_key, split_trainable
    from rljax.train.steps import init_train_state
    from tests.tiny_models import TWO_LAYER_QWEN2

    config = TWO_LAYER_QWEN2
    decoder = init_model(config)
    add_adapters(decoder, LoRAConfig(rank=4, alpha=8.0, dropout=0.3, target_modules=["q_proj", "down_proj"]))
    for i, (name, var) in enumerate(sorted(decoder.layers.variables().items())):
        if name.endswith("_lora_b"):  # B != 0, else the adapters (and their dropout) change nothing
            var[...] = 0.2 * jax.random.normal(jax.random.key(i), var.shape, var.dtype)
    params, base = split_trainable(decoder)
    dropping = nnx.graphdef(decoder)
    decoder.lora_dropout = 0.0
    plain = nnx.graphdef(decoder)
    ids = jax.random.randint(jax.random.key(1), (4, 16), 0, 64)
    batch = {"input_ids": ids, "positions": jnp.broadcast_to(jnp.arange(16), (4, 16)),
             "segment_ids": jnp.ones((4, 16), jnp.int32), "loss_mask": jnp.ones((4, 16)).at[:, 0].set(0.0)}
    optimizer, schedule = make_optimizer(OptimConfig(lr=1e-2, weight_decay=0.0), 3)

    train_step = make_train_step(dropping, sft_objective(), optimizer, schedule)

    def run(seed=0, step=0):
        state = init_train_state(jax.tree.map(jnp.copy, params), optimizer, seed).replace(step=jnp.int32(step))
        state, m = train_step(state, batch, None, base)
        return float(m["train/loss"]), jax.device_get(state.params)

    (loss, trained), (again, trained_again) = run(), run()
    assert loss == again  # the masks are a function of (seed, step, micro-batch): bit-identical
    jax.tree.map(np.testing.assert_array_equal, trained, trained_again)
    others = {run(seed=1)[0], run(step=1)[0]}
    assert loss not in others and len(others) == 2

    @jax.jit
    def forwards(p, key):
        outside = nnx.merge(dropping, p, base).token_log_probs(ids)  # a log-prob forward: no key
        model = nnx.merge(dropping, p, base)
        set_dropout_key(model, key)  # as in the train step
        without = nnx.merge(plain, p, base)  # the same adapters, p = 0
        return (outside, model.token_log_probs(ids, adapters=False), model.token_log_probs(ids),
                without.token_log_probs(ids), without.token_log_probs(ids, adapters=False))

    outside, ref_in_step, train_forward, expected, expected_ref = forwards(params, jax.random.key(3))
    np.testing.assert_array_equal(np.asarray(outside), np.asarray(expected))
    np.testing.assert_array_equal(np.asarray(ref_in_step), np.asarray(expected_ref))
    assert np.abs(np.asarray(train_forward) - np.asarray(expected)).max() > 1e-3
    mask = np.asarray(batch["loss_mask"])
    no_dropout = float(-(np.asarray(expected) * mask).sum() / mask.sum())  # the SFT loss at p = 0
    print(f"loss with dropout 0.3: {loss:.5f}, without: {no_dropout:.5f}")
    assert abs(loss - no_dropout) > 1e-4
