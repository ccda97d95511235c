"""`rljax train CONFIG [key.sub=value ...]`: run or resume a training run.

`trainer.algorithm` picks the kind of run (`rljax.commands.run_kinds.run_kind`, the rule
`rljax export` and `rljax eval` share): `sft`, `rm` and `dpo` run the supervised loop
(`rljax.train.loop`, config `RunConfig`); the RL algorithms (`grpo`, `ppo`, `dapo`, ...,
`rljax.rl.config.RL_ALGORITHMS`) run the RL loop (`rljax.rl.trainer`, config `RLConfig`,
whose defaults are the algorithm's preset, `rljax.rl.presets`: `ppo` sets
`algorithm.adv_estimator: gae` and so trains a critic); any other name is an error that
lists them.

The whole config is checked before anything is built (`rljax.config.validate`, with the
device count): a mistake is one line naming the key, within seconds. So is a run whose
memory plan (`rljax plan`) does not fit the machine, naming the micro-batch that does;
while it runs, a watch warns on stderr when host memory is nearly gone
(`rljax.memory.MemoryWatch`), so an out-of-memory kill never comes unannounced. Run again, the
command resumes the run; a config other than the saved one is refused, naming each
changed key, unless `--allow-config-change` (`rljax.runs.resume_changes`).
"""

from __future__ import annotations

import sys

HELP = "Train (SFT, reward model, DPO, PPO/GRPO and relatives) from a YAML config with dotted overrides."

# run kind -> (module, function) that runs it; imported when called, so `rljax --help` loads neither
TRAINERS: dict[str, tuple[str, str]] = {
    "supervised": ("rljax.train.loop", "train"),
    "rl": ("rljax.rl.trainer", "train_rl"),
}


def add_arguments(parser) -> None:
    parser.add_argument("config", help="YAML config file (see configs/)")
    parser.add_argument("overrides", nargs="*", default=[],
                        help="dotted overrides, e.g. optim.lr=1e-5 trainer.total_steps=50")
    parser.add_argument("--allow-config-change", action="store_true",
                        help="resume a run under a config other than its saved one (the change is recorded: "
                             "config.step-N.yaml and a config_change event in metrics.jsonl)")


def main(args) -> int:
    import importlib

    from rljax.commands.run_kinds import RUN_CONFIGS, kind_of
    from rljax.config import load_config, validate

    kind = kind_of(args.config, args.overrides)
    cfg = load_config(RUN_CONFIGS[kind], args.config, args.overrides)  # every value checked: no device needed

    from rljax.distributed import initialize

    initialize()  # jax.distributed from RLJAX_* / TPU environment; no-op for one process
    import jax

    validate(cfg, num_devices=jax.device_count())  # mesh and batch sizes, before anything is built
    check_memory(cfg, kind)
    from rljax.memory import MemoryWatch
    from rljax.runs import config_change_allowed

    module, name = TRAINERS[kind]
    watch = MemoryWatch(advice=f"`rljax plan {args.config}` shows where the memory goes").start()
    try:
        with config_change_allowed(args.allow_config_change):
            getattr(importlib.import_module(module), name)(cfg)
    finally:
        watch.stop()
    return 0


def check_memory(cfg, kind: str) -> None:
    """A `ConfigError` before anything is built when the run's memory plan does not fit
    (`rljax.commands.plan.check_fits`): on CPU against the host's free memory, shared by
    every local device; on an accelerator against one device's memory."""
    import jax

    from rljax.commands.plan import check_fits
    from rljax.config import ConfigError
    from rljax.memory import host_memory

    backend = jax.default_backend()
    try:
        if backend == "cpu":
            mem = host_memory()
            if mem is not None:
                check_fits(cfg, mem.available, len(jax.local_devices()), kv=kind == "rl", backend="cpu")
            return
        limit = (jax.local_devices()[0].memory_stats() or {}).get("bytes_limit")
        if limit:  # the sampler's pool takes a fraction of what training leaves: training alone must fit
            check_fits(cfg, int(limit), 1, kv=False, backend=backend)
    except ConfigError:
        raise
    except (Exception, SystemExit) as e:  # a config the planner cannot read still runs; it says so
        print(f"rljax: memory not checked: the plan failed ({type(e).__name__}: {e})", file=sys.stderr)
