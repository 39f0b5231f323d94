"""Atomic file primitives that hold on local disks and on NFS-like shared filesystems.

* :func:`write_atomic` — write a unique temporary file, rename it into place
  (readers see the old or the new content, never a part).
* :func:`create_exclusive` — create a file with its full content only if the
  name is free (a hard link of a unique temporary file: ``link`` fails with
  EEXIST when the name exists; on NFS a lost reply is resolved by the
  temporary file's link count). No ``flock``/``fcntl`` locks are used: they are
  unreliable or absent on many shared filesystems.

Standard library only.
"""

from __future__ import annotations

import errno
import os
import pathlib
import socket
import uuid


def unique_path(path: pathlib.Path) -> pathlib.Path:
  """A hidden sibling name of ``path`` that no other process, on any host, uses."""
  path = pathlib.Path(path)
  return path.with_name(f".{path.name}.{socket.gethostname()}-{os.getpid()}-"
                        f"{uuid.uuid4().hex[:8]}")


def _written_aside(path: pathlib.Path, text: str) -> pathlib.Path:
  """A unique sibling of ``path`` holding ``text``, flushed to the disk (or the NFS server)."""
  tmp = unique_path(path)
  with open(tmp, "w") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  return tmp


def write_atomic(path: pathlib.Path, text: str) -> None:
  """Writes ``text`` to ``path`` through a unique temporary file renamed into place."""
  os.replace(_written_aside(path, text), path)


def create_exclusive(path: pathlib.Path, text: str) -> bool:
  """Creates ``path`` holding ``text`` unless it exists; True when this call created it."""
  tmp = _written_aside(path, text)
  try:
    os.link(tmp, path)
    return True
  except FileExistsError:
    return False
  except OSError as e:
    if e.errno == errno.EEXIST:
      return False
    try:  # NFS: the link may have been made although its reply was lost
      if os.stat(tmp).st_nlink == 2:
        return True
    except OSError:
      pass
    raise
  finally:
    tmp.unlink()
