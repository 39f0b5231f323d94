"""K local ladder workers: ``chinchax ladder --config.ladder.workers=K``.

Starts K processes of ``chinchax ladder ... --config.ladder.worker=True`` on
this machine, each with one CPU device (pinned to its own core when the
machine has K cores and ``ladder.pin_cpus`` is set), and waits for them,
showing one progress line (:mod:`chinchax.ladder.progress`).

The workers run in their own sessions: a Ctrl-C at the terminal reaches only
this process, which passes SIGTERM on (as it does its own SIGTERM); each
worker then checkpoints its run, releases its lease and exits with 75, and
this process reports the interrupt once. Their standard output (one line per
claimed run) is not shown; their standard error is, each distinct line once.
A worker dies with its parent (Linux: ``PR_SET_PDEATHSIG``, SIGTERM).
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import queue
import signal
import subprocess
import sys
import threading

from chinchax.runtime import distributed as distributed_lib

WORKER_ENV = "CHINCHAX_LADDER_WORKER"  # set to the worker's index in each local worker
WORKER_FLAGS = ("--config.ladder.worker=True", "--config.ladder.workers=1",
                "--config.ladder.fit=False", "--config.ladder.status=False",
                "--config.train_config.mesh.num_cpu_devices=1")
POLL_S = 1.0  # seconds between two reads of the results table


def worker_command(argv: list[str]) -> list[str]:
  """The command line of one local worker for the ``chinchax ladder`` arguments ``argv``."""
  return [sys.executable, "-m", "chinchax.cli", "ladder", *argv, *WORKER_FLAGS]


def is_local_worker() -> bool:
  """True in a worker process started by :func:`run_local_workers`."""
  return WORKER_ENV in os.environ


def die_with_parent() -> None:
  """Asks Linux to send this process SIGTERM when its parent dies (no-op elsewhere)."""
  if not sys.platform.startswith("linux"):
    return
  try:
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG = 1
  except (OSError, AttributeError):
    return
  if os.getppid() == 1:  # the parent died before the request was made
    os.kill(os.getpid(), signal.SIGTERM)


def _cores(k: int, pin: bool, available: set[int] | None = None) -> list[set[int] | None]:
  """CPU core set of each of ``k`` workers (None: not pinned), from ``available`` (default:
  this process's)."""
  if not pin or not hasattr(os, "sched_getaffinity"):
    return [None] * k
  cores = sorted(os.sched_getaffinity(0) if available is None else available)
  if len(cores) < k:
    return [None] * k
  return [{cores[i]} for i in range(k)]


@dataclasses.dataclass
class LocalResult:
  """How the local workers ended.

  Attributes:
    codes: each worker's exit status (negative: killed by that signal).
    pids: each worker's process id.
    interrupted: Ctrl-C reached this process while they ran.
    stopped: SIGTERM reached this process while they ran.
  """

  codes: list[int]
  pids: list[int]
  interrupted: bool = False
  stopped: bool = False

  def died(self) -> list[str]:
    """``worker I (pid P) was killed by SIGKILL`` / ``... exited with 1`` for each worker that
    neither finished nor stopped on request."""
    return [death(i, pid, code) for i, (code, pid) in enumerate(zip(self.codes, self.pids))
            if code not in (0, distributed_lib.PREEMPTED_EXIT_CODE)]


def death(i: int, pid: int, code: int) -> str:
  """How worker ``i`` ended with exit status ``code``, in words."""
  how = (f"was killed by {signal.Signals(-code).name}" if code < 0 and -code in
         signal.valid_signals() else f"exited with {code}")
  return f"worker {i} (pid {pid}) {how}"


def _pump(stream, tag: int, lines: queue.Queue) -> None:
  for line in iter(stream.readline, ""):
    lines.put((tag, line.rstrip("\n")))
  stream.close()


def run_local_workers(argv: list[str], k: int, pin: bool = True,
                      available: set[int] | None = None, progress=None,
                      say=print) -> LocalResult:
  """Runs ``k`` worker processes to the end; returns how they ended.

  Args:
    argv: the ``chinchax ladder`` arguments (the worker flags are appended).
    k: number of workers.
    pin: pin worker i to core i (when there are at least k cores).
    available: the cores to pin to (default: this process's; an IsoTime ladder's main
      process passes the machine's, having pinned itself to the first).
    progress: a :class:`~chinchax.ladder.progress.LadderProgress` updated every
      :data:`POLL_S` seconds (its ``write`` prints the workers' stderr lines), or None.
    say: where the start line and the workers' lines go without ``progress``.
  """
  cmd = worker_command(argv)
  procs, pumps = [], []
  placement = _cores(k, pin, available)
  lines: queue.Queue = queue.Queue()
  for i, cores in enumerate(placement):
    env = dict(os.environ, **{WORKER_ENV: str(i)})
    # No preexec_fn: it would run fork handlers in this (JAX, multi-threaded) process.
    p = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, errors="replace")
    if cores:
      try:
        os.sched_setaffinity(p.pid, cores)  # before it starts its threads: they inherit it
      except OSError:
        pass
    pump = threading.Thread(target=_pump, args=(p.stderr, i, lines), daemon=True)
    pump.start()
    procs.append(p)
    pumps.append(pump)
  where = ", ".join(f"pid {p.pid}" + (f" on core {min(c)}" if c else "")
                    for p, c in zip(procs, placement))
  write = progress.write if progress is not None else say
  write(f"ladder  {k} local workers: {where}")
  result = LocalResult([], [p.pid for p in procs])

  def forward(signum, frame):
    if signum == signal.SIGINT:
      result.interrupted = True
    else:
      result.stopped = True
    for p in procs:
      if p.poll() is None:
        p.send_signal(signal.SIGTERM)  # a second one stops a worker at once

  old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
  seen: set[str] = set()
  reported_dead: set[int] = set()
  try:
    while True:
      running = [p for p in procs if p.poll() is None]
      try:
        while True:
          _, line = lines.get(timeout=POLL_S if running else 0.1)
          if line not in seen:  # the same warning from every worker: once
            seen.add(line)
            write(line)
      except queue.Empty:
        pass
      for i, p in enumerate(procs):
        code = p.poll()
        if code not in (None, 0, distributed_lib.PREEMPTED_EXIT_CODE) and i not in reported_dead:
          reported_dead.add(i)
          if not (result.interrupted or result.stopped):
            write(f"ladder  {death(i, p.pid, code)}; the other workers take its run over "
                  f"when its lease expires")
      if progress is not None:
        progress.update()
      if not running and lines.empty() and not any(t.is_alive() for t in pumps):
        break
  finally:
    for s, h in old.items():
      signal.signal(s, h)
  result.codes = [p.wait() for p in procs]
  if progress is not None:
    progress.close()
  return result
