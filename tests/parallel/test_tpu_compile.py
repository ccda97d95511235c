"""Compiling a run's programs for a TPU on this CPU host (`rljax compile`, `rljax.tpu`).

The topology and roofline arithmetic are checked everywhere; the compiles need libtpu
(`pip install "jax[tpu]==<jax version>"`, which `.ci/run` installs) and skip, saying
so, only when it is absent. They compile for a v5e:2x2 slice (4 chips, one host).
"""

from __future__ import annotations

import dataclasses
import re

import jax
import pytest

from rljax.config import load_config
from rljax.parallel import planned_bytes, state_shardings
from rljax.rl.config import RLConfig
from rljax.tpu.programs import PROGRAM_KINDS, Program, default_pages, parse_kinds, run_programs
from rljax.tpu.report import Compiled, compile_program, compile_run, overflow, render, roofline
from rljax.tpu.supervised import supervised_programs
from rljax.train.run_config import RunConfig
from rljax.tpu.topology import CHIPS, GiB, libtpu_available, parse_slice, slice_devices, sub_slice

QUICKSTART = "configs/quickstart.yaml"
QWEN_05B = ("{model_type: qwen2, vocab_size: 151936, hidden_size: 896, intermediate_size: 4864, "
            "num_hidden_layers: 24, num_attention_heads: 14, num_key_value_heads: 2, rope_theta: 1000000.0, "
            "tie_word_embeddings: true}")


def needs_libtpu(test):
    """A compile for a TPU: in the slow lane, and skipped without libtpu."""
    return pytest.mark.slow(pytest.mark.skipif(
        not libtpu_available(), reason="libtpu is not installed (pip install \"jax[tpu]==<jax version>\")")(test))


# ---- names and peaks -------------------------------------------------------------------------


@pytest.mark.parametrize("name, topology, chips, hosts", [
    ("v5e-16", "v5e:4x4", 16, 4),
    ("v5litepod-16", "v5e:4x4", 16, 4),
    ("v6e-16", "v6e:4x4", 16, 4),
    ("v5p-32", "v5p:2x2x4", 16, 4),  # Cloud counts v5p in TensorCores: 32 cores = 16 chips
    ("v5e:2x2", "v5e:2x2", 4, 1),
    ("v5e-8", "v5e:2x4", 8, 1),
])
def test_slice_names(name, topology, chips, hosts):
    tpu = parse_slice(name)
    assert (tpu.topology_name, tpu.chips, tpu.hosts) == (topology, chips, hosts)


def test_a_replica_compiles_on_a_host_shaped_slice_of_its_size():
    assert parse_slice("v5e-16").chips == 16
    assert sub_slice(parse_slice("v5e-16"), 4).topology_name == "v5e:2x2"
    assert sub_slice(parse_slice("v5p-32"), 4).topology_name == "v5p:2x2x1"
    assert sub_slice(parse_slice("v6e-16"), 2).topology_name == "v6e:1x2"
    with pytest.raises(ValueError, match="replica of 3"):
        sub_slice(parse_slice("v5e-16"), 3)


@pytest.mark.parametrize("name", ["v5p-31", "v5e-12", "v9-8", "v5p:4x4", "tpu"])
def test_bad_slice_names(name):
    with pytest.raises(ValueError, match="--topology"):
        parse_slice(name)


def test_roofline_extrapolates_layers_and_picks_the_bound():
    chip = CHIPS["v5e"]
    program = Program("step", "train", None, (), tokens=1000, model_flops=8 * 197e12 * 0.25, devices=8, mesh=None)
    zero = Compiled(program, 0.0, flops=10e12, bytes_accessed=1e9)
    one = Compiled(program, 0.0, flops=30e12, bytes_accessed=2e9)
    r = roofline(program, zero, one, layers=4, chip=chip)
    assert r.flops == pytest.approx(90e12) and r.bytes == pytest.approx(5e9)
    assert r.bound == "compute" and r.seconds == pytest.approx(90e12 / 197e12)
    # model FLOPs per chip 197e12 * 0.25 over 90 TFLOP of work at peak: MFU <= 0.25 * 197 / 90
    assert r.mfu == pytest.approx(0.25 * 197e12 / 90e12)
    decode = dataclasses.replace(program, kind="decode", tokens=64)
    r = roofline(decode, Compiled(decode, 0.0, flops=1e9, bytes_accessed=1e9),
                 Compiled(decode, 0.0, flops=2e9, bytes_accessed=3e9), layers=10, chip=chip)
    assert r.bound == "memory" and r.seconds == pytest.approx(21e9 / 819e9)
    assert r.tokens_per_s == pytest.approx(64 / (21e9 / 819e9))
    # the paged kernel's K / V reads, which XLA's count misses, are added (and reported apart)
    kernel = dataclasses.replace(decode, kernel_bytes=4e9)
    r = roofline(kernel, Compiled(kernel, 0.0, flops=1e9, bytes_accessed=1e9),
                 Compiled(kernel, 0.0, flops=2e9, bytes_accessed=3e9), layers=10, chip=chip)
    assert r.bytes == pytest.approx(25e9) and r.kernel_bytes == 4e9
    assert r.seconds == pytest.approx(25e9 / 819e9)
    # splash attention's FLOPs, likewise unseen by XLA, are added to the train step's
    splash = dataclasses.replace(program, kernel_flops=20e12)
    r = roofline(splash, zero, one, layers=4, chip=chip)
    assert r.flops == pytest.approx(110e12) and r.kernel_flops == 20e12
    assert r.mfu == pytest.approx(0.25 * 197e12 / 110e12)
    # a count below the model FLOPs (loops counted once) is raised to them: MFU <= 100%
    light = dataclasses.replace(program, model_flops=8 * 120e12)
    r = roofline(light, zero, one, layers=4, chip=chip)
    assert r.flops == pytest.approx(120e12) and r.mfu == pytest.approx(1.0)


# ---- compiled for a TPU --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def v5e_2x2():
    return slice_devices(parse_slice("v5e:2x2"))


@pytest.fixture(scope="module")
def quickstart(v5e_2x2):
    """The quickstart's programs for v5e:2x2 with `model.attention: auto` (the TPU's
    kernels): the actor train step, the first prefill program and the decode program,
    compiled once."""
    cfg = load_config(RLConfig, QUICKSTART, ["model.attention=auto"])
    run = run_programs(cfg, v5e_2x2, num_pages=default_pages(cfg))
    kinds = [p.kind for p in run.programs]
    # one update per batch: the update gives the old log-probs, no forward of their own
    assert kinds[0] == "train" and "forward" not in kinds and "prefill" in kinds and kinds[-1] == "decode"
    chosen = [run.programs[0], run.programs[kinds.index("prefill")], run.programs[-1]]
    return cfg, run, {p.kind: (p, compile_program(p)) for p in chosen}


@needs_libtpu
def test_quickstart_train_step_compiles_with_the_splash_kernel(quickstart):
    cfg, run, compiled = quickstart
    program, result = compiled["train"]
    assert result.error is None, result.error
    assert result.fits(CHIPS["v5e"])
    # `attention: auto` resolved to splash for the TPU and lowered as a Mosaic kernel, not interpreted
    text = program.lower().as_text()
    assert "tpu_custom_call" in text and "splash" in text
    # the donated state comes back in place: every output byte of the state is an alias
    state_bytes = planned_bytes(program.args[0], jax.tree.map(lambda s: s.sharding, program.args[0]))
    assert result.alias_bytes >= state_bytes > 0
    assert result.argument_bytes >= state_bytes


@needs_libtpu
def test_quickstart_sampler_programs_compile(quickstart):
    cfg, run, compiled = quickstart
    for kind in ("prefill", "decode"):
        program, result = compiled[kind]
        assert result.error is None, (kind, result.error)
        # the KV pool is donated and updated in place
        pool = program.args[1]
        pool_bytes = planned_bytes([pool], [pool.sharding])
        assert result.alias_bytes >= pool_bytes, kind
        assert result.flops > 0
    assert run.notes  # tensor_parallel_size=0: no hand-off program, and the report says why


@needs_libtpu
def test_the_mixed_program_compiles_with_its_pool_in_place(v5e_2x2):
    """With `rollout.mixed_steps` the run also has the mixed program (every decode row
    plus the chunk tokens the budget leaves): it compiles for the TPU, its pool donated
    and updated in place, and it counts the work of both parts."""
    cfg = load_config(RLConfig, QUICKSTART, ["model.attention=auto", "rollout.mixed_steps=true"])
    run = run_programs(cfg, v5e_2x2, num_pages=default_pages(cfg))
    (program,) = [p for p in run.programs if p.kind == "mixed"]
    (decode,) = [p for p in run.programs if p.kind == "decode"]
    assert program.tokens > decode.tokens and program.model_flops > decode.model_flops
    result = compile_program(program)
    assert result.error is None, result.error
    pool = program.args[1]
    assert result.alias_bytes >= planned_bytes([pool], [pool.sharding])
    assert result.flops > 0


@needs_libtpu
def test_a_program_that_does_not_fit_is_one_line(quickstart):
    _, _, compiled = quickstart
    program, result = compiled["decode"]
    tiny = dataclasses.replace(CHIPS["v5e"], name="tiny", hbm_bytes=result.peak_bytes - 1)
    (line,) = overflow([result], tiny)
    assert line.startswith(program.name) and "tiny has" in line and "over by" in line
    assert overflow([result], CHIPS["v5e"]) == []


@needs_libtpu
def test_qwen_05b_shaped_train_step_fits_a_v5e_chip(v5e_2x2):
    cfg = load_config(RLConfig, QUICKSTART, [f"model.hf_config={QWEN_05B}", "model.compute_dtype=bfloat16",
                                             "model.attention=auto",
                                             "model.remat=full", "actor.ppo_micro_batch_size_per_device=16"])
    run = run_programs(cfg, v5e_2x2, num_pages=default_pages(cfg))
    program = run.programs[0]
    # 256 rows in micro-batches of 16 per chip: packed into 128 rows twice as long (splash: no shared prompts)
    assert program.kind == "train" and "4 micro, packed" in program.name
    assert program.args[1].segment_ids.shape == (128, 2 * cfg.row_length) and program.args[1].branch_ids is None
    # tests/conftest.py sets matmul precision "highest" for the CPU oracles; Mosaic refuses bf16 matmuls
    # at that precision ("Bad lhs type"), so the run's own default precision is restored here
    with jax.default_matmul_precision("default"):
        result = compile_program(program)
    assert result.error is None, result.error
    # params, AdamW state: fp32, 494M params split 4 ways -> 3 x 4 x 494M / 4 bytes at least
    assert result.argument_bytes > 3 * 4 * 494e6 / 4
    assert result.fits(CHIPS["v5e"]) and result.peak_bytes < 8 * GiB


@needs_libtpu
def test_hand_off_compiles_between_meshes_that_order_the_chips_differently(v5e_2x2):
    cfg = load_config(RLConfig, QUICKSTART, ["rollout.tensor_parallel_size=2"])
    run = run_programs(cfg, v5e_2x2, num_pages=default_pages(cfg))
    # the training mesh follows the torus, the replicas follow device ids: jax.device_put's reorder path
    assert [d.id for d in run.mesh.devices.flat] != [d.id for d in run.layout.mesh.devices.flat]
    (program,) = [p for p in run.programs if p.kind == "handoff"]
    result = compile_program(program)
    assert result.error is None, result.error
    # what it produces per chip: the rollout copy, split over the replica's tp=2 chips only (TPU
    # buffers are padded to their tiles: a few KB more than the shapes say)
    weights = program.args[0]
    rollout = planned_bytes(weights, state_shardings(weights, run.layout.mesh))
    training = planned_bytes(weights, state_shardings(weights, run.mesh))
    assert result.output_bytes == pytest.approx(rollout, rel=0.02)
    # the input is the fsdp=4 split, but a 128-wide minor dimension split 4 ways is padded back to the
    # TPU's 128 lanes: the compiler's bytes sit between the shapes' split and the whole
    assert training < result.argument_bytes <= planned_bytes(weights, state_shardings(weights, run.layout.replicas[0]))
    assert rollout > 1.5 * training


@needs_libtpu
def test_a_bfloat16_hand_off_compiles_to_half_the_rollout_bytes(v5e_2x2):
    """float32 parameters, bfloat16 compute: the replicas hold bfloat16 weights by default
    (`rollout.weight_dtype` null), so the compiled hand-off moves and produces half of what
    the float32 one does, and the sampler's programs take bfloat16 weights."""
    compiled = {}
    for weight_dtype in ("null", "float32"):
        cfg = load_config(RLConfig, QUICKSTART, ["rollout.tensor_parallel_size=2", "model.compute_dtype=bfloat16",
                                                 f"rollout.weight_dtype={weight_dtype}"])
        run = run_programs(cfg, v5e_2x2, num_pages=default_pages(cfg))
        (program,) = [p for p in run.programs if p.kind == "handoff"]
        result = compile_program(program)
        assert result.error is None, result.error
        compiled[weight_dtype] = (program, result)
        decode = next(p for p in run.programs if p.kind == "decode")
        assert {x.dtype.name for x in jax.tree.leaves(decode.args[0])} == {  # the replica's weights
            "bfloat16" if weight_dtype == "null" else "float32"}
    (half, half_result), (full, full_result) = compiled["null"], compiled["float32"]
    assert "bfloat16" in half.name and "float32" in full.name
    assert half_result.output_bytes == pytest.approx(full_result.output_bytes / 2, rel=0.02)
    assert half_result.argument_bytes == pytest.approx(full_result.argument_bytes / 2, rel=0.02)


@needs_libtpu
def test_a_tp4_replica_of_a_multi_host_slice_compiles_on_its_own_topology():
    # libtpu fails collectives over chips 0, 1, 4, 5 of a v5e:4x4 (one host); the replica's programs
    # are compiled on a v5e:2x2 instead, with the replica mesh built by the layout's own code
    shape = ("{model_type: qwen2, vocab_size: 1024, hidden_size: 128, intermediate_size: 256, num_hidden_layers: 2, "
             "num_attention_heads: 4, num_key_value_heads: 4, tie_word_embeddings: true}")
    cfg = load_config(RLConfig, QUICKSTART, ["rollout.tensor_parallel_size=4", f"model.hf_config={shape}"])
    tpu = parse_slice("v5e-16")
    run = run_programs(cfg, slice_devices(tpu), num_pages=default_pages(cfg),
                       replica_devices=slice_devices(sub_slice(tpu, 4)))
    assert run.layout.num_replicas == 4 and [d.id for d in run.layout.replicas[0].devices.flat] == [0, 1, 4, 5]
    decode = run.programs[-1]
    assert decode.kind == "decode" and decode.mesh.shape == {"data": 1, "fsdp": 1, "tensor": 4}
    result = compile_program(decode)
    assert result.error is None, result.error
    pool = decode.args[1]
    assert pool.sharding.spec[3] == "tensor"  # [L, P, S, 2K, D]: 4 kv heads over the replica's 4 chips
    assert result.alias_bytes >= planned_bytes(pool, pool.sharding)


HEAD_DIM_128 = ("{model_type: qwen2, vocab_size: 1024, hidden_size: 256, intermediate_size: 256, num_hidden_layers: 2, "
                "num_attention_heads: 2, num_key_value_heads: 2, tie_word_embeddings: true}")


@needs_libtpu
@pytest.mark.parametrize("topology, tp, head_dim", [
    ("v5e:2x2", 0, 128),  # the pool whole on the training mesh's 4 chips
    ("v5e:2x2", 2, 128),  # split over a replica's 2 chips
    ("v5p:2x2x1", 0, 128),  # megacore chips
    ("v5e:2x2", 2, 64),  # Qwen2.5-0.5B's head_dim: the pool padded to the 128 lanes
])
def test_sampler_programs_run_the_tpu_ragged_kernel_on_the_pool_in_place(topology, tp, head_dim):
    """On a TPU `rollout.attention: auto` is the Mosaic ragged paged-attention kernel in
    prefill, decode and mixed programs, reading the pool where it is: no compiled program
    holds a copy, transpose or gather of a pool-sized array (only the in-place scatter of
    the step's keys and values)."""
    model = HEAD_DIM_128.replace("}", f", head_dim: {head_dim}}}")
    cfg = load_config(RLConfig, QUICKSTART, [f"model.hf_config={model}", "model.compute_dtype=bfloat16",
                                             f"rollout.tensor_parallel_size={tp}", "rollout.max_num_seqs=8",
                                             "rollout.page_size=16", "model.attention=auto",
                                             "rollout.mixed_steps=true"])
    assert cfg.rollout.attention == "auto"
    devices = slice_devices(parse_slice(topology))
    run = run_programs(cfg, devices, num_pages=default_pages(cfg))
    # training attention auto is splash on a TPU, whose FLOPs XLA does not count: the train program
    # carries them per chip (causal scores and values, 2 * 2 * T * h * d / 2 per layer and token, x3)
    train, row = run.programs[0], cfg.data.max_prompt_length + cfg.rollout.response_length
    assert train.kind == "train"
    assert train.kernel_flops == train.tokens * 3 * 2 * (2 * 2 * row * 2 * head_dim / 2) / len(devices)
    sampler = {p.kind: p for p in run.programs if p.kind in ("prefill", "decode", "mixed")}
    assert set(sampler) == {"prefill", "decode", "mixed"}
    decode = sampler["decode"]
    assert "pallas_tpu attention" in decode.name
    pool = decode.args[1]  # [L, P, S, 2K, D], bf16
    layers, pages, page, two_k, d = pool.sharding.shard_shape(pool.shape)  # one chip's
    assert two_k == 2 * (1 if tp == 2 else 2) and d == 128
    # keys and values of 8 rows x 3 pages x 16 tokens, 2 layers, 4 steps, the chip's kv heads, bf16
    assert decode.kernel_bytes == 2 * 4 * 8 * 2 * (two_k // 2) * 3 * 16 * d * 2
    assert sampler["prefill"].kernel_bytes > 0 and sampler["mixed"].kernel_bytes > decode.kernel_bytes
    pool_sized = re.compile(rf"= bf16\[({layers},{pages},{page},{two_k},{d}|{layers * pages},{page},{two_k},{d})\]\S* "
                            r"(\S+)\(")
    for kind, program in sampler.items():
        with jax.default_matmul_precision("default"):
            text = program.lower().compile().as_text()
        assert "tpu_custom_call" in text, kind
        ops = {m.group(2) for m in pool_sized.finditer(text)}
        assert ops and not ops & {"copy", "transpose", "copy-start", "gather"}, (kind, ops)


# ---- the command line --------------------------------------------------------------------------


@pytest.mark.slow
def test_compile_command_refuses_what_it_cannot_compile(capsys):
    from rljax.cli import main

    assert main(["compile", QUICKSTART, "--topology", "v5e-12"]) == 1
    assert "--topology 'v5e-12': no standard v5e slice of 12 chips" in capsys.readouterr().err
    assert main(["compile", QUICKSTART, "--topology", "v5e-4", "--programs", "train,decoding"]) == 1
    err = capsys.readouterr().err
    assert "--programs 'train,decoding': unknown program kind 'decoding'; choose from " \
           "train, forward, handoff, prefill, decode" in err and len(err.splitlines()) == 2  # + the --debug hint
    # a supervised config is read and checked like an RL one: a bad value is one line, before libtpu loads
    assert main(["compile", "configs/sft_tiny.yaml", "data.batch_size=30", "trainer.micro_batch_size=0",
                 "--topology", "v5e-4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rljax: error: data.batch_size of size 30 is not divisible by the data-parallel size 4 ")
    assert len(err.splitlines()) == 2  # + the --debug hint
    assert main(["compile", "configs/dpo_tiny.yaml", "dpo.beta=-1", "--topology", "v5e-4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rljax: error: dpo.beta: must be > 0, got -1") and len(err.splitlines()) == 2
    # two slices, but a mesh that does not say which ways cross them
    assert main(["compile", QUICKSTART, "--topology", "v5e-4", "--num-slices", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rljax: error: mesh.dcn_data=1 x mesh.dcn_fsdp=1 = 1 slice(s), but --num-slices 2: set "
                          "the data / fsdp ways that cross slices (e.g. mesh.dcn_data=2)") and len(err.splitlines()) == 2


@needs_libtpu
@pytest.mark.slow
def test_every_program_compiles_on_two_slices(capsys):
    """2 x v5e-4, the data ways across the slices: the train step, the reference forward,
    the hand-off and the sampler's programs all compile on the hybrid mesh, with memory per
    chip."""
    from rljax.cli import main

    assert main(["compile", QUICKSTART, "mesh.data=2", "mesh.dcn_data=2", "rollout.tensor_parallel_size=2",
                 "actor.use_kl_loss=true", "--topology", "v5e-4", "--num-slices", "2", "--no-roofline"]) == 0
    out = capsys.readouterr().out
    assert "for 2 x v5e:2x2 (8 chips" in out and "mesh {'data': 2, 'fsdp': 4, 'tensor': 1}" in out
    kinds = {"actor train step": 0, "log-probs forward": 0, "weight hand-off": 0, "prefill": 0, "decode": 0}
    for line in out.splitlines():
        for kind in kinds:
            if line.startswith(kind):
                assert re.search(r"\s\d+\.\d{3}\s", line), line  # compiled GiB per chip
                kinds[kind] += 1
    assert all(kinds.values()), kinds


def test_programs_option_parses_a_subset_of_the_kinds():
    assert parse_kinds("decode, train") == ("decode", "train")
    assert parse_kinds(",".join(PROGRAM_KINDS)) == PROGRAM_KINDS
    for bad in ("", "train,,", "Train"):
        with pytest.raises(ValueError, match="choose from train, forward, handoff, prefill, decode"):
            parse_kinds(bad)


@needs_libtpu
def test_compile_command_compiles_only_the_kinds_named(capsys):
    # the quickstart on v5e-8 in replicas of 2 has a hand-off (a 1 s compile, as in
    # test_hand_off_compiles_between_meshes_that_order_the_chips_differently); --programs handoff
    # compiles it alone: no train step, forward, prefill or decode row, and no roofline (its kinds are
    # train and decode)
    from rljax.cli import main

    assert main(["compile", QUICKSTART, "rollout.tensor_parallel_size=2", "--topology", "v5e-8",
                 "--programs", "handoff"]) == 0
    out = capsys.readouterr().out
    rows = out[out.index("\nprogram "):].strip().splitlines()[1:]
    assert len(rows) == 1 and rows[0].startswith("weight hand-off (float32, training layout -> 4 replicas x tp=2)"), out
    assert "roofline" not in out and "trainer.mode" not in out and "chips (" not in out  # sync: no split
    assert "sampler programs above" not in out  # none compiled
    # without replicas the sampler reads the trainer's arrays: there is no hand-off to compile
    assert main(["compile", QUICKSTART, "rollout.tensor_parallel_size=0", "--topology", "v5e-8",
                 "--programs", "handoff"]) == 1
    assert "--programs handoff: this run has no program of those kinds (it has train, prefill, decode)" \
        in capsys.readouterr().err


@needs_libtpu
def test_async_compile_splits_the_slice_and_compiles_the_union_transfer(capsys):
    # v5p-16: 8 chips on 2 hosts of 4; async.rollout_devices 0 gives each host's first 2 chips (by id) to the
    # rollout, its last 2 to the trainer: 4 train (fsdp 4), 4 sample in replicas of tp=1
    from rljax.cli import main

    assert main(["compile", QUICKSTART, "trainer.mode=async", "rollout.tensor_parallel_size=1", "--topology", "v5p-16",
                 "--programs", "train,handoff,decode", "--no-roofline"]) == 0
    out = capsys.readouterr().out
    assert "trainer.mode=async: 4 of the 8 chips train (mesh {'data': 1, 'fsdp': 4, 'tensor': 1}), " \
           "4 sample (4 replicas x tp=1)\n" in out, out
    # the run itself refuses async on several processes today: the compile says so and compiles all the same
    assert "note: a run on 2 hosts stops here today: data.val_files: trainer.mode=async validates on the trainer's" in out
    rows = out[out.index("\nprogram "):].strip().splitlines()[1:]
    names = [r.split("  ")[0] for r in rows[:4]]
    assert names == ["actor train step [256x40, 1 micro]",
                     "weight transfer (trainer chips -> rollout chips, one program over the union of 8 chips)",
                     "weight hand-off (float32, trainer layout on the rollout chips -> 4 replicas x tp=1)",
                     "decode [128x1 x 4 steps, W=5, pallas_tpu attention]"], out
    assert "FAILED" not in out
    assert rows[-3].startswith("trainer chips (4): ") and "rljax plan" in rows[-3]
    assert rows[-2].startswith("rollout chips (4): ")
    # each of the 4 one-chip replicas compiles the decode program for its own chip; on CPU / GPU the 2
    # replicas of each of the 2 hosts would share one
    assert rows[-1].startswith("sampler programs above: 1, compiled in ") and \
        "on every one of its 4 replicas (4 compiles, " in rows[-1], out
    assert rows[-1].endswith("replicas of one process share one: 2 compiles)"), out

    # the programs' chips: the train step on ids 2, 3, 6, 7; the transfer over all 8, row 0 the trainer's, each
    # paired with a rollout chip of its host; decode on one replica (its own 1-chip topology)
    cfg = load_config(RLConfig, QUICKSTART, ["trainer.mode=async", "rollout.tensor_parallel_size=1"])
    tpu = parse_slice("v5p-16")
    devices = slice_devices(tpu)
    from rljax.rl.async_config import split_devices

    split = split_devices(devices, "async", 0)
    run = run_programs(cfg, list(split.trainer), num_pages=default_pages(cfg),
                       replica_devices=slice_devices(sub_slice(tpu, 1)), rollout_devices=list(split.rollout))
    train = run.programs[0]
    transfer, reshard = [p for p in run.programs if p.kind == "handoff"]
    assert train.kind == "train" and sorted(d.id for d in train.mesh.devices.flat) == [2, 3, 6, 7]
    assert transfer.estimate == "transfer" and transfer.mesh.axis_names[0] == "role"
    trainer_row, rollout_row = transfer.mesh.devices[0].flat, transfer.mesh.devices[1].flat
    assert sorted(d.id for d in trainer_row) == [2, 3, 6, 7] and sorted(d.id for d in rollout_row) == [0, 1, 4, 5]
    assert all(a.process_index == b.process_index for a, b in zip(trainer_row, rollout_row))
    assert sorted(d.id for d in reshard.mesh.devices.flat) == [0, 1, 4, 5]
    assert run.programs[-1].kind == "decode" and run.programs[-1].devices == 1


@needs_libtpu
def test_async_compile_on_one_host_says_the_split_and_has_no_transfer_program(capsys):
    from rljax.cli import main

    assert main(["compile", QUICKSTART, "trainer.mode=one_step_off", "rollout.tensor_parallel_size=1",
                 "--topology", "v5e:2x2", "--programs", "handoff"]) == 1
    captured = capsys.readouterr()
    assert "trainer.mode=one_step_off: 2 of the 4 chips train (mesh {'data': 1, 'fsdp': 2, 'tensor': 1}), " \
           "2 sample (2 replicas x tp=1)\n" in captured.out
    assert "one host: the weights cross from the trainer's chips to the rollout chips by a jax.device_put" \
        in captured.out
    assert "--programs handoff: this run has no program of those kinds" in captured.err


# ---- supervised runs (SFT, reward model, DPO) ----------------------------------------------------

SFT, RM, DPO = "configs/sft_tiny.yaml", "configs/rm_tiny.yaml", "configs/dpo_tiny.yaml"
SFT_KEYS = {"input_ids", "attention_mask", "segment_ids", "positions", "loss_mask"}
PAIR_KEYS = {f"{side}_{k}" for side in ("chosen", "rejected")
             for k in ("input_ids", "attention_mask", "positions", "loss_mask")}


@pytest.mark.parametrize("path, overrides, train, forward, keys, frozen", [
    # sft_tiny: 32 rows of max_length 64, trainer.micro_batch_size 16 -> 2 micro-batches
    (SFT, [], "sft train step [32x64, 2 micro]", "validation forward (sft) [32x64]", SFT_KEYS, False),
    (RM, [], "rm train step [32 pairs x 64, 1 micro]", "validation forward (rm) [32 pairs x 64]", PAIR_KEYS, False),
    (DPO, ["data.val_batch_size=16", "trainer.micro_batch_size=8"], "dpo train step [32 pairs x 64, 4 micro]",
     "validation forward (dpo + reference) [16 pairs x 64]", PAIR_KEYS, True),
    (DPO, ["dpo.reference_free=true"], "dpo train step [32 pairs x 64, 1 micro]",
     "validation forward (dpo) [32 pairs x 64]", PAIR_KEYS, False),
])
def test_supervised_programs_are_the_runs_step_and_validation_forward(path, overrides, train, forward, keys, frozen):
    """Built on 4 CPU devices (no libtpu needed): the shapes and layouts the run gives them."""
    cfg = load_config(RunConfig, path, overrides)
    devices = jax.devices()[:4]
    run = supervised_programs(cfg, devices)
    assert [(p.name, p.kind) for p in run.programs] == [(train, "train"), (forward, "forward")]
    step, evaluate = run.programs
    state, batch, reference, base = step.args
    assert base is None and set(batch) == keys
    rows = cfg.data.batch_size
    for value in batch.values():
        assert value.shape == (rows, 64) and value.sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"))
    assert batch[next(k for k in keys if k.endswith("loss_mask"))].dtype == jax.numpy.float32
    assert batch[next(k for k in keys if k.endswith("input_ids"))].dtype == jax.numpy.int32
    pair = 2 if keys == PAIR_KEYS else 1
    assert step.tokens == rows * pair * 64
    assert evaluate.tokens == (cfg.data.val_batch_size or rows) * pair * 64
    # the validation forward reads the trained params as the step's state holds them, and the same reference
    assert evaluate.args[0] is state.params and evaluate.args[2] is reference
    if frozen:  # DPO's reference: the decoder's weights again, same shapes and layout, no optimizer state
        assert jax.tree.map(lambda x: (x.shape, x.sharding), reference) == \
            jax.tree.map(lambda x: (x.shape, x.sharding), state.params)
    else:
        assert reference is None
    # the reward model trains a scalar head over the decoder ([hidden], split over fsdp like the embeddings)
    assert ("score" in state.params) == (path == RM)


def test_a_supervised_run_without_validation_files_has_no_validation_forward():
    cfg = load_config(RunConfig, SFT, ["data.val_files=[]"])
    run = supervised_programs(cfg, jax.devices()[:4])
    assert [p.kind for p in run.programs] == ["train"]
    assert run.notes == ["data.val_files is empty: the run does not validate (no validation forward)"]


@needs_libtpu
@pytest.mark.parametrize("path", [SFT, RM, DPO])
def test_supervised_programs_compile_for_a_tpu_with_memory_per_chip(path, v5e_2x2):
    cfg = load_config(RunConfig, path)
    run = supervised_programs(cfg, v5e_2x2)
    compiled = compile_run(run)
    step, evaluate = compiled
    for result in compiled:
        assert result.error is None, (result.program.name, result.error)
        assert result.fits(CHIPS["v5e"]) and result.peak_bytes > 0
    # per chip (fsdp 4): the donated train state comes back in place; DPO's reference is read beside it
    state, _, reference, _ = step.program.args
    state_bytes = planned_bytes(state, jax.tree.map(lambda s: s.sharding, state))
    reference_bytes = 0 if reference is None else planned_bytes(reference, jax.tree.map(lambda s: s.sharding,
                                                                                         reference))
    assert (reference_bytes > 0) == (path == DPO)
    assert step.alias_bytes >= state_bytes > 0
    assert step.argument_bytes >= state_bytes + reference_bytes
    params_bytes = planned_bytes(state.params, jax.tree.map(lambda s: s.sharding, state.params))
    assert evaluate.argument_bytes >= params_bytes + reference_bytes
    table = render(compiled, CHIPS["v5e"], {"train": 1})
    assert [line.split("  ")[0] for line in table[1:]] == [c.program.name for c in compiled]
    assert "FAILED" not in "\n".join(table)


@needs_libtpu
def test_compile_command_compiles_a_supervised_config(capsys):
    from rljax.cli import main

    assert main(["compile", SFT, "--topology", "v5e-4", "--no-roofline"]) == 0
    out = capsys.readouterr().out
    assert "mesh {'data': 1, 'fsdp': 4, 'tensor': 1}; model qwen2" in out and "trainer.algorithm=sft" in out
    rows = out[out.index("\nprogram "):].strip().splitlines()[1:]
    assert [r.split("  ")[0] for r in rows] == ["sft train step [32x64, 2 micro]", "validation forward (sft) [32x64]"]
    # compiled GiB per chip, and rljax plan's estimate for the train step
    train, forward = (r.split() for r in rows)
    assert float(train[6]) > 0 and float(train[7]) > 0 and float(forward[4]) > 0
    assert "roofline" not in out
