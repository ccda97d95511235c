"""Subcommands of the `rljax` CLI (see rljax/cli.py)."""
