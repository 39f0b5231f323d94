"""Ctrl-C during `chinchax train`, at a chosen phase (a real SIGINT to a real run): one line,
exit 130, a checkpoint when it had trained, and a resume equal to an uninterrupted run."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
STEPS = 120  # the training interrupt lands near step 15: ~100 steps (20 saves) to spare
# What a clean interrupt never prints: tracebacks (orbax, asyncio), a KeyboardInterrupt swallowed
# in a gc callback, a crash in XLA's compiler, absl error logging.
BAD = ("Traceback", "Event loop is closed", "Exception ignored", "SIGSEGV", "Fatal Python",
       "ERROR:absl", "done    step")


def _cmd(workdir, corpus, store_root, *extra):
  return [sys.executable, "-m", "chinchax.cli", "train", f"--config={REPO}/configs/train.py:tiny",
          f"--config.workdir={workdir}", "--config.data.source=files",
          f"--config.data.paths={corpus}/*.txt", f"--config.data.store_root={store_root}",
          "--config.data.val_fraction=0.1", f"--config.budget.steps={STEPS}",
          "--config.train.checkpoint_every=5", "--config.train.log_every=5",
          "--config.train.eval_every=1000", "--config.train.peak_flops_per_device=1e9", *extra]


def _env():
  return dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")


def _interrupt(cmd, when, log_path, timeout=300):
  """Starts ``cmd``, sends SIGINT once ``when(text so far)`` holds; (exit status, output)."""
  with open(log_path, "w") as log:
    proc = subprocess.Popen(cmd, env=_env(), stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    deadline = time.time() + timeout
    while proc.poll() is None and time.time() < deadline:
      if when(pathlib.Path(log_path).read_text()):
        proc.send_signal(signal.SIGINT)
        break
      time.sleep(0.01)
    code = proc.wait(timeout=timeout)
  return code, pathlib.Path(log_path).read_text()


def _assert_clean(code, out):
  assert code == 130, out[-3000:]
  assert sum(line.startswith("interrupted") for line in out.splitlines()) == 1, out[-3000:]
  assert not [b for b in BAD if b in out], out[-3000:]


def _losses(workdir):
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return {r["step"]: r["loss"] for r in rows if "loss" in r}


@pytest.fixture(scope="module")
def reference(small_corpus, store_root, tmp_path_factory):
  """An uninterrupted run saving only at its end: its metrics.jsonl losses by step (the store is
  built here)."""
  wd = tmp_path_factory.mktemp("ref") / "run"
  cmd = _cmd(wd, small_corpus, store_root, f"--config.train.checkpoint_every={STEPS}")
  out = subprocess.run(cmd, env=_env(), cwd=REPO, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  return _losses(wd)


def test_ctrl_c_at_start_up(small_corpus, store_root, tmp_path):
  # The run's first line is out: the config is read, the data and the compile are ahead.
  code, out = _interrupt(_cmd(tmp_path / "run", small_corpus, store_root),
                         lambda text: text.startswith("model") or "\nmodel" in text,
                         tmp_path / "log")
  _assert_clean(code, out)


def test_ctrl_c_while_compiling_stops_without_a_crash(small_corpus, store_root, tmp_path,
                                                      reference):
  # No compilation cache: the run compiles when the data line is out. A KeyboardInterrupt
  # there used to end in a SIGSEGV inside XLA's compile threads.
  wd = tmp_path / "run"
  cmd = _cmd(wd, small_corpus, store_root, "--config.compile_cache_dir=")
  seen = []

  def compiling(text):  # the init and step programs compile from the data line on
    if "\ndata    store" in text and not seen:
      seen.append(time.time())
    return bool(seen) and time.time() - seen[0] > 1.0

  code, out = _interrupt(cmd, compiling, tmp_path / "log")
  _assert_clean(code, out)
  assert not (wd / "metrics.jsonl").exists() or len(_losses(wd)) <= 1


def test_ctrl_c_while_training_checkpoints_and_the_rerun_matches(small_corpus, store_root,
                                                                 tmp_path, reference):
  wd = tmp_path / "run"
  cmd = _cmd(wd, small_corpus, store_root)
  metrics = wd / "metrics.jsonl"

  def training(_):  # a few rows in (a checkpoint every 5 steps: saves are in flight)
    return metrics.exists() and len(metrics.read_text().splitlines()) >= 3

  code, out = _interrupt(cmd, training, tmp_path / "log")
  _assert_clean(code, out)
  line = next(l for l in out.splitlines() if l.startswith("interrupted"))
  step = int(line.split("checkpoint saved at step ")[1].split()[0])
  assert 0 < step < STEPS and (wd / "checkpoints" / str(step)).is_dir()
  again = subprocess.run(cmd, env=_env(), cwd=REPO, capture_output=True, text=True, timeout=600)
  assert again.returncode == 0, again.stderr[-3000:]
  assert f"resumed from checkpoint at step {step}" in again.stdout
  assert _losses(wd) == reference  # bitwise: the interrupted + resumed run is the same run


def test_only_a_closed_loops_late_callback_is_dropped(monkeypatch, capsys):
  import asyncio
  import threading
  from chinchax.runtime import interrupts
  seen = []
  monkeypatch.setattr(sys, "excepthook", lambda *a: seen.append(a[1]))
  monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))
  monkeypatch.setattr(sys, "unraisablehook", lambda args: seen.append(args.exc_value))
  interrupts.quiet_closed_loop_callbacks()
  loop = asyncio.new_event_loop()
  loop.close()
  try:
    loop.call_soon_threadsafe(print)
  except RuntimeError as e:
    late = e
  sys.excepthook(type(late), late, late.__traceback__)  # a failed save's late callback: dropped
  other = RuntimeError("Event loop is closed")  # the same words raised elsewhere: reported
  sys.excepthook(RuntimeError, other, None)
  boom = ValueError("boom")
  sys.excepthook(ValueError, boom, None)
  assert seen == [other, boom]
