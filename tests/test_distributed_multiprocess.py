"""Two real processes × 4 CPU devices on 127.0.0.1 (gloo): equality with one process, preemption.

The runs go through ``launch/local_multiprocess.sh`` (or the same command line per
process) with ``XLA_FLAGS`` cleared and ``--config.mesh.num_cpu_devices=4``; the
mesh is (fsdp=8), so parameters and optimizer state are split across the two
processes and every checkpoint is written by both. A persistent compilation
cache shared by the runs of this module keeps relaunches short.
"""

import json
import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import time

import jax
import pytest

from chinchax.runtime import distributed as distributed_lib
from chinchax import train as train_lib

REPO = pathlib.Path(__file__).resolve().parent.parent
LAUNCHER = REPO / "launch" / "local_multiprocess.sh"


def _losses(workdir):
  rows = [json.loads(l) for l in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()
          if l.strip()]
  return {r["step"]: r["loss"] for r in rows}


def _flags(workdir, store_root, corpus):
  """The tiny run of this module (20 steps, fsdp=8) as `chinchax train` flags."""
  return [f"--config={REPO}/configs/train.py:tiny", f"--config.workdir={workdir}",
          f"--config.data.store_root={store_root}", "--config.data.source=files",
          f"--config.data.paths={corpus}/*.txt", "--config.data.val_fraction=0.1",
          "--config.mesh.data=1", "--config.mesh.fsdp=8", "--config.train.log_every=1",
          "--config.train.peak_flops_per_device=1e9",
          "--config.distributed.initialization_timeout_s=60"]


@pytest.fixture(scope="module")
def mp_env(tmp_path_factory):
  cache = tmp_path_factory.mktemp("jax_cache")
  return dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu", PYTHON=sys.executable,
              JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
              JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")


@pytest.fixture(scope="module")
def two_process_run(small_corpus, store_root, tmp_path_factory, mp_env):
  """20 tiny steps as 2 processes × 4 CPU devices through launch/local_multiprocess.sh."""
  root = tmp_path_factory.mktemp("two_process")
  t0 = time.monotonic()
  proc = subprocess.run(
      ["bash", str(LAUNCHER), "--processes", "2", "--devices", "4", "--log-dir", str(root / "logs"),
       "--", *_flags(root / "run", store_root, small_corpus)],
      env=mp_env, cwd=REPO, capture_output=True, text=True, timeout=300)
  logs = {p.name: p.read_text() for p in (root / "logs").glob("*.log")}
  assert proc.returncode == 0, (proc.stderr[-2000:], {k: v[-3000:] for k, v in logs.items()})
  return root / "run", logs, time.monotonic() - t0


def test_two_processes_equal_one_process_and_one_device(two_process_run, tiny_config, tmp_path):
  workdir, logs, _ = two_process_run
  assert "2 process(es)" in logs["process_0.log"]
  # Process 0 alone writes: process 1 prints no run report.
  assert "done    step 20/20" in logs["process_0.log"]
  assert "done    step" not in logs["process_1.log"] and "model   d_model" not in logs["process_1.log"]
  two = _losses(workdir)
  assert sorted(two) == list(range(1, 21))
  summary_two = json.loads((workdir / "summary.json").read_text())
  for name, mesh, n in [("one_process", (1, 8, 1), 8), ("one_device", (1, 1, 1), 1)]:
    c = tiny_config.copy_and_resolve_references()
    c.workdir = str(tmp_path / name)
    c.mesh.update(data=mesh[0], fsdp=mesh[1], tensor=mesh[2])
    c.train.update(log_every=1, peak_flops_per_device=1e9)
    summary = train_lib.train(c, devices=jax.devices()[:n], verbose=False)
    one = _losses(c.workdir)
    for s in range(1, 21):
      assert one[s] == pytest.approx(two[s], rel=1e-6), (name, s, one[s], two[s])
    assert summary["final_eval_loss"] == pytest.approx(summary_two["final_eval_loss"], rel=1e-6)
    assert summary["tokens"] == summary_two["tokens"] == 20 * 8 * 32


def test_two_processes_eval_the_same_fixed_windows_as_one(small_corpus, store_root, tiny_config,
                                                         tmp_path, mp_env):
  """train.eval_windows over 2 processes: each feeds its rows of every 64-row chunk."""
  extra = ["--config.budget.steps=3", "--config.train.eval_windows=100"]
  proc = subprocess.run(
      ["bash", str(LAUNCHER), "--processes", "2", "--devices", "4", "--log-dir",
       str(tmp_path / "logs"), "--", *_flags(tmp_path / "two", store_root, small_corpus), *extra],
      env=mp_env, cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  two = json.loads((tmp_path / "two" / "summary.json").read_text())
  c = tiny_config.copy_and_resolve_references()
  c.workdir = str(tmp_path / "one")
  c.mesh.update(data=1, fsdp=8, tensor=1)
  c.budget.steps = 3
  c.train.update(log_every=1, peak_flops_per_device=1e9, eval_windows=100)
  one = train_lib.train(c, devices=jax.devices()[:8], verbose=False)
  assert two["eval_windows"] == one["eval_windows"] == 100
  assert one["final_eval_loss"] == pytest.approx(two["final_eval_loss"], rel=1e-6)
  assert one["final_eval_loss_se"] == pytest.approx(two["final_eval_loss_se"], rel=1e-4)


def test_sigterm_to_one_process_stops_both_after_a_checkpoint_and_relaunch_resumes(
    two_process_run, small_corpus, store_root, tmp_path, mp_env):
  ref_workdir, _, _ = two_process_run
  workdir = tmp_path / "run"
  port = _free_port()

  def start():
    return [subprocess.Popen(
        [sys.executable, "-m", "chinchax.cli", "train", *_flags(workdir, store_root, small_corpus),
         "--config.mesh.num_cpu_devices=4",
         f"--config.distributed.coordinator_address=127.0.0.1:{port}",
         "--config.distributed.num_processes=2", f"--config.distributed.process_id={i}"],
        env=mp_env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)]

  signal_after = random.Random().randint(2, 10)
  procs = start()
  deadline = time.monotonic() + 240
  while time.monotonic() < deadline and all(p.poll() is None for p in procs):
    try:
      if max(_losses(workdir), default=0) >= signal_after:
        break
    except (OSError, ValueError):  # not written yet, or a row half-written
      pass
    time.sleep(0.02)
  procs[1].send_signal(signal.SIGTERM)  # only process 1: both must agree on the step
  outs = [p.communicate(timeout=120)[0] for p in procs]
  assert [p.returncode for p in procs] == [distributed_lib.PREEMPTED_EXIT_CODE] * 2, \
      [o[-2000:] for o in outs]
  assert "Traceback" not in outs[0] + outs[1]
  saved = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  stopped_at = saved[-1]
  assert signal_after <= stopped_at < 20
  assert f"preempted: checkpoint saved at step {stopped_at} in {workdir}" in outs[0]
  assert "preempted: checkpoint saved" not in outs[1]  # only process 0 reports
  assert not (workdir / "summary.json").exists()

  procs = start()
  outs = [p.communicate(timeout=240)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], [o[-2000:] for o in outs]
  assert f"resumed from checkpoint at step {stopped_at}" in outs[0]
  ref = json.loads((ref_workdir / "summary.json").read_text())
  got = json.loads((workdir / "summary.json").read_text())
  assert got["steps"] == ref["steps"] == 20
  assert got["final_train_loss"] == ref["final_train_loss"]
  assert got["final_eval_loss"] == ref["final_eval_loss"]
  assert _losses(workdir) == _losses(ref_workdir)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]
