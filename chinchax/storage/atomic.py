"""Atomic file primitives that hold on local disks, NFS-like shared filesystems and object stores.

* :func:`write_atomic` — write a unique temporary file, rename it into place
  (readers see the old or the new content, never a part).
* :func:`create_exclusive` — create a file with its full content only if the
  name is free (a hard link of a unique temporary file: ``link`` fails with
  EEXIST when the name exists; on NFS a lost reply is resolved by the
  temporary file's link count). No ``flock``/``fcntl`` locks are used: they are
  unreliable or absent on many shared filesystems.

On an object store (a ``gs://`` ladder workdir) there are no renames or hard
links, but one object write is atomic and GCS writes can be conditional:
:func:`write_atomic` is one write, :func:`create_exclusive` a create with
``ifGenerationMatch=0`` (:func:`chinchax.storage.gcs.create`), and :func:`rewrite_if`
a rewrite that succeeds only while the object is at the generation last
written (``ifGenerationMatch=<g>``). Local paths use the standard library only
(:mod:`chinchax.storage.paths` and :mod:`chinchax.storage.gcs` import no third-party package
at import time).
"""

from __future__ import annotations

import errno
import os
import pathlib
import socket
import uuid

from chinchax.storage import gcs
from chinchax.storage import paths as paths_lib


def unique_path(path: pathlib.Path) -> pathlib.Path:
  """A hidden sibling name of ``path`` that no other process, on any host, uses."""
  path = pathlib.Path(path)
  return path.with_name(f".{path.name}.{socket.gethostname()}-{os.getpid()}-"
                        f"{uuid.uuid4().hex[:8]}")


def _written_aside(path: pathlib.Path, text: str) -> pathlib.Path:
  """A unique sibling of ``path`` holding ``text``, flushed to the disk (or the NFS server)."""
  tmp = unique_path(path)
  try:
    with open(tmp, "w") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
  except BaseException:  # e.g. a full disk: no half-written temporary file is left
    tmp.unlink(missing_ok=True)
    raise
  return tmp


def _is_url(path) -> bool:
  return "://" in str(path)


def as_path(path):
  """``pathlib.Path`` of a local path; an ``epath.Path`` of a URL (:func:`chinchax.storage.paths.as_path`)."""
  if _is_url(path):
    return paths_lib.as_path(path)
  return pathlib.Path(path)


def write_atomic(path: pathlib.Path, text: str) -> None:
  """Writes ``text`` to ``path`` through a unique temporary file renamed into place (an
  object store: one write)."""
  if _is_url(path):
    path.write_text(text)
    return
  os.replace(_written_aside(path, text), path)


def create_exclusive(path: pathlib.Path, text: str) -> bool:
  """Creates ``path`` holding ``text`` unless it exists; True when this call created it."""
  return create_object(path, text) is not None if _is_url(path) else _link_exclusive(path, text)


def create_object(path, text: str) -> int | None:
  """On an object store: creates ``path`` unless it exists; its generation, or None if taken."""
  return gcs.create(str(path), text.encode())


def rewrite_if(path, text: str, generation: int) -> int | None:
  """On an object store: replaces ``path`` with ``text`` only while it is at ``generation``;
  the new generation, or None when the object changed or vanished."""
  return gcs.rewrite(str(path), text.encode(), generation)


def _link_exclusive(path: pathlib.Path, text: str) -> bool:
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
