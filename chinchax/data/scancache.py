"""A corpus's scan (fingerprint and counts), remembered per file set so that a start on an
existing store does not read and hash the whole corpus again.

The fingerprint that names a store (:func:`chinchax.data.sources.scan`) is a
sha256 over every document, one full read of the corpus (1.6–2.1 s per GB).
For a corpus of files (``data.source=files`` and ``stdlib``) :func:`scan`
records it in ``<root>/fingerprints/<key>.json`` beside the files' *stat
signature*: for every file its path, size, modification time, change time
(``st_ctime_ns``) and inode, in corpus order. The next scan of the same
source (``key``: sha256 of its description, which lists the files) reuses the
recorded result when every signature entry is unchanged, and reads and hashes
everything otherwise.

**The rule**: a file whose bytes changed has a new change time — the kernel
sets ``st_ctime`` on every write and on every metadata change, and no user
call can set it back (``touch``/``os.utime`` set the modification time only)
— so a changed corpus is always rescanned; a file replaced by another (a
rename, a copy) has a new inode or change time. Files added or removed change
the file list, hence the key. HF datasets (``data.source=hf``) have no files
to stat here and are always scanned. The signature is taken before the scan,
so a file written while it is read is rescanned next time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib

from chinchax.storage import paths as paths_lib
from chinchax.data import sources as sources_lib

VERSION = 1
CACHE_DIR = "fingerprints"


def stat_signature(source) -> list | None:
  """[[path, size, mtime_ns, ctime_ns, inode], ...] of a file source's files in corpus
  order; None for a source without files (an HF dataset)."""
  files = getattr(source, "files", None)
  if files is None:
    return None
  sig = []
  for f in files:
    st = os.stat(f)
    sig.append([str(f), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino])
  return sig


def cache_path(source, root) -> pathlib.Path:
  """``<root>/fingerprints/<sha256(version, source description)[:32]>.json``."""
  payload = json.dumps({"version": VERSION, "source": source.describe()}, sort_keys=True)
  return pathlib.Path(root) / CACHE_DIR / f"{hashlib.sha256(payload.encode()).hexdigest()[:32]}.json"


def scan(source, root) -> tuple[sources_lib.Scan, bool]:
  """The source's :class:`chinchax.data.sources.Scan`, from the record under ``root`` when its
  files' stat signature is unchanged (see the module's rule), else by a full read (recorded).

  Args:
    source: a source of :mod:`chinchax.data.sources`.
    root: a local directory for the records (the store root, or its local stage for gs://).
  Returns:
    (scan, whether it came from the record).
  """
  sig = stat_signature(source)
  if sig is None:
    return sources_lib.scan(source), False
  path = cache_path(source, root)
  try:
    saved = json.loads(path.read_text())
    if saved.get("stat") == sig:
      return sources_lib.Scan(**saved["scan"]), True
  except (OSError, ValueError, KeyError, TypeError):
    pass
  info = sources_lib.scan(source)
  if not info.nonempty:  # refused by the builder: nothing is written for it
    return info, False
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    paths_lib.write_text_atomic(path, json.dumps({"stat": sig, "scan": dataclasses.asdict(info)}))
  except OSError:  # a read-only root: no record, the next start scans again
    pass
  return info, False
