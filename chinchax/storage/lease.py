"""Leases: which worker runs which ladder run (and which process writes a workdir,
:mod:`chinchax.storage.workdir_lock`), safe without locks on local and shared disks.

A run's leases are files ``leases/<run_id>.<gen>`` (gen = 0, 1, 2, ...). A
worker claims a run by creating the next generation's file: the file is
written under a unique name and hard-linked to the lease name, which fails
with EEXIST when another worker got there first (``link`` is atomic on local
filesystems and on NFS; a lost NFS reply is resolved by the temporary file's
link count, 2 when the link was made). So exactly one worker holds a
generation, and its file is complete when it appears.

The holder rewrites its file every ``heartbeat_s`` (a rename of a new
version, with ``beat`` one higher) and marks it ``released`` — with a
reason: ``recorded``, ``preempted``, ``skipped`` — when it stops working on the
run. The file also carries the attempt number, so the next holder knows
whether its predecessor died (expired: the attempt counts) or was preempted
(released: the attempt goes on). The next generation may be claimed
when the current one is released, or when its content has not changed for
``expiry_s`` seconds of the observer's own monotonic clock — no clocks of
different hosts are compared. A holder whose file has a successor has lost
its lease (:meth:`Lease.beat` returns False) and must stop working on the
run. Files are never deleted, so generations only grow.

On an object store (a ``gs://`` ladder workdir) the claim is a create with
``ifGenerationMatch=0`` — GCS's atomic create: exactly one of several
concurrent creates of a name succeeds — and every heartbeat or release a
rewrite with ``ifGenerationMatch`` set to the object generation this holder
last wrote, so only the holder's own latest write can be replaced; a rewrite
that fails means the lease is lost. Expiry is judged, as on disk, by the
observer's own clock from the content it reads — or at once, when the caller's ``dead``
judge says the holder is gone (its pid no longer runs on this host). See
:mod:`chinchax.storage.atomic`.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import time

from chinchax.storage import atomic as files

# A lease read that is not JSON is read again this many times (a store whose rewrites are not
# atomic, e.g. an emulator's filesystem backend, can show a file mid-rewrite) before it is judged
# by its raw text under the key TORN.
TORN_READS = 5
TORN = "unreadable"

LEASES_DIR = "leases"


def worker_id() -> str:
  """This process's name in leases and rows: ``host-pid``."""
  return f"{socket.gethostname()}-{os.getpid()}"


def process_start(pid: int) -> int | None:
  """The start time of process ``pid`` in clock ticks since boot (``/proc/PID/stat`` field 22),
  which tells a reused pid from the original; None where /proc is absent or it has ended."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return int(f.read().rsplit(")", 1)[1].split()[19])
  except (OSError, ValueError, IndexError):
    return None


def pid_gone(content: dict) -> bool:
  """True when lease ``content`` was written on this host by a process that no longer runs
  (its pid is free, or now belongs to a process started later)."""
  pid = content.get("pid")
  if content.get("host") != socket.gethostname() or not isinstance(pid, int):
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return True
  except PermissionError:  # another user's live process
    return False
  start = content.get("pid_start")
  return start is not None and process_start(pid) not in (None, start)


class Lease:
  """A held lease of one run (generation ``gen``), owned by this process.

  Attributes:
    attempt: the attempt of the run this lease carries (set by the holder, 0 until then).
    before: (state, content) of the previous generation when this one was
      claimed: ``("free", None)``, ``("released", {...})`` or ``("expired", {...})``.
  """

  def __init__(self, path: pathlib.Path, run_id: str, gen: int, owner: str, before=("free", None)):
    self.path, self.run_id, self.gen, self.owner = path, run_id, gen, owner
    self.n_beat, self.attempt, self.before = 0, 0, before
    self.since = time.time()
    self.generation = None  # an object store: the object generation this holder last wrote

  def content(self, released: str | bool = False) -> str:
    return json.dumps({"run_id": self.run_id, "gen": self.gen, "owner": self.owner,
                       "host": socket.gethostname(), "pid": os.getpid(),
                       "pid_start": process_start(os.getpid()), "since": self.since,
                       "attempt": self.attempt, "beat": self.n_beat, "time": time.time(),
                       "released": released})

  def lost(self) -> bool:
    """True when a later generation exists: another worker took the run over."""
    return self.path.with_name(f"{self.run_id}.{self.gen + 1}").exists()

  def beat(self) -> bool:
    """Renews the lease; False (and nothing written) when it has been lost."""
    if self.lost():
      return False
    self.n_beat += 1
    return self._write(self.content())

  def _write(self, text: str) -> bool:
    if self.generation is None:
      files.write_atomic(self.path, text)
      return True
    self.generation = files.rewrite_if(self.path, text, self.generation)
    return self.generation is not None

  def release(self, reason: str = "recorded") -> None:
    """Marks the lease released for ``reason`` (the next generation may be claimed at once)."""
    if not self.lost():
      self._write(self.content(released=reason))


class Leases:
  """The lease directory of a ladder workdir, seen by one worker.

  Args:
    directory: ``<workdir>/leases``.
    owner: this worker's id.
    expiry_s: a held lease whose file has not changed for this long (by this
      observer's clock) has expired.
    clock: monotonic seconds (tests pass a fake one).
    dead: ``dead(content) -> bool``, True when a held lease's holder is known to be gone
      (:func:`pid_gone`): such a lease has expired at once.
  """

  def __init__(self, directory: pathlib.Path, owner: str, expiry_s: float,
               clock=time.monotonic, dead=None):
    self.dir = files.as_path(directory)  # created by the first claim: a query writes nothing
    self.owner, self.expiry_s, self.clock, self.dead = owner, expiry_s, clock, dead
    self._gen: dict[str, int] = {}                      # highest generation seen per run
    self._seen: dict[str, tuple[int, str, float]] = {}  # run -> (gen, content, first seen at)

  def _path(self, run_id: str, gen: int) -> pathlib.Path:
    return self.dir / f"{run_id}.{gen}"

  def start_at(self, run_id: str, gen: int) -> None:
    """Looks for a run's newest generation from ``gen`` on (its older files may be deleted)."""
    self._gen[run_id] = max(self._gen.get(run_id, -1), gen)

  def current(self, run_id: str) -> tuple[int, dict | None]:
    """(highest generation, its content) of a run; (-1, None) when never claimed."""
    g = self._gen.get(run_id, -1)
    while self._path(run_id, g + 1).exists():
      g += 1
    self._gen[run_id] = g
    if g < 0:
      return g, None
    for attempt in range(TORN_READS):
      try:
        text = self._path(run_id, g).read_text()
      except FileNotFoundError:
        return g, None
      try:
        return g, json.loads(text)
      except ValueError:  # caught mid-rewrite by a store whose rewrites are not atomic
        time.sleep(0.05 * (attempt + 1))
    return g, {TORN: text}  # judged by its text alone: held until unchanged for expiry_s

  def state(self, run_id: str) -> tuple[str, dict | None]:
    """``("free" | "released" | "held" | "expired", content)`` of a run's current lease."""
    g, content = self.current(run_id)
    if content is None:
      return "free", None
    if TORN in content:
      pass
    elif content["released"]:
      return "released", content
    elif self.dead is not None and self.dead(content):
      return "expired", content
    text = json.dumps(content, sort_keys=True)
    now = self.clock()
    seen = self._seen.get(run_id)
    if seen is None or seen[:2] != (g, text):
      self._seen[run_id] = (g, text, now)
      return "held", content
    return ("expired" if now - seen[2] >= self.expiry_s else "held"), content

  def try_claim(self, run_id: str) -> Lease | None:
    """Claims the run's next generation when its current lease is free, released or expired.

    Returns:
      the held Lease, or None when a live worker holds the run or another
      worker claimed it first.
    """
    state, content = self.state(run_id)
    if state == "held":
      return None
    g = self._gen[run_id] + 1
    lease = Lease(self._path(run_id, g), run_id, g, self.owner, before=(state, content))
    self.dir.mkdir(parents=True, exist_ok=True)
    if "://" in str(lease.path):
      lease.generation = files.create_object(lease.path, lease.content())
      made = lease.generation is not None
    else:
      made = files.create_exclusive(lease.path, lease.content())
    self._gen[run_id] = g
    return lease if made else None
