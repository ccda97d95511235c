"""The `rljax` command line: one entry point, one module per subcommand.

Each subcommand lives in `rljax/commands/<name>.py` and defines `HELP`,
`add_arguments(parser)` and `main(args) -> int | None`. Command modules keep
heavy imports (jax, transformers) inside `main`, so `rljax --help` is instant.

A subcommand that needs arguments, given none (`rljax train`), prints its usage and
arguments on stderr and exits 2.

Errors: a known error (`is_known_error`: a bad config, data file, model or checkpoint
folder, sampler setting, reward function...) prints as ``rljax: error: <message>`` on
stderr, plus one line saying where the traceback is: an error that stopped a run (it
carries `rljax_log`, set by `rljax.runs.Run.close`) has its traceback appended to the
run's `log.txt`, any other is shown by ``--debug``; it exits 2 for a config error, 1
otherwise. A command's own refusal (`raise SystemExit("<why>")`) prints in the same
form and exits 1. Anything else (a bug) keeps its traceback. ``--debug`` (before or after the
subcommand) or ``RLJAX_DEBUG=1`` shows the traceback of every error.

Exit status: 0 done; 1 an error; 2 a config error or a usage error; 130 Ctrl-C (the save
in flight finished, one line says where the run stopped); 75 (`PREEMPTED_EXIT_CODE`) a
run stopped by SIGTERM at a step every process agreed on, with that step saved
(`rljax.runs.Preempted`): the launchers read it as "run the same command again to resume".
"""

from __future__ import annotations

import argparse
import importlib
import linecache
import os
import re
import sys

from rljax import xla_flags

# name -> module under rljax.commands. Add a line here to add a subcommand.
COMMANDS: dict[str, str] = {
    "generate": "generate",
    "train": "train",
    "eval": "eval",
    "export": "export",
    "bench": "bench",
    "plan": "plan",
    "compile": "compile",
    "plot": "plot",
    "config": "config",
}

DEBUG_ENV = "RLJAX_DEBUG"
PREEMPTED_EXIT_CODE = 75  # sysexits.h EX_TEMPFAIL: a temporary failure, to be retried
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# built-in exception types that rljax code raises on purpose, with a message for the user
_RAISED_ON_PURPOSE = (ValueError, KeyError, RuntimeError, TypeError, OSError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rljax", description="RL post-training for language models in JAX/Flax."
    )
    parser.add_argument("--debug", action="store_true",
                        help=f"show the full traceback of an error (or set {DEBUG_ENV}=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    parser.command_parsers = {}  # name -> the subcommand's parser
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"rljax.commands.{module_name}")
        p = parser.command_parsers[name] = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the full traceback of an error")
        p.set_defaults(_command_main=module.main)
    return parser


def _raised_in_rljax(error: BaseException) -> bool:
    """Whether `error` was raised by a `raise` statement in rljax's own code (its innermost
    frame is in the package and on a line that starts with `raise`), not by Python or a
    library failing inside it."""
    tb = error.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    filename = os.path.abspath(tb.tb_frame.f_code.co_filename)
    if not filename.startswith(_PACKAGE_DIR + os.sep):
        return False
    return linecache.getline(filename, tb.tb_lineno).lstrip().startswith("raise")


def is_known_error(error: BaseException) -> bool:
    """An error that explains itself: a type rljax defines (`ConfigError`, `DataError`,
    `ShardingError`, `CheckpointMismatchError`, `RewardFailureError`, ...), a missing or
    unreadable file, or a built-in error rljax raised on purpose with a message."""
    if type(error).__module__.split(".")[0] == "rljax":
        return True
    if isinstance(error, OSError) and error.filename is not None:
        return True
    return isinstance(error, _RAISED_ON_PURPOSE) and _raised_in_rljax(error)


def error_message(error: BaseException) -> str:
    """One line: the error's message (a KeyError's without the quotes), whitespace folded."""
    if isinstance(error, KeyError) and len(error.args) == 1 and isinstance(error.args[0], str):
        text = error.args[0]
    elif isinstance(error, OSError) and error.filename is not None and error.strerror:
        text = f"{error.strerror}: {error.filename}"
    else:
        text = str(error) or type(error).__name__
    return " ".join(text.split())


def _exit_code(error: BaseException) -> int:
    from rljax.config import ConfigError

    return 2 if isinstance(error, ConfigError) else 1


def needs_arguments(parser: argparse.ArgumentParser) -> bool:
    """Whether a subcommand's parser has a required positional argument (a config file, an action)."""
    return any(action.required for action in parser._actions if not action.option_strings)


def main(argv: list[str] | None = None) -> int:
    xla_flags.apply()  # before any command starts a JAX backend
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    words = [word for word in argv if word != "--debug"]
    if len(words) == 1 and words[0] in parser.command_parsers and needs_arguments(parser.command_parsers[words[0]]):
        parser.command_parsers[words[0]].print_help(sys.stderr)  # `rljax train` alone: its usage and arguments
        return 2
    args = parser.parse_args(argv)
    debug = args.debug or os.environ.get(DEBUG_ENV, "").lower() not in ("", "0", "false", "no")
    try:
        return int(args._command_main(args) or 0)
    except SystemExit as stop:  # a command's refusal, `raise SystemExit("<why>")`: the same one-line form
        if debug or not isinstance(stop.code, str):
            raise
        print(f"rljax: error: {' '.join(re.sub(r'^rljax( [a-z]+)?: ', '', stop.code).split())}", file=sys.stderr)
        print(f"rljax: (--debug or {DEBUG_ENV}=1 shows the traceback)", file=sys.stderr)
        return 1
    except KeyboardInterrupt as interrupt:
        if debug:
            raise
        if not getattr(interrupt, "rljax_reported", False):  # a run already said where it stopped
            print("rljax: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        runs = sys.modules.get("rljax.runs")  # only a run raises Preempted, and a run has imported it
        if runs is not None and isinstance(error, runs.Preempted):
            print(f"rljax: {error_message(error)}", file=sys.stderr)
            return PREEMPTED_EXIT_CODE
        if debug or not is_known_error(error):
            raise
        print(f"rljax: error: {error_message(error)}", file=sys.stderr)
        log = _log_traceback(error, argv)
        print(f"rljax: the traceback is in {log}" if log else f"rljax: (--debug or {DEBUG_ENV}=1 shows the traceback)",
              file=sys.stderr)
        return _exit_code(error)


def _log_traceback(error: BaseException, argv: list[str]) -> str | None:
    """Append `error`'s traceback to the log file of the run it stopped (`rljax_log`);
    -> that path, or None when there is none or it cannot be written (a full disk)."""
    import datetime
    import traceback

    path = getattr(error, "rljax_log", None)
    if not path:
        return None
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        with open(path, "a") as f:
            f.write(f"{when} rljax {' '.join(argv)}\n{''.join(traceback.format_exception(error))}\n")
    except OSError:
        return None
    return path


if __name__ == "__main__":
    sys.exit(main())
