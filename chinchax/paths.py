"""Filesystem checks of what a run writes and reads, made before any expensive work.

A directory that cannot be created or written (under ``/proc``, a file in its
place, read-only) and a corpus file or directory that cannot be read are
:class:`PathError` s (one ``error:`` line, exit 2), found before the corpus is
scanned or a token store built; nothing is left behind by the checks.
"""

from __future__ import annotations

import os
import pathlib
import tempfile

from chinchax import errors


class PathError(errors.UserError):
  """A directory that cannot be written or a file or directory that cannot be read."""


def _nearest_existing(path: pathlib.Path) -> pathlib.Path:
  p = path
  while not os.path.lexists(p) and p != p.parent:
    p = p.parent
  return p


def check_writable_dir(path, what: str) -> pathlib.Path:
  """Checks that directory ``path`` exists or can be created, and that files can be written in it.

  Creates nothing: a probe file is made (and removed) in ``path`` or in its
  nearest existing ancestor.

  Args:
    path: the directory (``~`` expanded).
    what: its name for the message, e.g. ``"workdir"``.
  Returns:
    the expanded path.
  Raises:
    PathError: a file stands in its place (or in an ancestor's), or the
      directory (or ancestor) does not accept new files.
  """
  p = pathlib.Path(os.path.expanduser(str(path)))
  existing = _nearest_existing(p.absolute())
  if not existing.is_dir():
    where = "is a file" if existing == p.absolute() else f"cannot be created: {existing} is a file"
    raise PathError(f"{what} {p} {where}, not a directory; choose another {what}")
  try:
    fd, probe = tempfile.mkstemp(prefix=".chinchax-write-probe-", dir=existing)
    os.close(fd)
    os.unlink(probe)
  except OSError as e:
    where = "is not writable" if existing == p.absolute() else f"cannot be created in {existing}"
    raise PathError(f"{what} {p} {where} ({e.strerror or e}); choose a writable {what}") from None
  return p


def unreadable_dir(pattern: str) -> pathlib.Path | None:
  """The first directory on the literal (glob-free) prefix of ``pattern`` that cannot be listed."""
  literal = []
  for part in pathlib.Path(os.path.expanduser(pattern)).absolute().parts:
    if any(ch in part for ch in "*?["):
      break
    literal.append(part)
  p = pathlib.Path(*literal) if literal else pathlib.Path("/")
  for d in [*reversed(p.parents), p]:
    if not os.path.isdir(d):
      return None
    try:
      os.listdir(d)
    except PermissionError:
      return d
  return None


def check_readable_file(path: pathlib.Path) -> None:
  """Raises PathError when ``path`` cannot be opened and read."""
  try:
    with open(path, "rb") as f:
      f.read(1)
  except OSError as e:
    raise PathError(f"corpus file {path} cannot be read ({e.strerror or e})") from None
