"""One workdir, one writer: the lock a run takes before it writes or deletes anything in its
workdir, local or ``gs://``.

The lock is a lease (:mod:`chinchax.storage.lease`) named ``writer`` in ``<workdir>/lock/``:
``lock/writer.<gen>`` is created exclusively (a hard link locally, a create with
``ifGenerationMatch=0`` on GCS), so of two processes started together exactly one holds it.
The holder rewrites its file every :data:`HEARTBEAT_S` seconds from a daemon thread and marks
it released when the run ends (finished, stopped, failed). Its content names the holder:
host, pid, the time it took the lock, the time of its last heartbeat.

A second process meets one ``error:`` line (:class:`WorkdirBusy`) naming the holder, unless
the holder is dead:

* on this host, its pid no longer runs (or belongs to a process started later) — a process
  killed with SIGKILL — the lock is taken over at once;
* on another host, its last heartbeat (the holder's clock) is older than
  :data:`TIMEOUT_S` seconds (this host's clock; hosts' clocks are assumed to agree to well
  within that) — the lock is taken over.

A take-over prints one ``note:`` line. A holder whose lock was taken over (it was judged dead
while it was not: a frozen host, clocks far apart) finds a later generation at its next
heartbeat and stops before its next checkpoint (:meth:`WorkdirLock.check`). Older
generations than the previous one are deleted by the next holder; a workdir the holder
created and left holding only its lock (the run was refused before writing) is removed.

Environment: ``CHINCHAX_WORKDIR_HEARTBEAT_S`` (default 30) and
``CHINCHAX_WORKDIR_LOCK_TIMEOUT_S`` (default 300).
"""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
import time

from chinchax import console
from chinchax import errors
from chinchax.storage import gcs
from chinchax.storage import lease as lease_lib
from chinchax.storage import paths as paths_lib

HEARTBEAT_S = float(os.environ.get("CHINCHAX_WORKDIR_HEARTBEAT_S", "30"))
TIMEOUT_S = float(os.environ.get("CHINCHAX_WORKDIR_LOCK_TIMEOUT_S", "300"))
LOCK_DIR = "lock"
NAME = "writer"
# Seconds the release at exit may take on an unreachable bucket before it is left to expire.
RELEASE_TIMEOUT_S = 10.0


class WorkdirBusy(errors.UserError):
  """Another live process holds the workdir's lock (or took it over from this one)."""


def _when(t: float) -> str:
  return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def holder(content: dict) -> str:
  """``pid 123 on host h (since 2026-01-02 03:04:05 UTC, last heartbeat 4 s ago)``."""
  beat = max(0.0, time.time() - float(content.get("time", 0)))
  return (f"pid {content.get('pid')} on host {content.get('host')} (since "
          f"{_when(float(content.get('since', content.get('time', 0))))}, last heartbeat "
          f"{beat:.0f} s ago)")


def _dead(content: dict) -> bool:
  """The holder of ``content`` is gone: its pid is free on this host, or (another host) its
  heartbeat is older than TIMEOUT_S by this host's clock."""
  if lease_lib.pid_gone(content):
    return True
  if content.get("host") == socket.gethostname():
    return False  # a live local pid: never judged by the clock
  return time.time() - float(content.get("time", 0)) > TIMEOUT_S


def _generations(directory) -> list[int]:
  try:
    names = [p.name for p in directory.iterdir()]
  except (FileNotFoundError, NotADirectoryError):
    return []
  return sorted(int(m.group(1)) for n in names if (m := re.fullmatch(rf"{NAME}\.(\d+)", n)))


class WorkdirLock:
  """The held lock of one workdir (see the module docstring); :meth:`release` at the end.

  Attributes:
    lost: set by the heartbeat when another process took the lock over.
  """

  def __init__(self, workdir, lease: lease_lib.Lease, created: bool = False):
    self.workdir, self.lease, self.lost, self.created = workdir, lease, False, created
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._beat, daemon=True,
                                    name="chinchax-workdir-lock")
    self._thread.start()

  def _beat(self) -> None:
    while not self._stop.wait(HEARTBEAT_S):
      try:
        if not self.lease.beat():
          self.lost = True
          return
      except Exception:  # noqa: BLE001 — storage unreachable: the next beat tries again
        continue

  def check(self) -> None:
    """Raises WorkdirBusy when another process has taken this workdir's lock over."""
    if self.lost or self.lease.lost():
      self.lost = True
      raise WorkdirBusy(f"workdir {self.workdir}: another process took its lock over (this one "
                        f"was judged dead: no heartbeat for {TIMEOUT_S:g} s); this process "
                        f"stops without writing more; let the other run finish")

  def release(self, reason: str = "finished") -> None:
    """Stops the heartbeat and marks the lock released (bounded on an unreachable bucket,
    where the lock is left to expire)."""
    self._stop.set()
    if self.lost:
      return
    try:
      gcs.bounded(lambda: self.lease.release(reason), RELEASE_TIMEOUT_S)
      if self.created:
        gcs.bounded(self._remove_if_unused, RELEASE_TIMEOUT_S)
    except Exception:  # noqa: BLE001 — the lock expires by its heartbeat's age instead
      pass

  def withdraw(self) -> None:
    """Releases a lock whose run wrote nothing (refused by a check after the lock was taken):
    its lock file is removed, so the workdir is left as it was found (and removed again when
    this process created it). Bounded like :meth:`release`."""
    self._stop.set()
    if self.lost:
      return
    try:
      gcs.bounded(self.lease.path.unlink, RELEASE_TIMEOUT_S)
      if self.created and not paths_lib.is_url(self.workdir):
        for d in (paths_lib.as_path(self.workdir) / LOCK_DIR, paths_lib.as_path(self.workdir)):
          d.rmdir()
    except Exception:  # noqa: BLE001 — a file left is a released-by-age lock, harmless
      pass

  def _remove_if_unused(self) -> None:
    """A workdir this process created and left holding nothing but its lock (a run refused
    before it wrote anything) is removed again."""
    wd = paths_lib.as_path(self.workdir)
    if {p.name for p in wd.iterdir()} != {LOCK_DIR} or _generations(wd / LOCK_DIR) != [
        self.lease.gen]:
      return
    self.lease.path.unlink()
    if not paths_lib.is_url(wd):
      for d in (wd / LOCK_DIR, wd):
        try:
          d.rmdir()
        except OSError:  # another process has just written there: it stays
          return


def acquire(workdir, lease_held: bool = False) -> WorkdirLock:
  """Takes the lock of ``workdir`` (created if missing) for this process.

  Args:
    workdir: the run's directory, local or ``gs://``.
    lease_held: the caller already holds a lease on this workdir that makes it the one
      writer (a ladder worker's run lease): any earlier lock is taken over without a note.
  Returns:
    the held :class:`WorkdirLock`, its heartbeat running.
  Raises:
    WorkdirBusy: a live process holds the lock (the line names it and what to do).
    PathError: the lock cannot be written (an unreachable bucket).
  """
  wd = paths_lib.as_path(workdir)
  directory = wd / LOCK_DIR
  created = not wd.exists()
  leases = lease_lib.Leases(directory, lease_lib.worker_id(), expiry_s=float("inf"),
                            dead=(lambda c: True) if lease_held else _dead)
  for _ in range(5):  # another process claimed the same generation first: look again
    gens = _generations(directory)
    if gens:
      leases.start_at(NAME, gens[-1] - 1)  # generations before the previous one are deleted
    state, content = leases.state(NAME)
    if state == "held":
      raise WorkdirBusy(
          f"workdir {workdir} is in use by {holder(content)}; wait for that run to end or stop "
          f"it (kill -TERM {content.get('pid')} on {content.get('host')} checkpoints and exits), "
          f"or choose another workdir (a lock whose process is gone is taken over: on this "
          f"host at once, from another host after {TIMEOUT_S:g} s without a heartbeat)")
    try:
      lease = leases.try_claim(NAME)
    except gcs.Unreachable as e:
      raise paths_lib.PathError(f"workdir {workdir}: its lock cannot be written ({e})") from None
    if lease is None:
      continue
    if state == "expired" and not lease_held:
      why = ("its process is gone" if lease_lib.pid_gone(content)
             else f"no heartbeat for more than {TIMEOUT_S:g} s")
      console.say(f"note: took over the lock of workdir {workdir} from {holder(content)}: {why}",
                  stream=sys.stderr)
    for g in _generations(directory):
      if g < lease.gen - 1:
        try:
          (directory / f"{NAME}.{g}").unlink()
        except OSError:
          pass
    return WorkdirLock(workdir, lease, created)
  raise WorkdirBusy(f"workdir {workdir}: other processes keep taking its lock; choose another "
                    f"workdir")
