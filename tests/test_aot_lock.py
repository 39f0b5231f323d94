"""Compiles and libtpu's one-process-per-host rule: a held lock is waited for, not a failure;
with ALLOW_MULTIPLE_LIBTPU_LOAD set chinchax serialises nothing.

The holders are real processes holding real locks (flock on chinchax's lock, a POSIX lock
like libtpu's on a file of the test's own: /tmp/libtpu_lockfile is left to libtpu).
"""

import json
import os
import subprocess
import sys
import time

import pytest

from chinchax.aot import search as search_lib
from chinchax.aot import topology

needs_libtpu = pytest.mark.skipif(not topology.libtpu_available(),
                                  reason="libtpu not installed (pip install -e '.[tpu]')")

HOLD = """
import fcntl, sys, time
f = open(sys.argv[1], "a+")
(fcntl.flock if sys.argv[2] == "flock" else fcntl.lockf)(f, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[3]))
"""


def _hold(path, kind: str, seconds: float) -> subprocess.Popen:
  """A process holding ``path`` locked (``flock`` or POSIX ``lockf``) for ``seconds``."""
  path.parent.mkdir(parents=True, exist_ok=True)
  p = subprocess.Popen([sys.executable, "-c", HOLD, str(path), kind, str(seconds)],
                       stdout=subprocess.PIPE, text=True)
  assert p.stdout.readline().strip() == "held"
  return p


def test_wait_for_libtpu_waits_for_its_holder_then_names_it(tmp_path):
  lock = tmp_path / "libtpu_lockfile"
  holder = _hold(lock, "lockf", 2.0)
  assert topology.lock_holders(lock) == [holder.pid]
  waited = topology.wait_for_libtpu(lock, timeout_s=120, poll_s=0.1)
  assert waited > 0.5 and holder.wait(timeout=60) == 0
  assert topology.lock_holders(lock) == [] and topology.wait_for_libtpu(lock) < 0.5
  holder = _hold(lock, "lockf", 300.0)
  try:
    with pytest.raises(topology.AotError) as e:
      topology.wait_for_libtpu(lock, timeout_s=0.3, poll_s=0.1)
    assert str(holder.pid) in str(e.value) and "ALLOW_MULTIPLE_LIBTPU_LOAD=1" in str(e.value)
  finally:
    holder.kill()
    holder.wait()


def test_allow_multiple_is_read_as_libtpu_reads_it(monkeypatch):
  for value, allowed in (("1", True), ("true", True), ("0", False), ("", False)):
    monkeypatch.setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", value)
    assert topology.multiple_loads_allowed() is allowed


def test_a_child_that_lost_libtpu_to_another_process_is_run_again(monkeypatch):
  """libtpu taken between the child's wait and its start: the compile is retried, not lost."""
  calls = []
  real_run = subprocess.run

  def run(cmd, **kw):
    calls.append(cmd)
    if len(calls) == 1:
      return subprocess.CompletedProcess(cmd, 2, stdout=json.dumps({"libtpu_busy": "held"}),
                                         stderr="")
    return real_run(cmd, **kw)

  monkeypatch.setattr(search_lib.subprocess, "run", run)
  monkeypatch.setattr(search_lib.time, "sleep", lambda s: None)
  from tests.test_aot import _tiny
  target = topology.parse_target("v5e-4")
  if not topology.libtpu_available():
    pytest.skip("libtpu not installed")
  rep, _ = search_lib.compile_cached(_tiny(data=4), target, eval_step=False, cache_dir=None)
  assert len(calls) == 2 and rep["fits"], rep["train_step"]


def _compile(home, allow: bool) -> subprocess.Popen:
  env = dict(os.environ, HOME=str(home))
  env.pop("ALLOW_MULTIPLE_LIBTPU_LOAD", None)
  if allow:
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
  return subprocess.Popen([sys.executable, "-m", "chinchax.cli", "compile", "--topology", "v5e-4",
                           "--config=configs/train.py:tiny", "--config.mesh.data=-1", "--no-eval",
                           "--no-cache", "--json"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env)


@needs_libtpu
def test_compile_waits_its_turn_on_the_lock_and_takes_none_when_libtpu_allows_many(tmp_path):
  """Without ALLOW_MULTIPLE_LIBTPU_LOAD a compile waits while another process holds chinchax's
  lock and compiles once it is let go; with it, it compiles while the lock stays held."""
  lock = tmp_path / ".cache" / "chinchax" / "libtpu.lock"
  holder = _hold(lock, "flock", 900.0)
  try:
    proc = _compile(tmp_path, allow=False)
    first = proc.stderr.readline()  # the parent says it waits before its child starts
    assert "waits for it" in first, first
    time.sleep(2.0)
    assert proc.poll() is None  # still waiting
    holder.kill()
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0 and json.loads(out)["fits"], err
  finally:
    holder.kill()
    holder.wait()
  holder = _hold(lock, "flock", 900.0)  # held past the compile's end: no one waits for it
  try:
    proc = _compile(tmp_path, allow=True)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0 and json.loads(out)["fits"], err
    assert "wait" not in err and holder.poll() is None
  finally:
    holder.kill()
    holder.wait()
