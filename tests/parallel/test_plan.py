"""`rljax plan`: per-device bytes from abstract shapes agree with a real sharded init."""

import re

import jax
import jax.numpy as jnp
import pytest

from rljax.cli import main as cli_main
from rljax.commands.plan import load_raw, make_plan
from rljax.parallel import measured_bytes
from tests.parallel.helpers import TINY, TINY_FSDP8

CONFIG = TINY


def rows(plan):
    return dict(plan.rows)


@pytest.mark.slow
def test_plan_bytes_equal_measured_bytes_of_a_sharded_init(tiny_fsdp8):
    _, _, state = tiny_fsdp8
    plan = rows(make_plan(load_raw(TINY, TINY_FSDP8)))
    measured_params = measured_bytes(state.params)
    measured_opt = measured_bytes(state.opt_state)
    print("plan", plan["params (float32)"], "measured", sorted(set(measured_params.values())))
    assert max(measured_params.values()) == plan["params (float32)"]
    assert max(measured_opt.values()) == plan["optimizer state (AdamW mu + nu)"]


def test_plan_for_a_larger_abstract_mesh_and_errors(capsys):
    plan = make_plan(load_raw(CONFIG, ["mesh.data=2", "mesh.fsdp=8"]), devices=16, device_memory_gb=16)
    assert "mesh(data=2, fsdp=8, tensor=1) on 16 devices (abstract)" in plan.title[0]
    assert "fits" in plan.notes[0]
    assert cli_main(["plan", CONFIG, "--devices", "32"]) == 1
    assert re.search(r"^rljax: error: .*micro-batch of size 16 is not divisible by the data-parallel size 32",
                     capsys.readouterr().err, re.M)
    assert cli_main(["plan", CONFIG, "--devices", "32", "--micro-batch", "32", "--device-memory-gb", "16"]) == 0
    out = capsys.readouterr().out
    assert "optimizer state (AdamW mu + nu)" in out and "kv cache" in out and "formulas" in out
    # 2 kv heads over tensor=4: start-up error naming the tensor, its size and the mesh
    assert cli_main(["plan", CONFIG, "model.hf_config.vocab_size=128", "mesh.tensor=4", "mesh.fsdp=2",
                     "--devices", "8"]) == 1
    assert re.search(r"^rljax: error: .*k_(proj|bias): dimension 'kv_heads' of size 2 .*tensor=4",
                     capsys.readouterr().err, re.M)
    assert jax.device_count() == 8  # planning for 16 or 32 devices allocated nothing here


def test_plan_reads_rl_configs():
    """verl-style RL config: sequence = prompt + response, rollout's KV cache, the KL
    reference, per-device micro-batches."""
    config = TINY.replace("sft_tiny.yaml", "gsm8k_qwen2.5_0.5b_grpo.yaml")
    tiny = "{model_type: qwen2, vocab_size: 128, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, " \
           "num_attention_heads: 4, num_key_value_heads: 2}"
    plan = make_plan(load_raw(config, [f"model.hf_config={tiny}"]), devices=8)
    names = dict(plan.rows)
    assert "reference model (float32, frozen)" in names  # actor.use_kl_loss
    assert "x 1024 tokens" in plan.title[1] and "micro-batch 128 rows (16 per device)" in plan.title[1]
    assert plan.kv[0][0].startswith("kv cache: 256 seqs x 1024 tokens")


def test_auto_attention_is_planned_as_the_kernel_it_resolves_to():
    """`attention: auto` keeps [T, T] probabilities only where it falls back to xla: fp32
    on a GPU, or a CPU; bf16 on a GPU runs cuDNN's flash kernel, TPU runs splash."""
    def activations(backend, dtype):
        plan = make_plan(load_raw(CONFIG, ["model.attention=auto", f"model.compute_dtype={dtype}"]), devices=8,
                         backend=backend)
        return rows(plan)["activations, remat=none (configured)"], plan.title[1]

    flash, title = activations("gpu", "bfloat16")
    assert "(-> cudnn on gpu)" in title
    fallback, title = activations("gpu", "float32")
    assert "(-> xla on gpu)" in title
    assert activations("tpu", "bfloat16")[1].endswith("(-> splash on tpu)")
    assert fallback > 2 * flash  # fp32 doubles A; the probs add more on top
    cpu, _ = activations("cpu", "bfloat16")
    assert cpu > flash  # the same dtype with the [T, T] probs


TINY_MODEL = ("{model_type: qwen2, vocab_size: 128, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, "
              "num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, tie_word_embeddings: true}")


def rollout_raw(*overrides: str) -> dict:
    config = TINY.replace("sft_tiny.yaml", "gsm8k_qwen2.5_0.5b_grpo.yaml")
    return load_raw(config, [f"model.hf_config={TINY_MODEL}", "model.param_dtype=float32", *overrides])


def test_plan_shows_the_rollout_replicas_by_hand(capsys):
    """tp = 2 on 8 devices: 4 replicas; weights split over tensor only; one replica's pool
    halved by its 2 devices (2 kv heads); sequences = usable pages / pages per sequence."""
    raw = rollout_raw("rollout.tensor_parallel_size=2", "rollout.num_pages=129", "rollout.page_size=16",
                      "data.max_prompt_length=48", "rollout.response_length=16")
    r = make_plan(raw, devices=8, device_memory_gb=16).rollout
    assert (r.dp, r.tp, r.pages, r.page_size, r.seq_len) == (4, 2, 129, 16, 64)
    assert r.sequences == 128 // 4  # 64 tokens = 4 pages each
    e, m, L, V, D = 64, 128, 2, 128, 16
    # f32 weights: embed [V, e] over tensor; per layer q/o (4 heads x D) and k/v (2 kv heads x D) over tensor,
    # mlp gate/up/down over tensor, norms (2e per layer + final e) and q/k/v biases (heads over tensor) whole
    split = V * e + L * (2 * e * 4 * D + 2 * e * 2 * D + 3 * e * m + (4 + 2 + 2) * D)
    whole = L * 2 * e + e
    # bf16 compute: the replicas hold the bf16 cast (rollout.weight_dtype null), half the f32 bytes; the hand-off's
    # transient adds the cast copy in the training layout (the devices are shared)
    assert (r.weight_dtype, r.weights_bytes, r.uncast_weights_bytes) == ("bfloat16", 2 * (split // 2 + whole),
                                                                         4 * (split // 2 + whole))
    assert r.handoff_bytes > r.weights_bytes
    f32 = make_plan(rollout_raw("rollout.tensor_parallel_size=2", "rollout.num_pages=129", "rollout.weight_dtype=float32"),
                    devices=8, device_memory_gb=16).rollout
    assert f32.weights_bytes == f32.uncast_weights_bytes == f32.handoff_bytes == 4 * (split // 2 + whole)
    assert r.kv_bytes == 2 * L * 129 * 16 * 2 * D * 2 // 2  # bf16 compute dtype, kv heads over tp = 2
    assert "while the replicas sample" in make_plan(raw, devices=8, device_memory_gb=16).notes[-1]
    assert cli_main(["plan", TINY.replace("sft_tiny.yaml", "gsm8k_qwen2.5_0.5b_grpo.yaml"),
                     f"model.hf_config={TINY_MODEL}", "rollout.tensor_parallel_size=2", "--devices", "8",
                     "--kv-seqs", "8", "--kv-len", "64"]) == 0
    out = capsys.readouterr().out
    assert "rollout: 4 replicas (data_parallel_size) x 2 devices (tensor_parallel_size); 33 pages" in out  # 8 x 4 + 1
    assert "rollout weights per device (split over tp, bfloat16)" in out and "weight hand-off transient" in out
    assert "uncast (rollout.weight_dtype = the parameters' dtype)" in out
    # 2 kv heads over tp = 4: refused as the hand-off would refuse it
    assert cli_main(["plan", TINY.replace("sft_tiny.yaml", "gsm8k_qwen2.5_0.5b_grpo.yaml"),
                     f"model.hf_config={TINY_MODEL}", "rollout.tensor_parallel_size=4", "--devices", "8"]) == 1
    assert re.search(r"^rljax: error: .*k_(proj|bias): dimension 'kv_heads' of size 2 .*tensor=4",
                     capsys.readouterr().err, re.M)


def test_plan_without_replicas_and_estimator_specs(capsys):
    assert make_plan(rollout_raw(), devices=8).rollout is None  # tp = 0: the sampler on the training mesh
    names = dict(make_plan(rollout_raw("algorithm.adv_estimator=gae"), devices=8).rows)
    assert "critic: params + optimizer + gradients" in names  # the estimator's spec needs a critic
    assert "critic: params + optimizer + gradients" not in dict(make_plan(rollout_raw(), devices=8).rows)
    assert cli_main(["plan", TINY.replace("sft_tiny.yaml", "gsm8k_qwen2.5_0.5b_grpo.yaml"),
                     f"model.hf_config={TINY_MODEL}", "algorithm.adv_estimator=gea"]) == 1
    assert re.search(r"^rljax: error: plan: algorithm\.adv_estimator: unknown 'gea'; did you mean 'gae'\?",
                     capsys.readouterr().err, re.M)
    assert cli_main(["plan", TINY.replace("sft_tiny.yaml", "gsm8k_qwen2.5_0.5b_grpo.yaml"),
                     f"model.hf_config={TINY_MODEL}", "rollout.tensor_parallel_size=3", "--devices", "8"]) == 1
    assert re.search(r"^rljax: error: .*tensor_parallel_size=3 does not fit the 8 devices",
                     capsys.readouterr().err, re.M)


def test_plan_lora_critic_shares_the_actors_base():
    """PPO with LoRA, one device: the critic adds its adapters and head (hidden floats),
    their AdamW moments and gradients; no second base (the trainer shares its arrays,
    tests/rl/test_lora_rl.py)."""
    plan = make_plan(rollout_raw("algorithm.adv_estimator=gae", "model.lora.rank=4"), devices=1)
    names = dict(plan.rows)
    adapters = names["gradients (accumulator + one micro-batch's) (adapters only)"] // 2
    adam = names["optimizer state (AdamW mu + nu) (adapters only)"]
    head = 64 * 4  # score [hidden] in float32
    critic = names["critic: adapters + head, optimizer, gradients (the actor's base: no copy)"]
    assert critic == (adapters + head) + (adam + 2 * head) + (adapters + head)
    assert critic < names["params (float32) (frozen base + adapters)"]
    full = dict(make_plan(rollout_raw("algorithm.adv_estimator=gae"), devices=1).rows)
    assert full["critic: params + optimizer + gradients"] > full["params (float32)"]  # full fine-tuning: its own


def test_plan_of_qwen3_30b_a3b_on_64_v5p_chips():
    """Experts over fsdp=64: 2 of the 128 experts per chip, the dispatch buffers of one
    layer as the hand formula gives them, and the run fits 95 GB; data=8 x fsdp=8 keeps
    8x the fp32 weights and AdamW state per chip and does not."""
    config = TINY.replace("sft_tiny.yaml", "gsm8k_qwen3_30b_a3b_grpo.yaml")
    plan = make_plan(load_raw(config, []), devices=64, device_memory_gb=95, backend="tpu")
    names = rows(plan)
    layers, experts_here, e, f, k = 48, 2, 2048, 768, 8
    assert names["expert weights, part of params (128 experts over fsdp=64, 2 per device)"] == \
        layers * 3 * experts_here * e * f * 4
    b, t, fsdp, c = 1, 512 + 1024, 64, 2  # rows per device, prompt + response, bf16
    assert names["MoE dispatch buffers, one layer (in the activations)"] == \
        b * t * fsdp * (c * 2 * e + k * (4 * 2 * e + c * (3 * e + 3 * f)))  # float32 slot outputs + gradient
    # the compiled TPU train step (v5p-128, fsdp 64, 2 layers: 27.96 GiB per chip; 48 layers: 38.5) is in the
    # dispatch's backward: plan's total must come within 10% of it
    two = make_plan(load_raw(config, ["model.hf_config.num_hidden_layers=2"]), devices=64, backend="tpu")
    assert abs(two.total / 2**30 - 27.96) < 0.1 * 27.96
    assert abs(plan.total / 2**30 - 38.5) < 0.1 * 38.5
    assert names["one layer's weights all-gathered over fsdp (x2, prefetch) (not the experts)"] > 0
    assert plan.notes[0].split("->")[1].startswith(" fits")
    crowded = make_plan(load_raw(config, ["mesh.data=8", "mesh.fsdp=8"]), devices=64, device_memory_gb=95,
                        backend="tpu")
    assert "DOES NOT FIT" in crowded.notes[0]
    # 8x, but for the few small tensors (q / k norms) every chip holds whole
    assert 7.99 < rows(crowded)["params (float32)"] / names["params (float32)"] <= 8


def test_check_fits_names_the_largest_micro_batch_that_fits():
    """A run whose plan does not fit its memory is refused before anything is built, with
    the largest per-device micro-batch (dividing the mini-batch) whose plan fits."""
    from rljax.commands.plan import check_fits
    from rljax.config import ConfigError

    config = TINY.replace("sft_tiny.yaml", "gsm8k_qwen2.5_0.5b_grpo.yaml")
    tiny = "{model_type: qwen2, vocab_size: 4096, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, " \
           "num_attention_heads: 4, num_key_value_heads: 2}"
    run = load_raw(config, [f"model.hf_config={tiny}"])  # mini-batch 64 x 4 rows, micro 16 per device, 8 devices

    def need(per_device):
        plan = make_plan(run, micro_batch=per_device * 8, backend="cpu")
        return 8 * (plan.total + plan.kv[0][1])

    assert need(16) > need(8) > need(4)
    assert check_fits(run, need(16), 8, kv=True, backend="cpu").total * 8 + make_plan(run).kv[0][1] * 8 == need(16)
    with pytest.raises(ConfigError, match=r"^memory: the plan needs .* GiB \(8 device\(s\) x .* free: "
                                          r"actor\.ppo_micro_batch_size_per_device=8 fits \("):
        check_fits(run, need(16) - 1, 8, kv=True, backend="cpu")
    with pytest.raises(ConfigError, match=r"actor\.ppo_micro_batch_size_per_device=4 fits"):
        check_fits(run, need(8) - 1, 8, kv=True, backend="cpu")  # 32 / 8 = 4 rows divides 256; 6, 7 do not
    with pytest.raises(ConfigError, match=r"no micro-batch fits, not even with model\.remat=full at "
                                          r"actor\.ppo_micro_batch_size_per_device=1 \("):
        check_fits(run, 1, 8, kv=True, backend="cpu")


def test_cpu_plan_counts_what_xla_cpu_keeps_unfused():
    """On CPU the activations also hold q, k before RoPE per token per layer, and the
    scores before the softmax in the one layer whose backward runs: c (h + k) D bytes per
    token and layer, 4 h T per token once."""
    run = load_raw(CONFIG, ["model.attention=xla"])

    def act(backend):
        return rows(make_plan(run, devices=1, backend=backend))["activations, remat=none (configured)"]

    from rljax.commands.plan import model_config_of

    cfg = model_config_of(run.model)
    plan = make_plan(run, devices=1, backend="cpu")
    b, t = run.trainer.micro_batch_size, run.data.max_length
    assert f"micro-batch {b} rows" in plan.title[1] and f"x {t} tokens" in plan.title[1]
    assert run.model.compute_dtype == "float32"
    h, k, d, c = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, 4
    extra = cfg.num_hidden_layers * b * t * c * (h + k) * d + b * t * 4 * h * t
    assert act("cpu") - act("gpu") == extra


@pytest.mark.slow
def test_cpu_plan_per_layer_activations_match_the_compiled_backward():
    """What XLA:CPU's compiled backward of the decoder holds per layer (the growth of its
    temporaries from 2 to 6 layers, over 4) is the plan's unfused per-layer activations
    within 10% (the rest: the layer's weight gradients). The xla attention's [T, T]
    probabilities (8 MiB a layer here, twice the rest) are not among them."""
    import dataclasses

    from flax import nnx

    from rljax.commands.plan import activation_bytes
    from rljax.models import ModelConfig, init_model

    b, t = 8, 256
    base = ModelConfig(model_type="llama", vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8)

    def compiled(layers):
        cfg = dataclasses.replace(base, num_hidden_layers=layers)
        graphdef, params = nnx.split(init_model(cfg, seed=0))
        ids = jnp.ones((b, t), jnp.int32)
        loss = lambda p: nnx.merge(graphdef, p).hidden_states(ids, jnp.ones((b, t), jnp.int32)).sum()  # noqa: E731
        return jax.jit(jax.grad(loss)).lower(params).compile().memory_analysis().temp_size_in_bytes

    def planned(layers):
        return activation_bytes(dataclasses.replace(base, num_hidden_layers=layers), b, t, 1, 4, "none", "xla",
                                fused=False)

    per_layer = (compiled(6) - compiled(2)) / 4
    plan = (planned(6) - planned(2)) / 4
    scores = b * base.num_attention_heads * t * t * 4
    assert plan < per_layer < 1.1 * plan
    assert per_layer < scores / 2


def test_the_kv_pool_is_planned_at_the_head_dim_its_attention_lays_out():
    """On a TPU `auto` is the ragged kernel, whose pool pads head_dim to the 128 lanes: a
    head_dim-64 model's pool is planned at twice its GPU size; `reference` keeps 64."""
    from types import SimpleNamespace

    from rljax.commands.plan import kv_cache_bytes, pool_head_dim
    from rljax.parallel import MeshConfig, abstract_mesh

    cfg = SimpleNamespace(head_dim=64, num_hidden_layers=24, num_key_value_heads=2)
    assert pool_head_dim(cfg, "auto", "tpu") == 128 == pool_head_dim(cfg, "pallas_tpu", "gpu")
    assert pool_head_dim(cfg, "auto", "gpu") == pool_head_dim(cfg, "reference", "tpu") == 64
    mesh = abstract_mesh(MeshConfig(data=1, fsdp=1, tensor=1), 1)
    # 2 (k, v) x 24 layers x 1 sequence x 16 tokens x 2 kv heads x D x 2 bytes
    assert kv_cache_bytes(cfg, 1, 16, mesh, 2, pool_head_dim(cfg, "auto", "tpu")) == 2 * 24 * 16 * 2 * 128 * 2
    assert kv_cache_bytes(cfg, 1, 16, mesh, 2) == 2 * 24 * 16 * 2 * 64 * 2
