"""`rljax export RUN_DIR_OR_CHECKPOINT --out HF_DIR [--step N] [--dtype bfloat16] [--overwrite]`.

`--out` must be a new or empty folder: exporting replaces config.json, the tokenizer
files and every `model*.safetensors` there, so a folder that holds files (a base model,
say) is refused unless `--overwrite` says to replace them.
"""

from __future__ import annotations

import os
import socket

HELP = "Write a checkpoint of a run as a Hugging Face folder (weights, config, tokenizer)."


def add_arguments(parser) -> None:
    parser.add_argument("checkpoint", help="run directory, its checkpoints/ directory, or one step directory")
    parser.add_argument("--out", required=True, help="output Hugging Face folder")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    parser.add_argument("--dtype", default=None, help="weights dtype (default: the training param dtype)")
    parser.add_argument("--max-shard-size", default="5GB")
    parser.add_argument("--lora-format", choices=("merged", "peft"), default="merged",
                        help="a LoRA run: the full model with the adapters merged in (default), or a PEFT "
                             "adapter folder (adapter_config.json + adapter_model.safetensors)")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into --out even if it holds files (its model files are replaced and deleted)")


def check_out(out: str, overwrite: bool) -> None:
    """Refuse an --out that is a file, a folder that holds files (unless `overwrite`), or
    a folder this process cannot create or write into (read-only, no permission), each
    in one line naming the folder and why, before anything is read."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise SystemExit(f"rljax export: --out {out} is a file, not a folder")
    held = sorted(os.listdir(out)) if os.path.isdir(out) else []
    if held and not overwrite:
        shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
        raise SystemExit(f"rljax export: --out {out} is not empty ({shown}); exporting there would replace and "
                         "delete its model files: choose a new folder, or pass --overwrite")
    probe = os.path.join(out, f".rljax-write-probe-{socket.gethostname()}-{os.getpid()}")
    try:
        os.makedirs(out, exist_ok=True)
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        os.remove(probe)
    except OSError as e:
        raise SystemExit(f"rljax export: --out {out} cannot be written: {e.strerror or e}"
                         + (f" ({e.filename})" if e.filename and e.filename not in (out, probe) else "")) from None


# run kind (`rljax.commands.run_kinds.run_kind`) -> (module, function) writing its checkpoint as a
# Hugging Face folder; imported when called, so `rljax --help` loads neither
EXPORTERS: dict[str, tuple[str, str]] = {
    "supervised": ("rljax.train.export", "export_checkpoint"),  # the trained module (reward model: its head)
    "rl": ("rljax.rl.policy_checkpoint", "export_policy"),  # the actor alone
}


def export_run(path: str, out: str, step: int | None = None, dtype: str | None = None,
               max_shard_size: str = "5GB", lora_format: str = "merged") -> str:
    """Export the run `path` names (a run directory, its checkpoints/ or one step) with the
    exporter of its kind, read from the run's `config.yaml`."""
    import importlib

    from rljax.commands.run_kinds import checkpoint_kind

    module, name = EXPORTERS[checkpoint_kind(path)]
    export = getattr(importlib.import_module(module), name)
    return export(path, out, step=step, dtype=dtype, max_shard_size=max_shard_size, lora_format=lora_format)


def main(args) -> int:
    from rljax.distributed import initialize, print0

    check_out(args.out, args.overwrite)  # before any process can write there
    initialize()  # jax.distributed from RLJAX_* / TPU environment; no-op for one process
    path = export_run(args.checkpoint, args.out, step=args.step, dtype=args.dtype, max_shard_size=args.max_shard_size,
                      lora_format=args.lora_format)
    from rljax.train.export import export_source

    source = export_source(path)
    print0(f"exported step {source['step']} of {source['run']} to {path}" if source else f"wrote {path}")
    return 0
