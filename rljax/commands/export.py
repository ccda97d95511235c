"""`rljax export RUN_DIR_OR_CHECKPOINT --out HF_DIR [--step N] [--dtype bfloat16]`."""

from __future__ import annotations

HELP = "Write a checkpoint of a run as a Hugging Face folder (weights, config, tokenizer)."


def add_arguments(parser) -> None:
    parser.add_argument("checkpoint", help="run directory, its checkpoints/ directory, or one step directory")
    parser.add_argument("--out", required=True, help="output Hugging Face folder")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    parser.add_argument("--dtype", default=None, help="weights dtype (default: the training param dtype)")
    parser.add_argument("--max-shard-size", default="5GB")


def main(args) -> int:
    from rljax.train.export import export_checkpoint

    path = export_checkpoint(args.checkpoint, args.out, step=args.step, dtype=args.dtype,
                             max_shard_size=args.max_shard_size)
    print(f"wrote {path}")
    return 0
