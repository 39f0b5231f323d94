"""SIGINT and SIGTERM at chosen moments of a real `chinchax train` (the installed console
script): during `import jax` and its extensions' initialisation, while compiling, while
training; and a main thread blocked inside XLA. Each ends with exactly one stderr line and exit
status 130 (SIGINT) or 75 (SIGTERM), without waiting for the blocked work."""

import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
import signal_timings  # noqa: E402 — the benchmark's command line and environment

REPO = pathlib.Path(__file__).resolve().parent.parent
BAD = ("Traceback", "Fatal Python", "SIGSEGV", "SIGABRT", "Exception ignored", "nanobind")


@pytest.fixture(scope="module")
def root(small_corpus, tmp_path_factory):
  """corpus/ (the small corpus) and stores/ (its token store, built by a 2-step run)."""
  r = tmp_path_factory.mktemp("signals")
  (r / "corpus").symlink_to(small_corpus)
  subprocess.run(signal_timings.train_cmd(r, r / "warm", steps=2), env=signal_timings.env(),
                 check=True, capture_output=True, timeout=600)
  return r


def _run_until(cmd, ready, signum, timeout=300):
  """Starts ``cmd``; sends ``signum`` as soon as ``ready(pid, stdout so far)``; returns (exit
  status, stderr lines, stdout, seconds from the signal to the exit)."""
  with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
    proc = subprocess.Popen(cmd, env=signal_timings.env(), stdout=out, stderr=err, cwd=REPO)
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
      out.seek(0)
      if ready(proc.pid, out.read().decode(errors="replace")):
        break
      time.sleep(0.002)
    assert proc.poll() is None, "the command ended before the chosen moment"
    sent = time.monotonic()
    proc.send_signal(signum)
    code = proc.wait(timeout=timeout)
    delay = time.monotonic() - sent
    out.seek(0), err.seek(0)
    lines = [l for l in err.read().decode(errors="replace").splitlines() if l.strip()]
    return code, lines, out.read().decode(errors="replace"), delay


def _maps(pid):
  try:
    return pathlib.Path(f"/proc/{pid}/maps").read_text()
  except OSError:
    return ""


def _loading_jaxlib(pid, _):
  """jaxlib's extension is mapped: the process is inside `import jax` (its C extension's
  initialisation and the Python around it)."""
  return "jaxlib" in _maps(pid)


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 75)])
def test_a_signal_during_import_jax_is_one_line(root, tmp_path, signum, code):
  got, lines, _, delay = _run_until(signal_timings.train_cmd(root, tmp_path / "run"),
                                    _loading_jaxlib, signum)
  assert (got, len(lines)) == (code, 1), lines
  assert lines[0].startswith("interrupted" if signum == signal.SIGINT else "preempted"), lines
  assert not [b for b in BAD if b in "\n".join(lines)]
  assert delay < 30, delay  # not the seconds of the rest of the start-up: at once


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 75)])
def test_a_signal_while_compiling_ends_at_once(root, tmp_path, signum, code):
  seen = []

  def compiling(_, text):  # the data line is out: the programs compile from here on
    if "\ndata    store" in text and not seen:
      seen.append(time.monotonic())
    return bool(seen) and time.monotonic() - seen[0] > 0.5

  wd = tmp_path / "run"
  got, lines, _, _ = _run_until(signal_timings.train_cmd(root, wd) + ["--config.compile_cache_dir="],
                                compiling, signum)
  assert (got, len(lines)) == (code, 1), lines
  assert not (wd / "checkpoints").exists() or not any((wd / "checkpoints").iterdir())


def test_sigterm_while_training_checkpoints_and_exits_75(root, tmp_path):
  wd = tmp_path / "run"
  metrics = wd / "metrics.jsonl"
  got, lines, _, _ = _run_until(
      signal_timings.train_cmd(root, wd),
      lambda *_: metrics.exists() and len(metrics.read_text().splitlines()) >= 2, signal.SIGTERM)
  assert (got, len(lines)) == (75, 1), lines
  step = int(lines[0].split("checkpoint saved at step ")[1].split()[0])
  assert (wd / "checkpoints" / str(step)).is_dir()


BLOCKED = textwrap.dedent("""
    import sys, time
    from chinchax.runtime import watchdog
    watchdog.install()
    import jax, numpy as np
    from chinchax.runtime import distributed, interrupts
    interrupts.install(); distributed.install_sigterm_handler()
    def stuck(x):
      time.sleep(3600)
      return x
    f = jax.jit(lambda x: jax.pure_callback(stuck, jax.ShapeDtypeStruct((), np.float32), x))
    with watchdog.watch(float(sys.argv[1]), "rerun with fewer devices"), watchdog.keeping():
      print("blocked", flush=True)
      jax.block_until_ready(f(np.float32(1)))  # the main thread waits inside XLA for good
""")


def _blocked(tmp_path, stall_s):
  script = tmp_path / "blocked.py"
  script.write_text(BLOCKED)
  return [sys.executable, str(script), str(stall_s)]


def test_sigterm_is_honoured_while_the_main_thread_is_blocked_in_xla(tmp_path):
  cmd = _blocked(tmp_path, 0)
  got, lines, _, delay = _run_until(cmd, lambda _, text: "blocked" in text, signal.SIGTERM)
  assert (got, len(lines)) == (75, 1), lines
  assert "without a new checkpoint" in lines[0], lines
  assert delay >= 20  # the grace for a step boundary, then the line (no hang)


def test_a_stalled_step_ends_in_one_line(tmp_path):
  script = _blocked(tmp_path, 3)
  start = time.monotonic()
  out = subprocess.run(script, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  lines = [l for l in out.stderr.splitlines() if l.strip()]
  assert (out.returncode, len(lines)) == (69, 1), out.stderr
  assert lines[0].startswith("error: no progress for 3 s") and "fewer devices" in lines[0]
  assert time.monotonic() - start < 300


def test_only_the_chinchax_command_installs_the_handlers():
  from chinchax.runtime import watchdog
  assert watchdog.is_command("/venv/bin/chinchax", ["/venv/bin/python", "/venv/bin/chinchax"])
  assert watchdog.is_command("-m", ["python", "-X", "importtime", "-m", "chinchax.cli", "train"])
  assert not watchdog.is_command("/venv/bin/pytest", ["python", "-m", "pytest", "chinchax"])
  # a library user's process (a notebook, a test) keeps Python's own handling
  out = subprocess.run([sys.executable, "-c", "import signal, chinchax.cli; "
                        "print(signal.getsignal(signal.SIGTERM), signal.set_wakeup_fd(-1))"],
                       capture_output=True, text=True, timeout=120)
  assert out.stdout.split() == [str(signal.SIG_DFL), "-1"], out.stderr[-2000:]
