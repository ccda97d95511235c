"""The `rljax` command line: one entry point, one module per subcommand.

Each subcommand lives in `rljax/commands/<name>.py` and defines `HELP`,
`add_arguments(parser)` and `main(args) -> int | None`. Command modules keep
heavy imports (jax, transformers) inside `main`, so `rljax --help` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> module under rljax.commands. Add a line here to add a subcommand.
COMMANDS: dict[str, str] = {
    "generate": "generate",
    "train": "train",
    "eval": "eval",
    "export": "export",
    "bench": "bench",
    "plan": "plan",
    "plot": "plot",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rljax", description="RL post-training for language models in JAX/Flax."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"rljax.commands.{module_name}")
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_command_main=module.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args._command_main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
