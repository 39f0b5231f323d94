"""K local ladder workers: ``chinchax ladder --config.ladder.workers=K``.

Starts K processes of ``chinchax ladder ... --config.ladder.worker=True`` on
this machine, each with one CPU device (pinned to its own core when the
machine has K cores and ``ladder.pin_cpus`` is set), and waits for them.
SIGTERM and Ctrl-C are passed on to the workers, which checkpoint, release
their leases and exit with 75.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from chinchax import console
from chinchax import distributed as distributed_lib

WORKER_FLAGS = ("--config.ladder.worker=True", "--config.ladder.workers=1",
                "--config.ladder.fit=False", "--config.ladder.status=False",
                "--config.train_config.mesh.num_cpu_devices=1")


def worker_command(argv: list[str]) -> list[str]:
  """The command line of one local worker for the ``chinchax ladder`` arguments ``argv``."""
  return [sys.executable, "-m", "chinchax.cli", "ladder", *argv, *WORKER_FLAGS]


def _cores(k: int, pin: bool, available: set[int] | None = None) -> list[set[int] | None]:
  """CPU core set of each of ``k`` workers (None: not pinned), from ``available`` (default:
  this process's)."""
  if not pin or not hasattr(os, "sched_getaffinity"):
    return [None] * k
  cores = sorted(os.sched_getaffinity(0) if available is None else available)
  if len(cores) < k:
    return [None] * k
  return [{cores[i]} for i in range(k)]


def run_local_workers(argv: list[str], k: int, pin: bool = True,
                      available: set[int] | None = None) -> int:
  """Runs ``k`` worker processes to the end; returns 0, 75 (one was preempted) or a failure code.

  Args:
    argv: the ``chinchax ladder`` arguments (the worker flags are appended).
    k: number of workers.
    pin: pin worker i to core i (when there are at least k cores).
    available: the cores to pin to (default: this process's; an IsoTime ladder's main
      process passes the machine's, having pinned itself to the first).
  """
  cmd = worker_command(argv)
  procs = []
  placement = _cores(k, pin, available)
  for i, cores in enumerate(placement):
    env = dict(os.environ, CHINCHAX_LADDER_WORKER=str(i))
    preexec = (lambda c=cores: os.sched_setaffinity(0, c)) if cores else None
    procs.append(subprocess.Popen(cmd, env=env, preexec_fn=preexec))
  where = ", ".join(f"pid {p.pid}" + (f" on core {min(c)}" if c else "")
                    for p, c in zip(procs, placement))
  console.say(f"ladder  {k} local workers: {where}")

  def forward(signum, frame):
    for p in procs:
      if p.poll() is None:
        p.send_signal(signal.SIGTERM)

  old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
  try:
    codes = [p.wait() for p in procs]
  finally:
    for s, h in old.items():
      signal.signal(s, h)
  bad = [c for c in codes if c != 0]
  if not bad:
    return 0
  if distributed_lib.PREEMPTED_EXIT_CODE in bad:
    return distributed_lib.PREEMPTED_EXIT_CODE
  console.warn(f"local ladder workers exited with {codes}")
  return bad[0]
