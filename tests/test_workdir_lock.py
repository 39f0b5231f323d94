"""One workdir, one writer: two real `chinchax train` processes on one workdir (local and gs://
against the fake-gcs-server) — the second refused in one line, the first's run equal to an
uninterrupted one — and the lock of a process killed with SIGKILL taken over."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from chinchax.storage import lease as lease_lib
from chinchax.storage import paths as paths_lib
from chinchax.storage import workdir_lock
from gcs_server import gcs, gcs_url  # noqa: F401 — fixtures
from test_train import _run_cli


def _rows(workdir) -> list[dict]:
  text = paths_lib.as_path(workdir).joinpath("metrics.jsonl").read_text()
  return [json.loads(l) for l in text.splitlines()]


def _wait_for(cond, proc, timeout=240):
  deadline = time.time() + timeout
  while time.time() < deadline:
    assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
    try:
      if cond():
        return
    except (FileNotFoundError, ValueError):
      pass
    time.sleep(0.1)
  raise AssertionError("timed out")


def _held(workdir) -> bool:
  lock = paths_lib.as_path(workdir) / "lock"
  return any(not json.loads(p.read_text())["released"] for p in lock.iterdir())


def _committed(workdir, step) -> bool:
  ckpts = paths_lib.as_path(workdir) / "checkpoints"
  return any(p.name.isdigit() and int(p.name) >= step and (p / "commit_success.txt").exists()
             for p in ckpts.iterdir())


@pytest.fixture(scope="module")
def reference(small_corpus, store_root, tmp_path_factory):
  """metrics rows of an uninterrupted 60-step run (local disk)."""
  ref = tmp_path_factory.mktemp("ref") / "run"
  proc = _run_cli(ref, store_root, small_corpus)
  out, _ = proc.communicate(timeout=400)
  assert proc.returncode == 0, out.decode()[-2000:]
  return _rows(ref)


@pytest.mark.parametrize("where", ["local", "gs"])
def test_a_second_train_on_a_busy_workdir_is_refused_in_one_line(where, reference, small_corpus,
                                                                 store_root, tmp_path, request):
  run = (f"{request.getfixturevalue('gcs_url')}/run" if where == "gs" else tmp_path / "run")
  first = _run_cli(run, store_root, small_corpus)
  _wait_for(lambda: _held(run), first)
  second = _run_cli(run, store_root, small_corpus, ("--config.train.peak_lr=0.01",))
  out, _ = second.communicate(timeout=300)
  lines = [l for l in out.decode().splitlines() if l.strip()]
  assert second.returncode == 2, lines
  assert len(lines) == 1 and lines[0].startswith("error: workdir "), lines
  assert f"pid {first.pid} on host {socket.gethostname()}" in lines[0], lines
  assert "since " in lines[0] and "choose another workdir" in lines[0]
  out, _ = first.communicate(timeout=400)
  assert first.returncode == 0, out.decode()[-2000:]
  rows = _rows(run)
  assert [r["step"] for r in rows] == [r["step"] for r in reference]  # every step once
  assert [r["loss"] for r in rows] == [r["loss"] for r in reference]  # bitwise
  ckpts = paths_lib.as_path(run) / "checkpoints"
  assert max(int(p.name) for p in ckpts.iterdir() if p.name.isdigit()) == 60
  # the lock is released at exit: the same command now resumes (nothing to do) and exits 0
  again = _run_cli(run, store_root, small_corpus)
  out, _ = again.communicate(timeout=300)
  assert again.returncode == 0 and "error" not in out.decode(), out.decode()[-2000:]


@pytest.mark.parametrize("where", ["local", "gs"])
def test_the_lock_of_a_killed_run_is_taken_over_and_the_run_resumes_bitwise(
    where, reference, small_corpus, store_root, tmp_path, request):
  run = (f"{request.getfixturevalue('gcs_url')}/run" if where == "gs" else tmp_path / "run")
  first = _run_cli(run, store_root, small_corpus)
  _wait_for(lambda: _committed(run, 20), first)
  first.send_signal(signal.SIGKILL)
  first.wait()
  assert _held(run)  # the dead process's lock is still there
  again = _run_cli(run, store_root, small_corpus)
  out, _ = again.communicate(timeout=400)
  text = out.decode()
  assert again.returncode == 0, text[-2000:]
  notes = [l for l in text.splitlines() if l.startswith("note: took over the lock")]
  assert len(notes) == 1 and f"pid {first.pid}" in notes[0] and "process is gone" in notes[0]
  assert "resumed from checkpoint at step" in text
  assert [r["loss"] for r in _rows(run)] == [r["loss"] for r in reference]


def test_a_refused_run_in_a_new_workdir_leaves_nothing(tmp_path):
  wd = tmp_path / "new"
  lock = workdir_lock.acquire(wd)
  assert (wd / "lock" / "writer.0").exists()
  lock.release()
  assert not wd.exists()


def test_a_lock_from_another_host_expires_by_its_heartbeat_age(tmp_path, monkeypatch):
  wd = tmp_path / "run"
  (wd / "lock").mkdir(parents=True)
  now = time.time()
  other = {"run_id": "writer", "gen": 0, "owner": "far-1", "host": "far-away-host", "pid": 1,
           "since": now - 1000, "time": now - 100, "released": False, "beat": 3, "attempt": 0}
  (wd / "lock" / "writer.0").write_text(json.dumps(other))
  with pytest.raises(workdir_lock.WorkdirBusy, match="pid 1 on host far-away-host"):
    workdir_lock.acquire(wd)  # 100 s old: alive by the 300 s timeout
  monkeypatch.setattr(workdir_lock, "TIMEOUT_S", 60.0)
  lock = workdir_lock.acquire(wd)  # 100 s > 60 s: taken over
  assert lock.lease.gen == 1 and not lock.lost
  mine = json.loads((wd / "lock" / "writer.1").read_text())
  assert mine["pid"] == os.getpid() and mine["host"] == socket.gethostname()
  # the old holder, back from the dead, finds it lost its lease
  old = lease_lib.Lease(wd / "lock" / "writer.0", "writer", 0, "far-1")
  assert old.lost() and not old.beat()
  lock.release()
  assert json.loads((wd / "lock" / "writer.1").read_text())["released"] == "finished"


def test_two_processes_racing_for_one_new_workdir_one_wins(tmp_path):
  code = ("import sys, time\nfrom chinchax.storage import workdir_lock as w\n"
          "t = float(sys.argv[2])\nwhile time.time() < t: time.sleep(0.0005)\n"
          "try:\n  w.acquire(sys.argv[1]); print('held'); time.sleep(3)\n"
          "except w.WorkdirBusy as e: print('busy')\n")
  start = time.time() + 3
  procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "wd"), str(start)],
                            stdout=subprocess.PIPE, text=True) for _ in range(3)]
  outs = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
  assert outs == ["busy", "busy", "held"], outs
