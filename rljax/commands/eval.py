"""`rljax eval CONFIG [key.sub=value ...] [--checkpoint RUN] [--out FILE]`: validation
metrics of a policy on the config's `data.val_files` (see `rljax.rl.evaluate`).

The policy is the config's model (`model.path`, or random weights from `model.hf_config`),
or, with `--checkpoint`, the actor of an RL run (a run directory, its checkpoints/ or one
step directory; a supervised run's is refused before any work,
`rljax.commands.run_kinds.checkpoint_kind`). Sampling follows `rollout.val_kwargs` (n,
temperature, top_p, top_k) and rewards the config's `reward` section, exactly as
validation during training.
"""

from __future__ import annotations

HELP = "Evaluate a policy on a config's validation set: mean@k, pass@k, maj@k, reference perplexity."


def add_arguments(parser) -> None:
    parser.add_argument("config", help="an RL YAML config (see configs/)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.val_kwargs.n=8")
    parser.add_argument("--checkpoint", default=None, help="an RL run directory, its checkpoints/, or one step")
    parser.add_argument("--out", default=None, help="write the metrics as JSON here")
    parser.add_argument("--work-dir", default="runs/eval", help="where generated synthetic data sets go")


def main(args) -> int:
    import json
    import os

    from rljax.commands.run_kinds import checkpoint_kind
    from rljax.config import load_config
    from rljax.rl.config import RLConfig
    from rljax.rl.evaluate import evaluate

    from rljax.distributed import is_coordinator, initialize

    cfg = load_config(RLConfig, args.config, args.overrides)  # a ConfigError is one line (rljax.cli)
    if args.checkpoint is not None and checkpoint_kind(args.checkpoint) != "rl":
        raise ValueError(f"--checkpoint {args.checkpoint}: a supervised run, with no RL policy in it; export it "
                         "(rljax export) and set model.path to the export instead")
    initialize()  # jax.distributed from RLJAX_* / TPU environment; no-op for one process
    metrics = evaluate(cfg, checkpoint=args.checkpoint, work_dir=args.work_dir)
    if not is_coordinator():  # every process computed the same metrics; one prints and writes them
        return 0
    width = max((len(k) for k in metrics), default=0)
    for key in sorted(metrics):
        print(f"{key:<{width}}  {metrics[key]:.4f}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump(metrics, fh, indent=2, sort_keys=True)
        print(f"wrote {args.out}")
    return 0
