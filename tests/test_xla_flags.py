"""The XLA flags rljax adds for several CPU devices in one process (rljax/xla_flags.py)."""

import os
import subprocess
import sys

import pytest

from rljax.xla_flags import CPU_MULTI_DEVICE_FLAGS, apply, with_cpu_multi_device_flags

SCHEDULER = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def test_added_for_several_host_devices_only_and_a_users_value_wins():
    assert with_cpu_multi_device_flags("--xla_force_host_platform_device_count=8") == (
        f"--xla_force_host_platform_device_count=8 {SCHEDULER}")
    assert with_cpu_multi_device_flags("") == ""  # one device (or an accelerator): nothing to add
    assert with_cpu_multi_device_flags("--xla_force_host_platform_device_count=1") == (
        "--xla_force_host_platform_device_count=1")
    mine = "--xla_force_host_platform_device_count=4 --xla_cpu_enable_concurrency_optimized_scheduler=true"
    assert with_cpu_multi_device_flags(mine) == mine
    # the last device count wins, as in XLA's own parsing
    assert SCHEDULER in with_cpu_multi_device_flags(
        "--xla_force_host_platform_device_count=1 --xla_force_host_platform_device_count=2")
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    apply(env)
    apply(env)  # idempotent
    assert env["XLA_FLAGS"].split().count(SCHEDULER) == 1 and set(CPU_MULTI_DEVICE_FLAGS) == {
        "xla_cpu_enable_concurrency_optimized_scheduler"}


@pytest.mark.slow
def test_the_command_line_and_the_tests_run_with_them():
    assert SCHEDULER in os.environ["XLA_FLAGS"].split()  # tests/conftest.py applied them
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    code = ("import os, sys; from rljax import cli; sys.argv = ['rljax', '--help']\n"
            "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('FLAGS=' + os.environ['XLA_FLAGS'])")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert f"FLAGS=--xla_force_host_platform_device_count=2 {SCHEDULER}" in out
