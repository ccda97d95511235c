"""`rljax compile CONFIG [key.sub=value ...] --topology v5e-16 [--num-slices N] [--programs KINDS]`:
compile, for a TPU slice, every program a run of CONFIG executes (or those of the kinds
`--programs train,decode` names), without the TPU.

libtpu (`pip install "jax[tpu]==<installed jax>"`) describes the slice's devices on any
host; the run's mesh is built over them by the trainers' own code and every program is
lowered on abstract shapes and compiled for that TPU. Which programs depends on the run
kind (`rljax.commands.run_kinds`; one `PREPARE` entry each): an RL run's train steps,
batch forwards, the sampler's prefill and decode at its largest buckets and the weight
hand-off (`rljax.tpu.programs`); a supervised run's (SFT, reward model, DPO) train step
with its real micro-batches and its validation forward (`rljax.tpu.supervised`). Printed
per program: memory per chip from the compiler next to `rljax plan`'s formula, and a
roofline bound from the compiler's cost (`rljax.tpu.report`, an estimate; the train and
decode steps). Exit status 1, with one line per program, when a program does not fit the
chip's HBM or does not compile. JAX runs on the CPU here (JAX_PLATFORMS=cpu unless set).

An asynchronous `trainer.mode` (one_step_off, async) splits the slice as the run does
(`rljax.rl.async_config.split_devices`: each host's first `async.rollout_devices` chips
sample, the rest train): the train steps and batch forwards are compiled on the
trainer's chips, the sampler's on a replica of the rollout chips, and one more line
says the split, e.g. `trainer.mode=async: 8 of the 16 chips train (mesh {...}), 8
sample (8 replicas x tp=1)`. On several hosts the weight hand-off is two programs: the
transfer over the union of both sets (`rljax.rollout.cross_transfer.UnionTransfer`'s,
plan: twice a trainer chip's params, a block in and one out) and the reshard within the
rollout chips; on one host it is a `jax.device_put` between the sets (no program). A
note names what `rljax.rl.async_config.check_processes` refuses for a run of the config
on the slice's hosts (the programs are compiled all the same). After
the table, one line per side: its largest program's memory per chip against `rljax
plan`'s for that side.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Callable

HELP = "Compile every program of a run (RL, SFT, RM, DPO) for a TPU slice (no TPU needed): per-chip memory."


def add_arguments(parser) -> None:
    parser.add_argument("config", help="YAML config file of a run, RL or supervised (see configs/)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. mesh.fsdp=16 rollout.tensor_parallel_size=4")
    parser.add_argument("--topology", required=True,
                        help="TPU slice: v5e-16, v5litepod-16, v6e-16, v5p-32 (cores), or v5e:4x4 (chips)")
    parser.add_argument("--num-slices", type=int, default=1, help="slices of that topology (multislice; default 1)")
    parser.add_argument("--all-buckets", action="store_true",
                        help="compile a prefill program for every usable chunk bucket (default: the extremes)")
    parser.add_argument("--programs", default=None, metavar="KINDS",
                        help="compile only these program kinds, comma-separated, e.g. train,decode (kinds: train, "
                             "forward, handoff, prefill, decode; a supervised run has train and forward; default "
                             "all); the roofline covers train and decode when chosen")
    parser.add_argument("--no-roofline", action="store_true", help="skip the roofline (4 more small compiles)")


def _estimates(cfg, devices: int, hbm_gb: float) -> dict[str, int]:
    """`rljax plan`'s per-device bytes for the kinds of program it models, of the run
    config `cfg`."""
    from rljax.commands.plan import make_plan

    plan = make_plan(cfg, devices=devices, device_memory_gb=hbm_gb, backend="tpu")
    out = {"train": plan.total}
    if plan.rollout is not None:
        out["decode"] = out["prefill"] = out["mixed"] = plan.rollout.weights_bytes + plan.rollout.kv_bytes
        out["handoff"] = 2 * plan.rollout.weights_bytes
    # the union transfer: each chip holds one block of a trainer chip's params (cast as the replicas hold them)
    # in and one out
    params = next(nbytes for name, nbytes in plan.rows if name.startswith("params"))
    if plan.rollout is not None:
        params = params * plan.rollout.weights_bytes // plan.rollout.uncast_weights_bytes
    out["transfer"] = 2 * params
    return out


TRAINER_KINDS, ROLLOUT_KINDS = ("train", "forward"), ("prefill", "decode", "mixed", "handoff")


def side_lines(compiled, estimates: dict[str, int], trainer_chips: int, rollout_chips: int) -> list[str]:
    """Under a split, per side (the trainer's chips: train steps and forwards; the rollout
    chips: prefill, decode and the reshard into the replicas; the union transfer spans
    both and is left out): the largest compiled memory per chip and `rljax plan`'s
    largest estimate among the same programs."""
    lines = []
    for side, chips, kinds in (("trainer", trainer_chips, TRAINER_KINDS), ("rollout", rollout_chips, ROLLOUT_KINDS)):
        mine = [c for c in compiled if c.error is None and c.program.kind in kinds and c.program.estimate != "transfer"]
        if not mine:
            continue
        top = max(mine, key=lambda c: c.peak_bytes)
        plans = [estimates[c.program.kind] for c in mine if c.program.kind in estimates]
        plan = f"{max(plans) / 2**30:.3f} GiB" if plans else "no estimate"
        lines.append(f"{side} chips ({chips}): {top.peak_bytes / 2**30:.3f} GiB per chip compiled "
                     f"({top.program.name}); rljax plan {plan}")
    return lines


@dataclass
class Prepared:
    """One run kind's programs for the slice, and what the report prints around them."""

    run: object  # rljax.tpu.programs.RunPrograms
    lines: list[str]  # under the title: the mesh, the model, the split, notes
    estimates: dict[str, int]  # `rljax plan`'s per-chip bytes, by program kind (`_estimates`)
    rooflines: Callable[[tuple[str, ...]], list]  # kinds -> their rooflines (`rljax.tpu.report.Roofline`)
    roofline_kinds: tuple[str, ...]  # the kinds a roofline is measured for
    replicas: int = 1  # rollout replicas (the decode bound per slice)
    after: Callable[[list], list[str]] = lambda compiled: []  # lines under the table


def _model_line(run) -> str:
    return (f"mesh {dict(run.mesh.shape)}; model {run.model.model_type} {run.model.num_params() / 1e9:.2f}B params, "
            f"{run.model.num_hidden_layers} layers")


def prepare_rl(cfg, args, tpu, devices) -> Prepared:
    """An RL run (`cfg`: an `RLConfig`): the train steps, batch forwards, the sampler's
    programs and the hand-off (the module docstring), on the slice split as
    `trainer.mode` splits it."""
    from rljax.config import ConfigError
    from rljax.rl.async_config import check_processes, split_devices
    from rljax.tpu.programs import default_pages, run_programs
    from rljax.tpu.report import replica_compile_lines, roofline_programs
    from rljax.tpu.topology import slice_devices, sub_slice

    pages = default_pages(cfg)
    tp = cfg.rollout.tensor_parallel_size
    mode = cfg.trainer.mode
    split = split_devices(devices, mode, cfg.async_.rollout_devices)
    apart = mode != "sync"  # the trainer's and the replicas' chips are disjoint
    train_on = list(split.trainer) if apart else devices
    rollout_on = list(split.rollout) if apart else None
    replica = slice_devices(sub_slice(tpu, tp)) if 0 < tp and (apart or tp < len(devices)) else None
    run = run_programs(cfg, train_on, num_pages=pages, all_buckets=args.all_buckets, replica_devices=replica,
                       rollout_devices=rollout_on)
    hosts = len({d.process_index for d in devices})
    lines = [_model_line(run) + f"; KV pool {pages} pages of {cfg.rollout.page_size} tokens"
             + (f"; rollout {run.layout.num_replicas} replicas x tp={run.layout.tensor_parallel_size}" if run.layout
                else "")]
    if apart:
        lines.append(f"trainer.mode={mode}: {len(train_on)} of the {len(devices)} chips train (mesh "
                     f"{dict(run.mesh.shape)}), {len(rollout_on)} sample ({run.layout.num_replicas} replicas x "
                     f"tp={run.layout.tensor_parallel_size})")
        try:  # what a run of this config on these hosts refuses (the programs are compiled all the same)
            check_processes(cfg, hosts, len(devices) // hosts)
        except ConfigError as e:
            lines.append(f"note: a run on {hosts} hosts stops here today: {e}")
    estimates = _estimates(cfg, len(devices), tpu.chip.hbm_bytes / 1e9)

    def after(compiled):
        sides = side_lines(compiled, estimates, len(train_on), len(rollout_on)) if apart else []
        processes = len({d.process_index for d in run.layout.mesh.devices.flat}) if run.layout else 1
        lines = sides + replica_compile_lines(compiled, run.layout.num_replicas if run.layout else 1, processes)
        return ["", *lines] if lines else []

    return Prepared(run, lines + run.notes, estimates,
                    lambda kinds: roofline_programs(cfg, train_on, tpu.chip, pages, kinds=kinds,
                                                    replica_devices=replica, rollout_devices=rollout_on),
                    ("train", "decode", *(("prefill", "mixed") if cfg.rollout.mixed_steps else ())),
                    run.layout.num_replicas if run.layout else 1, after)


def prepare_supervised(cfg, args, tpu, devices) -> Prepared:
    """An SFT, reward-model or DPO run (`cfg`: a `RunConfig`): its train step and
    validation forward (`rljax.tpu.supervised`) on the mesh over the whole slice."""
    import dataclasses

    from rljax.tpu.programs import model_config
    from rljax.tpu.report import layer_rooflines
    from rljax.tpu.supervised import supervised_programs

    run = supervised_programs(cfg, devices)
    model = model_config(cfg)

    def build(layers):
        config = None if layers is None else dataclasses.replace(model, num_hidden_layers=layers)
        return supervised_programs(cfg, devices, config=config, single_micro_batch=True)

    lines = [_model_line(run) + f"; trainer.algorithm={cfg.trainer.algorithm}"]
    return Prepared(run, lines + run.notes, _estimates(cfg, len(devices), tpu.chip.hbm_bytes / 1e9),
                    lambda kinds: layer_rooflines(build, model.num_hidden_layers, tpu.chip, kinds), ("train",))


# run kind (`rljax.commands.run_kinds.run_kind`) -> how its programs are built for a slice:
# `(config, args, slice, devices) -> Prepared`, the config read by the kind's class (`RUN_CONFIGS`)
PREPARE: dict[str, Callable[..., Prepared]] = {"rl": prepare_rl, "supervised": prepare_supervised}


def load_checked(args, tpu):
    """The run config of `args.config` with its overrides, read by its run kind's class
    and checked for the slice's chip count (`rljax.config.validate`), before libtpu is
    loaded: a bad config is one `ConfigError` line. Also its run kind."""
    from rljax.commands.run_kinds import RUN_CONFIGS
    from rljax.commands.run_kinds import kind_of
    from rljax.config import ConfigError, load_config, validate

    kind = kind_of(args.config, args.overrides)
    cfg = load_config(RUN_CONFIGS[kind], args.config, args.overrides)
    if cfg.mesh.num_slices != args.num_slices:
        raise ConfigError(f"mesh.dcn_data={cfg.mesh.dcn_data} x mesh.dcn_fsdp={cfg.mesh.dcn_fsdp} = "
                          f"{cfg.mesh.num_slices} slice(s), but --num-slices {args.num_slices}: set the data / fsdp "
                          f"ways that cross slices (e.g. mesh.dcn_data={args.num_slices})")
    validate(cfg, num_devices=tpu.chips * args.num_slices)
    if cfg.model.lora.rank:
        raise ConfigError("model.lora.rank: rljax compile builds full fine-tuning programs only so far; "
                          "compile with model.lora.rank=0 for an upper bound")
    return kind, cfg


def main(args) -> int:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from rljax.tpu.programs import PROGRAM_KINDS, parse_kinds, select
    from rljax.tpu.report import compile_run, overflow, render
    from rljax.tpu.topology import parse_slice, slice_devices

    kinds = PROGRAM_KINDS if args.programs is None else parse_kinds(args.programs)
    tpu = parse_slice(args.topology)
    kind, cfg = load_checked(args, tpu)
    devices = slice_devices(tpu, args.num_slices)
    prepared = PREPARE[kind](cfg, args, tpu, devices)
    run = prepared.run
    hosts = len({d.process_index for d in devices})
    print(f"rljax compile: {args.config} for {args.num_slices} x {tpu.topology_name} ({len(devices)} chips "
          f"{devices[0].device_kind}, {hosts} hosts; {tpu.chip.hbm_bytes / 2**30:.0f} GiB HBM per chip)")
    for line in prepared.lines:
        print(line)
    chosen = select(run, kinds)
    if not chosen.programs:
        raise ValueError(f"--programs {args.programs}: this run has no program of those kinds "
                         f"(it has {', '.join(dict.fromkeys(p.kind for p in run.programs))})")
    compiled = compile_run(chosen)
    roofline_kinds = tuple(k for k in prepared.roofline_kinds if k in kinds)
    rooflines = None if args.no_roofline or not roofline_kinds else prepared.rooflines(roofline_kinds)
    print("\n".join(["", *render(compiled, tpu.chip, prepared.estimates, rooflines, prepared.replicas)]))
    after = prepared.after(compiled)
    if after:
        print("\n".join(after))
    problems = overflow(compiled, tpu.chip)
    for line in problems:
        print(f"rljax compile: {line}", file=sys.stderr)
    return 1 if problems else 0
