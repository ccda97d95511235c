#!/usr/bin/env python3
"""Run N rljax processes on this machine as one multi-host job (jax.distributed on CPU).

    python launch/local_multiprocess.py -n 2 --devices-per-process 4 -- train configs/sft_tiny.yaml trainer.total_steps=3

starts `python -m rljax.cli train ...` N times with

    RLJAX_COORDINATOR_ADDRESS=127.0.0.1:<free port>  RLJAX_NUM_PROCESSES=N  RLJAX_PROCESS_ID=i
    JAX_PLATFORMS=cpu  XLA_FLAGS=--xla_force_host_platform_device_count=<devices per process>

so the processes see N x D CPU devices in one mesh, with gloo collectives between them:
the same code path as a TPU slice with N hosts. Output lines are prefixed `[i]`.
`--dry-run` prints the commands and environments instead of running them.

Stopping: a process that fails (exit status other than 0 and 75) takes the others down
(SIGKILL: a checkpoint needs every process, so they could not save). Ctrl-C sends SIGINT
to all (each finishes the save in flight and exits 130). A SIGTERM to this launcher is
passed on to every process: the run stops after a step they agree on, saved. Exit 75
(`PREEMPTED`, `rljax.cli.PREEMPTED_EXIT_CODE`) from a process means that preemption stop:
the others are given `PREEMPTION_GRACE_S` to reach it too, and when all have, the job
ends with 75, or with `--max-restarts N` starts again (a new coordinator port), which
resumes the run, up to N times (never after a SIGTERM to the launcher itself). Exit
status: 0; 75; else the first other non-zero one (124: `--timeout`, 130: Ctrl-C).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

PREEMPTED = 75  # a run stopped by SIGTERM at a step every process saved (rljax.cli.PREEMPTED_EXIT_CODE)
PREEMPTION_GRACE_S = 120.0  # how long the others may take to save and exit once one exited PREEMPTED


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_env(base: dict, index: int, count: int, devices: int, port: int) -> dict:
    env = dict(base)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    env.update(
        RLJAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
        RLJAX_NUM_PROCESSES=str(count),
        RLJAX_PROCESS_ID=str(index),
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=" ".join([*flags, f"--xla_force_host_platform_device_count={devices}"]),
    )
    return env


def _pump(stream, prefix: str) -> None:
    for line in iter(stream.readline, ""):
        sys.stdout.write(f"{prefix}{line}")
        sys.stdout.flush()
    stream.close()


def _stop(procs: list[subprocess.Popen], sig: int = signal.SIGTERM, grace_s: float = 10.0) -> None:
    """Send `sig` to each process group still running, then SIGKILL after `grace_s`."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
    deadline = time.time() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.time(), 0.1))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def run(count: int, devices: int, command: list[str], port: int | None = None, dry_run: bool = False,
        timeout_s: float | None = None, max_restarts: int = 0) -> int:
    argv = [sys.executable, "-m", "rljax.cli", *command]
    if dry_run:
        port = port or free_port()
        for i, env in enumerate(process_env(os.environ, i, count, devices, port) for i in range(count)):
            keys = ("RLJAX_COORDINATOR_ADDRESS", "RLJAX_NUM_PROCESSES", "RLJAX_PROCESS_ID", "JAX_PLATFORMS", "XLA_FLAGS")
            assignments = " ".join(f"{k}={shlex.quote(env[k])}" for k in keys)
            print(f"[{i}] {assignments} {shlex.join(argv)}")
        return 0
    terminated = threading.Event()  # this launcher got SIGTERM: passed on, and no restart after it
    restarts = 0
    while True:
        codes: list[int | None] = []
        status = _run_once(argv, count, devices, port or free_port(), timeout_s, terminated, codes)
        if status != PREEMPTED or terminated.is_set() or restarts >= max_restarts:
            return status
        restarts += 1
        port = None  # the previous coordinator's port may still be in use
        print(f"local_multiprocess: the processes stopped at a saved step (exit statuses {codes}): restart "
              f"{restarts} of {max_restarts}, resuming", file=sys.stderr, flush=True)


def _run_once(argv: list[str], count: int, devices: int, port: int, timeout_s: float | None,
              terminated: threading.Event, codes: list[int | None]) -> int:
    """One start of the job; `codes` receives each process's exit status (None: stopped here)."""
    envs = [process_env(os.environ, i, count, devices, port) for i in range(count)]
    procs: list[subprocess.Popen] = []
    pumps = []
    for i, env in enumerate(envs):
        p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)  # own process group: stop it and its children together
        procs.append(p)
        t = threading.Thread(target=_pump, args=(p.stdout, f"[{i}] "), daemon=True)
        t.start()
        pumps.append(t)

    def pass_sigterm_on(signum, frame):  # to each rljax process (its reward workers keep going)
        terminated.set()
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, pass_sigterm_on)
    status, stop_signal = 0, signal.SIGTERM
    start = time.time()
    preempted_at = None  # when the first process exited PREEMPTED
    try:
        while True:
            now = [p.poll() for p in procs]
            failed = [c for c in now if c not in (None, 0, PREEMPTED)]
            if failed:
                status, stop_signal = failed[0], signal.SIGKILL
                break
            if all(c is not None for c in now):
                status = PREEMPTED if PREEMPTED in now else 0
                break
            if PREEMPTED in now:
                preempted_at = preempted_at or time.time()
                if time.time() - preempted_at > PREEMPTION_GRACE_S:
                    late = [i for i, c in enumerate(now) if c is None]
                    print(f"local_multiprocess: process {late} did not stop within {PREEMPTION_GRACE_S:.0f}s of a "
                          f"preemption stop (exit {PREEMPTED})", file=sys.stderr)
                    status, stop_signal = 1, signal.SIGKILL
                    break
            if timeout_s is not None and time.time() - start > timeout_s:
                print(f"local_multiprocess: timed out after {timeout_s:.0f}s", file=sys.stderr)
                status = 124
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        status, stop_signal = 130, signal.SIGINT
    finally:
        codes[:] = [p.poll() for p in procs]  # before the stop: who ended on their own
        _stop(procs, stop_signal)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        for t in pumps:
            t.join(timeout=5)
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     usage="%(prog)s [-n N] [--devices-per-process D] [--dry-run] -- RLJAX_ARGS...")
    parser.add_argument("-n", "--num-processes", type=int, default=2)
    parser.add_argument("--devices-per-process", type=int, default=4)
    parser.add_argument("--port", type=int, default=None, help="coordinator port (default: a free one)")
    parser.add_argument("--timeout", type=float, default=None, help="stop all processes after this many seconds")
    parser.add_argument("--max-restarts", type=int, default=0,
                        help=f"start the job again (it resumes) when every process stopped with exit {PREEMPTED} "
                             "after a SIGTERM to one of them, up to this many times")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="rljax subcommand and its arguments")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no rljax command given (e.g. -- train configs/sft_tiny.yaml)")
    return run(args.num_processes, args.devices_per_process, command, args.port, args.dry_run, args.timeout,
               args.max_restarts)


if __name__ == "__main__":
    sys.exit(main())
