#!/usr/bin/env python3
"""Run N rljax processes on this machine as one multi-host job (jax.distributed on CPU).

    python launch/local_multiprocess.py -n 2 --devices-per-process 4 -- train configs/sft_tiny.yaml trainer.total_steps=3

starts `python -m rljax.cli train ...` N times with

    RLJAX_COORDINATOR_ADDRESS=127.0.0.1:<free port>  RLJAX_NUM_PROCESSES=N  RLJAX_PROCESS_ID=i
    JAX_PLATFORMS=cpu  XLA_FLAGS=--xla_force_host_platform_device_count=<devices per process>

so the processes see N x D CPU devices in one mesh, with gloo collectives between them:
the same code path as a TPU slice with N hosts. Output lines are prefixed `[i]`. If one
process fails the others are stopped; Ctrl-C stops all. Exit status: the first non-zero
one, else 0. `--dry-run` prints the commands and environments instead of running them.
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


def _stop(procs: list[subprocess.Popen], grace_s: float = 10.0) -> None:
    """SIGTERM each process group still running, then SIGKILL after `grace_s`."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
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
        timeout_s: float | None = None) -> int:
    port = port or free_port()
    argv = [sys.executable, "-m", "rljax.cli", *command]
    envs = [process_env(os.environ, i, count, devices, port) for i in range(count)]
    if dry_run:
        for i, env in enumerate(envs):
            keys = ("RLJAX_COORDINATOR_ADDRESS", "RLJAX_NUM_PROCESSES", "RLJAX_PROCESS_ID", "JAX_PLATFORMS", "XLA_FLAGS")
            assignments = " ".join(f"{k}={shlex.quote(env[k])}" for k in keys)
            print(f"[{i}] {assignments} {shlex.join(argv)}")
        return 0
    procs: list[subprocess.Popen] = []
    pumps = []
    for i, env in enumerate(envs):
        p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)  # own process group: stop it and its children together
        procs.append(p)
        t = threading.Thread(target=_pump, args=(p.stdout, f"[{i}] "), daemon=True)
        t.start()
        pumps.append(t)
    status = 0
    start = time.time()
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                status = failed[0]
                break
            if all(c == 0 for c in codes):
                break
            if timeout_s is not None and time.time() - start > timeout_s:
                print(f"local_multiprocess: timed out after {timeout_s:.0f}s", file=sys.stderr)
                status = 124
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        status = 130
    finally:
        _stop(procs)
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
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="rljax subcommand and its arguments")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no rljax command given (e.g. -- train configs/sft_tiny.yaml)")
    return run(args.num_processes, args.devices_per_process, command, args.port, args.dry_run, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
