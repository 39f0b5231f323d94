"""A full disk, said in one line: what was being written, where, and the free space needed.

A write that fails with ENOSPC (or, from tensorstore / orbax, RESOURCE_EXHAUSTED) becomes a
:class:`DiskFull` — a user error (one ``error:`` line, exit status 2) — at the place that knows
what it was writing: a checkpoint of step S (``chinchax.checkpoint``), a metrics row of step S
(``chinchax.train.metrics``), the token store (``chinchax.data.builder``); the command line
turns any other ENOSPC (a ladder lease, the fit's figures) into the same line. What was
written before stays: a rerun, once space is freed, resumes from the last checkpoint.
"""

from __future__ import annotations

import errno
import os
import shutil

from chinchax import errors

_MARKERS = ("No space left on device", "RESOURCE_EXHAUSTED", "ENOSPC", "Disk quota exceeded")


class DiskFull(errors.UserError):
  """A write failed because the filesystem is full (or over quota)."""


def is_disk_full(e: BaseException) -> bool:
  """True for ENOSPC / EDQUOT, and for errors whose text says so (tensorstore, orbax), along
  the exception's chain."""
  seen = 0
  while e is not None and seen < 8:
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
      return True
    if any(m in str(e) for m in _MARKERS):
      return True
    e, seen = e.__cause__ or e.__context__, seen + 1
  return False


def free_bytes(path) -> int | None:
  """Bytes free to this user on the filesystem of ``path`` (or its nearest existing ancestor)."""
  p = os.path.abspath(os.path.expanduser(str(path)))
  while not os.path.exists(p) and os.path.dirname(p) != p:
    p = os.path.dirname(p)
  try:
    return shutil.disk_usage(p).free
  except OSError:
    return None


def size(n: float) -> str:
  """``812 B``, ``3.1 kB``, ``2.4 MB``, ``1.2 GB`` (powers of 1000)."""
  for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
    if n >= scale:
      return f"{n / scale:.1f} {unit}"
  return f"{int(n)} B"


def disk_full(what: str, path, needed: float | None, then: str = "",
              free: int | None = None) -> DiskFull:
  """The :class:`DiskFull` error for ``what`` (e.g. "saving the checkpoint of step 300") at
  ``path``, which needs about ``needed`` bytes (None: unknown); ``then`` says what was kept;
  ``free``: the free bytes when it failed (default: now)."""
  free = free_bytes(path) if free is None else free
  need = f"it needs about {size(needed)} free" if needed else "it needs more free space"
  has = f", {size(free)} are free" if free is not None else ""
  keep = f"; {then}" if then else ""
  return DiskFull(f"the disk is full: {what} in {path} failed; {need}{has}{keep}; free some "
                  f"space and rerun the same command to resume")
