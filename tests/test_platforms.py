"""A process that uses no TPU never starts libtpu: no TPU start-up noise on a CPU host, and a
`chinchax compile` for a TPU slice works while a CPU train runs (libtpu's lockfile is free)."""

import fcntl
import importlib.util
import os
import pathlib
import subprocess
import sys
import time

import pytest

from chinchax.runtime import platforms
from chinchax.aot import topology as topology_lib

REPO = pathlib.Path(__file__).resolve().parent.parent
NOISE = ("Failed to find host bounds", "unexpected worker hostname", "TPU_ACCELERATOR",
         "TPU_WORKER_HOSTNAMES", "libtpu_init")
HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None


def _libtpu_lock_held_elsewhere() -> bool:
  """True when another process on this host holds libtpu's lockfile or chinchax's own TPU-compile
  lock (then a compile fails or waits, whatever this test's train does)."""
  try:
    with open("/tmp/libtpu_lockfile", "a") as f:
      fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
      fcntl.lockf(f, fcntl.LOCK_UN)
    if topology_lib.LOCK_PATH.exists():
      with open(topology_lib.LOCK_PATH, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(f, fcntl.LOCK_UN)
  except OSError:
    return True
  return False


def _env(**extra):
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  env.update(extra)
  return env


def test_the_users_choice_and_tpu_hosts_are_left_alone(monkeypatch):
  monkeypatch.setenv("JAX_PLATFORMS", "tpu")
  assert platforms.choose() is None and os.environ["JAX_PLATFORMS"] == "tpu"
  monkeypatch.delenv("JAX_PLATFORMS")
  monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-8")
  assert platforms.tpu_host() and platforms.choose() is None
  assert "JAX_PLATFORMS" not in os.environ


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: nothing to keep away")
@pytest.mark.skipif(platforms.tpu_host(), reason="a TPU host uses its TPU")
def test_cpu_train_leaves_libtpu_alone_while_a_tpu_compile_runs(tmp_path, small_corpus):
  if _libtpu_lock_held_elsewhere():
    pytest.skip("another process on this host holds /tmp/libtpu_lockfile")
  wd = tmp_path / "run"
  train = subprocess.Popen(
      [sys.executable, "-m", "chinchax.cli", "train", f"--config={REPO}/configs/train.py:tiny",
       f"--config.workdir={wd}", f"--config.data.store_root={tmp_path}/stores",
       "--config.data.source=files", f"--config.data.paths={small_corpus}/*.txt",
       "--config.budget.steps=100000", "--config.data.allow_repeat=True",
       "--config.train.log_every=5",
       "--config.mesh.num_cpu_devices=1", "--config.compile_cache_dir="],
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path)
  try:
    deadline = time.monotonic() + 300
    while not (wd / "metrics.jsonl").exists():  # its JAX backends are up: it is training
      assert train.poll() is None, train.stderr.read()
      assert time.monotonic() < deadline, "the train did not start"
      time.sleep(0.2)
    compile_ = subprocess.run(
        [sys.executable, "-m", "chinchax.cli", "compile", "--topology", "v5e-8", "--no-cache",
         f"--config={REPO}/configs/train.py:tiny"],
        capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=600)
    assert train.poll() is None, "the train ended before the compile did"
  finally:
    train.kill()
    err = train.communicate(timeout=60)[1]
  assert compile_.returncode == 0, compile_.stderr
  assert "v5e-8" in compile_.stdout and "fits" in compile_.stdout, compile_.stdout
  assert not [n for n in NOISE + ("libtpu",) if n in err], err[-3000:]
  assert not [n for n in NOISE if n in compile_.stderr], compile_.stderr
