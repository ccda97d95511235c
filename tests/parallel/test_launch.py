"""Launchers: environment parsing for jax.distributed, and dry runs of the TPU VM, GKE and
local multi-process launchers (no gcloud / kubectl here)."""

import os
import subprocess
import sys

import pytest
import yaml

from rljax.distributed import settings_from_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH = os.path.join(ROOT, "launch")
SCRIPTS = ["tpu_vm.sh", "gke/submit.sh"]


def test_distributed_settings_from_env():
    assert settings_from_env({}).mode == "single"
    explicit = settings_from_env({"RLJAX_COORDINATOR_ADDRESS": "10.0.0.2:1234", "RLJAX_NUM_PROCESSES": "4",
                                  "RLJAX_PROCESS_ID": "3", "RLJAX_LOCAL_DEVICE_IDS": "0,1"})
    assert (explicit.mode, explicit.coordinator_address, explicit.num_processes, explicit.process_id,
            explicit.local_device_ids, explicit.cpu_collectives) == ("explicit", "10.0.0.2:1234", 4, 3, (0, 1), "gloo")
    assert settings_from_env({"RLJAX_DISTRIBUTED": "1"}).mode == "auto-detect"  # Cloud TPU VM: JAX asks the metadata
    assert settings_from_env({"TPU_WORKER_HOSTNAMES": "h0,h1,h2,h3"}).mode == "auto-detect"  # GKE multi-host
    assert settings_from_env({"TPU_WORKER_HOSTNAMES": "h0"}).mode == "single"
    assert settings_from_env({"RLJAX_DISTRIBUTED": "0", "RLJAX_COORDINATOR_ADDRESS": "x:1"}).mode == "single"
    with pytest.raises(ValueError, match="needs RLJAX_NUM_PROCESSES"):
        settings_from_env({"RLJAX_COORDINATOR_ADDRESS": "127.0.0.1:1234"})
    with pytest.raises(ValueError, match="RLJAX_PROCESS_ID=2 is not in 0..1"):
        settings_from_env({"RLJAX_COORDINATOR_ADDRESS": "a:1", "RLJAX_NUM_PROCESSES": "2", "RLJAX_PROCESS_ID": "2"})


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_parse(script):
    subprocess.run(["bash", "-n", os.path.join(LAUNCH, script)], check=True)


def dry(*args):
    return subprocess.run(args, cwd=ROOT, check=True, capture_output=True, text=True).stdout


def test_tpu_vm_dry_run_prints_the_whole_launch():
    out = dry("bash", os.path.join(LAUNCH, "tpu_vm.sh"), "--name", "rl", "--zone", "us-west4-a", "--queued", "--spot",
              "--pre", "echo ready", "--env", "FOO=bar baz", "--dry-run",
              "train", "configs/sft_tiny.yaml", "trainer.logger=[console]")
    lines = out.splitlines()
    create = next(x for x in lines if "queued-resources create" in x)
    for flag in ("rl-qr", "--node-id=rl", "--accelerator-type=v5litepod-16", "--runtime-version=v2-alpha-tpuv5-lite",
                 "--spot", "--zone=us-west4-a"):
        assert flag in create
    assert any("tpu-vm scp" in x and "--worker=all" in x for x in lines)
    assert any("tpu-vm ssh rl" in x and "--worker=all" in x and "pip\\ install" in x for x in lines)
    assert any("echo\\ ready" in x for x in lines)
    # the per-worker launcher, with the arguments quoted once
    assert "#   export RLJAX_DISTRIBUTED=1" in out
    assert "#   export FOO=bar\\ baz" in out
    assert "#   python3 -m rljax.cli train configs/sft_tiny.yaml trainer.logger=\\[console\\]" in out
    assert any("setsid" in x and "train.pid" in x for x in lines)  # own process group, killable on Ctrl-C
    assert any("--worker=0" in x and "tail" in x for x in lines)  # streams worker 0's log
    stop = dry("bash", os.path.join(LAUNCH, "tpu_vm.sh"), "--name", "rl", "--zone", "z", "--dry-run", "stop")
    assert "kill\\ -TERM\\ --\\ -\\$pg" in stop and "--worker=all" in stop
    delete = dry("bash", os.path.join(LAUNCH, "tpu_vm.sh"), "--name", "rl", "--zone", "z", "--dry-run", "delete")
    assert "tpu-vm delete rl --zone=z --quiet" in delete


def test_gke_dry_run_renders_a_valid_jobset():
    out = dry("bash", os.path.join(LAUNCH, "gke", "submit.sh"), "--dry-run", "--image", "img:1", "--bucket", "b",
              "--hosts", "4", "--topology", "4x4", "train", "configs/sft_tiny.yaml", "optim.lr=2e-5")
    manifest = yaml.safe_load(out.split("\n---\n")[0])
    job = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]
    pod = job["template"]["spec"]
    assert manifest["kind"] == "JobSet" and job["parallelism"] == job["completions"] == 4
    assert pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "4x4"
    assert pod["containers"][0]["resources"]["limits"]["google.com/tpu"] == 4
    assert pod["containers"][0]["args"][0].startswith("python3 -m rljax.cli train configs/sft_tiny.yaml optim.lr=2e-5")
    assert "trainer.default_local_dir=/runs" in pod["containers"][0]["args"][0]
    assert "kubectl apply" in out and "kubectl logs -f" in out


def test_local_multiprocess_dry_run():
    out = dry(sys.executable, os.path.join(LAUNCH, "local_multiprocess.py"), "-n", "3", "--devices-per-process", "2",
              "--port", "5555", "--dry-run", "--", "train", "configs/sft_tiny.yaml")
    lines = out.splitlines()
    assert len(lines) == 3
    for i, line in enumerate(lines):
        assert f"RLJAX_PROCESS_ID={i}" in line and "RLJAX_NUM_PROCESSES=3" in line
        assert "RLJAX_COORDINATOR_ADDRESS=127.0.0.1:5555" in line
        assert "--xla_force_host_platform_device_count=2" in line and "-m rljax.cli train configs/sft_tiny.yaml" in line
