"""A token store on an object store (``data.store_root=gs://bucket/stores``): staged locally,
uploaded once, read in place.

A store is built exactly as on a local disk, in a staging directory on this
host (:func:`staging_root`: ``$CHINCHAX_STAGE_DIR/<bucket>/<prefix>``, default
``~/.cache/chinchax/stage``), then :func:`upload` copies it under the
``gs://`` root: every file first, ``manifest.json`` last — its presence marks a
complete store there as here, so a reader never takes a half-uploaded store
for whole. The staged copy is then deleted. Readers open the zarr arrays
through tensorstore's ``gcs`` kvstore and the small files through
``etils.epath`` (:mod:`chinchax.data.store`); nothing is downloaded whole.

In a multi-process run process 0 builds and uploads while the others wait
(``distributed.process_zero_first``); they find the manifest and read the
store in place. A trained BPE tokenizer (``<root>/tokenizers/``) is kept under
the ``gs://`` root too and fetched into the stage before a build looks for it.
"""

from __future__ import annotations

import os
import pathlib
import shutil

from chinchax.storage import gcs
from chinchax.storage import paths as paths_lib

MANIFEST = "manifest.json"  # chinchax.data.store.MANIFEST (not imported: store imports this module)


def staging_root(url: str) -> pathlib.Path:
  """The local directory where stores for ``url`` are built before upload."""
  base = os.environ.get("CHINCHAX_STAGE_DIR") or os.path.join("~", ".cache", "chinchax", "stage")
  bucket, key = gcs.split(url)
  return pathlib.Path(os.path.expanduser(base)) / bucket / key


def _fs(url: str):
  import fsspec  # noqa: PLC0415 — only for URLs
  return fsspec.core.url_to_fs(str(url))[0]


def upload(local: pathlib.Path, url) -> None:
  """Copies directory ``local`` to ``url``, its manifest last; then deletes ``local``.

  Raises:
    OSError: a write failed; ``url`` then has no manifest (not a complete store)
      and ``local`` is kept, so a rerun uploads again.
  """
  local = pathlib.Path(local)
  fs = _fs(url)
  files = sorted(p for p in local.rglob("*") if p.is_file() and p.name != MANIFEST)
  for p in files:
    fs.put_file(str(p), f"{url}/{p.relative_to(local).as_posix()}")
  fs.put_file(str(local / MANIFEST), f"{url}/{MANIFEST}")
  shutil.rmtree(local, ignore_errors=True)


def sync_tokenizers(url_root: str, local_root: pathlib.Path, up: bool) -> None:
  """Copies the trained tokenizers (``tokenizers/*.json``) between the ``gs://`` root and
  the stage: down before a build (``up`` False), up after it; files present on both sides
  are left alone."""
  remote = paths_lib.as_path(url_root) / "tokenizers"
  local = pathlib.Path(local_root) / "tokenizers"
  if up:
    for p in sorted(local.glob("*.json")) if local.is_dir() else []:
      if not (remote / p.name).exists():
        (remote / p.name).write_text(p.read_text())
    return
  try:
    names = [p.name for p in remote.iterdir() if p.name.endswith(".json")]
  except FileNotFoundError:
    return
  for name in names:
    if not (local / name).exists():
      local.mkdir(parents=True, exist_ok=True)
      paths_lib.write_text_atomic(local / name, (remote / name).read_text())


def load_npy(path):
  """``np.load`` of a local or ``gs://`` ``.npy`` file."""
  import io  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415
  p = paths_lib.as_path(path)
  if not paths_lib.is_url(p):
    return np.load(p)
  return np.load(io.BytesIO(p.read_bytes()))
