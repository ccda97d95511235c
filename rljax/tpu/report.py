"""Compile programs for a TPU and read what the compiler says: memory per chip, cost,
and a roofline bound.

Memory per chip (`peak_bytes`): arguments + outputs - outputs aliased to donated
arguments + temporaries + generated code, from `Compiled.memory_analysis()`. That is
what the program needs while it runs, with its inputs resident; it is compared with the
chip's HBM (`rljax.tpu.topology.Chip.hbm_bytes`).

Roofline (an ESTIMATE, an upper bound on speed): `cost_analysis()` gives per-chip FLOPs
and HBM bytes of one call, but XLA counts the body of a loop once, whatever its trip
count, and every program here loops over layers (`lax.scan`). So the costs are measured
on the same program built with 0 and 1 layers, one micro-batch and one decode step per
call (loops of one trip are removed by XLA), and extrapolated linearly in layers:

    F(L) = F(0) + L (F(1) - F(0)),   B(L) likewise
    t >= max(F / peak FLOP/s, B / HBM bandwidth)          (per chip, one call)
    MFU <= model FLOPs per chip / (peak x t)                (train step)
    decode tokens/s <= rows / t per replica, x replicas     (one decode step)

Model FLOPs are `ModelConfig.flops_per_token` (6N plus attention for training). Not
counted: collectives' time (ICI), the overlap the bound assumes perfect, a chunked
log-prob loop of more than one 1024-token chunk (counted once), weights read once per
mini-batch instead of once per micro-batch, and the work inside Pallas kernels (splash
attention is a custom call, opaque to XLA's cost analysis: its FLOPs and bytes are 0),
so both are added by hand, shown apart as "in Pallas kernels": the decode step's TPU
paged-attention K / V reads, the bulk of a decode step's HBM traffic at long context
(`Program.kernel_bytes`, for full page tables), and the train step's splash attention
FLOPs by the model-FLOPs convention (`Program.kernel_flops`, less than the kernel
really does, so the bound stays an upper bound; without them a long-context train step
showed an MFU bound above 100%). A train step's FLOPs are at least its model FLOPs
(the count still misses the chunked log-prob loop's later chunks: for a small model
with a large vocabulary, Qwen2.5-0.5B at 1536 tokens, it falls below them), so the
bound uses the larger of the two and an MFU bound never exceeds 100%.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from rljax.rollout.scheduler import StepKind
from rljax.tpu.programs import Program, RunPrograms, run_programs
from rljax.tpu.topology import Chip

SAMPLER_KINDS = frozenset(kind.value for kind in StepKind)  # the sampler's programs: prefill, decode, mixed

GiB = 1024**3


@dataclass
class Compiled:
    """One program's compile result; `error` set (and sizes 0) when it did not compile."""

    program: Program
    seconds: float
    peak_bytes: int = 0
    argument_bytes: int = 0
    output_bytes: int = 0
    alias_bytes: int = 0
    temp_bytes: int = 0
    code_bytes: int = 0
    flops: float = 0.0  # per chip, loop bodies once (see the module docstring)
    bytes_accessed: float = 0.0
    error: str | None = None

    def fits(self, chip: Chip) -> bool:
        return self.error is None and self.peak_bytes <= chip.hbm_bytes


def compile_program(program: Program) -> Compiled:
    """Lower and compile; a failure is kept as a one-line `error`, not raised."""
    start = time.perf_counter()
    try:
        compiled = program.lower().compile()
    except Exception as e:  # noqa: BLE001 - report every program, whatever stops one
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return Compiled(program, time.perf_counter() - start, error=f"{type(e).__name__}: {first[:300]}")
    m = compiled.memory_analysis()
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, list):  # older jax: one dict per module
        cost = cost[0] if cost else {}
    peak = (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
            + m.generated_code_size_in_bytes)
    return Compiled(program, time.perf_counter() - start, peak, m.argument_size_in_bytes, m.output_size_in_bytes,
                    m.alias_size_in_bytes, m.temp_size_in_bytes, m.generated_code_size_in_bytes,
                    float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0)))


@dataclass(frozen=True)
class Roofline:
    """The bound of one program (module docstring), per chip and per call."""

    name: str
    kind: str
    flops: float  # compiler FLOPs per chip, extrapolated to every layer
    bytes: float  # compiler HBM bytes per chip, likewise, plus kernel_bytes
    seconds: float  # max(flops / peak, bytes / bandwidth)
    bound: str  # "compute" or "memory"
    mfu: float  # train: model FLOPs per chip / (peak x seconds); else 0
    tokens_per_s: float  # decode, prefill, mixed: tokens per call / seconds, per replica; else 0
    kernel_bytes: float = 0.0  # of `bytes`: read inside Pallas kernels (`Program.kernel_bytes`), not by XLA
    kernel_flops: float = 0.0  # of `flops`: inside Pallas kernels (`Program.kernel_flops`), not counted by XLA


def roofline(program: Program, zero: Compiled, one: Compiled, layers: int, chip: Chip) -> Roofline:
    """The bound of `program` from its 0- and 1-layer builds (`zero`, `one`)."""
    flops = zero.flops + layers * (one.flops - zero.flops) + program.kernel_flops
    if program.kind == "train":  # a step does at least its model FLOPs, whatever the count missed
        flops = max(flops, program.model_flops / program.devices)
    nbytes = zero.bytes_accessed + layers * (one.bytes_accessed - zero.bytes_accessed) + program.kernel_bytes
    compute, memory = flops / chip.peak_flops, nbytes / chip.hbm_bandwidth
    seconds = max(compute, memory, 1e-12)
    mfu = program.model_flops / program.devices / (chip.peak_flops * seconds) if program.kind == "train" else 0.0
    tokens = program.tokens / seconds if program.kind in SAMPLER_KINDS else 0.0
    return Roofline(program.name, program.kind, flops, nbytes, seconds, "compute" if compute >= memory else "memory",
                    mfu, tokens, program.kernel_bytes, program.kernel_flops)


def layer_rooflines(build, layers: int, chip: Chip, kinds=("train", "decode")) -> list[Roofline]:
    """Rooflines of the first program of each of `kinds` that `build(n)` makes: its costs
    measured on the builds of 0 and 1 layers (`build(0)`, `build(1)`), extrapolated to
    `layers`, for the full build `build(None)`. `build` makes the run's programs with one
    micro-batch and one decode step per call (the module docstring)."""
    zero_build, one_build, full = build(0), build(1), build(None)
    out = []
    for kind in kinds:
        index = next((i for i, p in enumerate(full.programs) if p.kind == kind), None)
        if index is None:
            continue
        zero, one = (compile_program(b.programs[index]) for b in (zero_build, one_build))
        if zero.error or one.error:
            continue
        out.append(roofline(full.programs[index], zero, one, layers, chip))
    return out


def roofline_programs(cfg, devices, chip: Chip, num_pages: int, kinds=("train", "decode"),
                      replica_devices: list | None = None, rollout_devices: list | None = None) -> list[Roofline]:
    """Rooflines of the RL run's first program of each of `kinds` (the actor's train
    step, the decode step), measured on 0- and 1-layer builds of the same run
    (`run_programs`' `devices`, `replica_devices` and `rollout_devices`)."""
    from rljax.tpu.programs import model_config

    model = model_config(cfg)

    def build(layers):
        config = None if layers is None else dataclasses.replace(model, num_hidden_layers=layers)
        return run_programs(cfg, devices, config=config, num_pages=num_pages, single_micro_batch=True,
                            num_scheduler_steps=1, replica_devices=replica_devices, rollout_devices=rollout_devices)

    return layer_rooflines(build, model.num_hidden_layers, chip, kinds)


def render(compiled: list[Compiled], chip: Chip, estimates: dict[str, int] | None = None,
           rooflines: list[Roofline] | None = None, replicas: int = 1) -> list[str]:
    """The table: per-chip memory from the compiler (and plan's formula where it has one:
    `estimates` keyed by `Program.estimate`, else by its kind)."""
    estimates = estimates or {}
    width = max(len(c.program.name) for c in compiled) + 2
    lines = [f"{'program':<{width}}{'compiled GiB':>13}{'plan GiB':>10}{'args':>8}{'temp':>8}{'compile s':>10}"]
    for c in compiled:
        name = c.program.name
        if c.error:
            lines.append(f"{name:<{width}}{'FAILED':>13}  {c.error}")
            continue
        est = estimates.get(c.program.estimate or c.program.kind)
        lines.append(f"{name:<{width}}{c.peak_bytes / GiB:>13.3f}{'' if est is None else f'{est / GiB:.3f}':>10}"
                     f"{c.argument_bytes / GiB:>8.3f}{c.temp_bytes / GiB:>8.3f}{c.seconds:>10.1f}")
    if rooflines:
        lines += ["", f"roofline ESTIMATE (upper bound; {chip.name}: {chip.peak_flops / 1e12:g} TFLOP/s bf16, "
                      f"{chip.hbm_bandwidth / 1e9:g} GB/s HBM, per chip):"]
        for r in rooflines:
            what = (f"MFU <= {r.mfu:.0%}" if r.kind == "train"
                    else f"<= {r.tokens_per_s:,.0f} tokens/s per replica, {r.tokens_per_s * replicas:,.0f} per slice")
            kernels = f" ({r.kernel_bytes / 1e9:.3f} GB of it in Pallas kernels)" if r.kernel_bytes else ""
            kernel_tflop = f" ({r.kernel_flops / 1e12:.3f} of it in Pallas kernels)" if r.kernel_flops else ""
            lines.append(f"  {r.name}: {r.flops / 1e12:.3f} TFLOP{kernel_tflop}, {r.bytes / 1e9:.3f} GB{kernels} "
                         "per chip per call -> "
                         f">= {r.seconds * 1e3:.2f} ms ({r.bound}-bound); {what}")
    return lines


def replica_compile_lines(compiled: list[Compiled], replicas: int, processes: int = 1) -> list[str]:
    """What the sampler programs above cost a run of `replicas` replicas on `processes`
    hosts to compile: on a TPU each replica compiles its own (an executable is built for
    its chips; `rljax.rollout.program_share`), where same-shaped CPU / GPU replicas of
    one process share one."""
    sampler = [c for c in compiled if c.program.kind in SAMPLER_KINDS and not c.error]
    if replicas <= 1 or not sampler:
        return []
    count, seconds = len(sampler), sum(c.seconds for c in sampler)
    compiles = lambda n: f"{n} compile" + ("s" if n != 1 else "")  # noqa: E731
    return [f"sampler programs above: {count}, compiled in {seconds:.1f} s here; a TPU run compiles each on every "
            f"one of its {replicas} replicas ({compiles(replicas * count)}, side by side in the replicas' threads): "
            f"a TPU executable is built for its chips (CPU / GPU replicas of one process share one: "
            f"{compiles(min(processes, replicas) * count)})"]


def overflow(compiled: list[Compiled], chip: Chip) -> list[str]:
    """One line per program that does not fit (or did not compile)."""
    out = []
    for c in compiled:
        if c.error and "RESOURCE_EXHAUSTED" in c.error:  # the TPU compiler checks HBM itself
            out.append(f"{c.program.name}: does not fit {chip.name}'s {chip.hbm_bytes / GiB:.0f} GiB HBM per chip "
                       f"(the compiler: {c.error})")
        elif c.error:
            out.append(f"{c.program.name}: did not compile: {c.error}")
        elif c.peak_bytes > chip.hbm_bytes:
            out.append(f"{c.program.name}: needs {c.peak_bytes / GiB:.2f} GiB per chip, {chip.name} has "
                       f"{chip.hbm_bytes / GiB:.0f} GiB (over by {(c.peak_bytes - chip.hbm_bytes) / GiB:.2f} GiB)")
    return out


def compile_run(programs: RunPrograms) -> list[Compiled]:
    return [compile_program(p) for p in programs.programs]
