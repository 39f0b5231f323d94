"""Paths of what a run writes and reads — local or ``gs://`` — and their checks before any
expensive work.

:func:`as_path` is the one entry point: a local path (``~`` expanded) becomes a
``pathlib.Path`` and behaves exactly as always; a URL (``gs://bucket/a/b``, or
any scheme ``etils.epath`` serves) becomes an ``epath.Path`` with the same
methods (``/``, ``name``, ``parent``, ``exists``, ``read_text``,
``write_text``, ``iterdir``, ``mkdir``, ``unlink``). On an object store a
"directory" is a key prefix, ``mkdir`` is a no-op, and one object write is
atomic (readers see the old or the new object), so :func:`write_text_atomic`
writes in place there and renames a temporary file locally. Objects cannot be
appended to: files that grow (metrics rows) are rewritten whole, see
:mod:`chinchax.train.metrics`. See docs/storage.md.

A directory that cannot be created or written (under ``/proc``, a file in its
place, read-only; a missing bucket, a denied write, an endpoint that does not
answer within :data:`chinchax.storage.gcs.CHECK_TIMEOUT_S`) and a corpus file or
directory that cannot be read are :class:`PathError` s (one ``error:`` line,
exit 2), found before the corpus is scanned or a token store built; nothing
is left behind by the checks.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pathlib
import shutil
import tempfile
import uuid

from chinchax import errors
from chinchax.storage import gcs

gcs.configure()


class PathError(errors.UserError):
  """A directory that cannot be written or a file or directory that cannot be read."""


def is_url(path) -> bool:
  """True for ``scheme://...`` (gs://, s3://, ...): a path on an object store."""
  return "://" in str(path)


def as_path(path):
  """``path`` as a path object: ``pathlib.Path`` (``~`` expanded) locally, ``epath.Path`` for a URL.

  Raises:
    PathError: a URL without a bucket (``gs://`` or ``gs:///x``), or a scheme
      whose filesystem package is not installed.
  """
  if not is_url(path):
    return pathlib.Path(os.path.expanduser(str(path)))
  text = str(path).rstrip("/") if str(path).count("/") > 2 else str(path)
  scheme, rest = text.split("://", 1)
  if not rest.split("/", 1)[0]:
    raise PathError(f"{path} names no bucket; write {scheme}://BUCKET/path")
  if scheme == "gs":
    try:
      import gcsfs  # noqa: F401, PLC0415 — epath's gs:// backend
    except ImportError:
      raise PathError(f"{path}: gs:// paths need gcsfs; pip install 'chinchax[gcs]'") from None
  from etils import epath  # noqa: PLC0415 — only for URLs
  return epath.Path(text)


def resolved(path):
  """:func:`as_path`, made absolute for a local path (``Path.resolve``); a URL unchanged."""
  p = as_path(path)
  return p if is_url(p) else p.resolve()


def kvstore_spec(path) -> dict:
  """The tensorstore kvstore spec of ``path``: ``gcs`` for ``gs://bucket/key``, else ``file``."""
  if str(path).startswith("gs://"):
    bucket, key = gcs.split(str(path))
    return {"driver": "gcs", "bucket": bucket, "path": key + "/" if key else ""}
  return {"driver": "file", "path": str(path)}


def write_text_atomic(path, text: str) -> None:
  """Writes ``text`` to ``path`` so that readers see the old or the new content, never a part.

  Locally through a unique temporary sibling renamed into place; on an object
  store by one object write (atomic there).
  """
  p = as_path(path)
  if is_url(p):
    p.write_text(text)
    return
  tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
  try:
    tmp.write_text(text)
    os.replace(tmp, p)
  except BaseException:  # e.g. a full disk: no half-written temporary file is left
    tmp.unlink(missing_ok=True)
    raise


def move(src, dest) -> None:
  """Moves file or directory ``src`` to ``dest`` (same store): ``os.replace`` locally; on an
  object store a copy of every object then their deletion (not atomic)."""
  if not is_url(src):
    os.replace(src, dest)
    return
  import fsspec  # noqa: PLC0415 — only for URLs
  fs, _ = fsspec.core.url_to_fs(str(src))
  fs.mv(str(src), str(dest), recursive=True)


def local_copy(path) -> str:
  """A local file holding ``path``'s bytes: ``path`` itself when local; for a URL a copy in a
  temporary directory (removed at exit). For readers that take only local files.

  Raises:
    FileNotFoundError: the object does not exist.
  """
  if not is_url(path):
    return os.fspath(path)
  p = as_path(path)
  d = tempfile.mkdtemp(prefix="chinchax-in-")
  atexit.register(shutil.rmtree, d, True)
  local = os.path.join(d, p.name)
  with open(local, "wb") as f:
    f.write(p.read_bytes())
  return local


@contextlib.contextmanager
def staged_dir(out):
  """Yields a local directory whose files end up in directory ``out``.

  Locally that is ``out`` itself (created). For a URL, a temporary directory
  whose files are uploaded under ``out`` when the block ends without an
  exception (each file one object write), then removed; on an exception
  nothing is uploaded.
  """
  if not is_url(out):
    os.makedirs(os.path.expanduser(os.fspath(out)), exist_ok=True)
    yield os.path.expanduser(os.fspath(out))
    return
  d = tempfile.mkdtemp(prefix="chinchax-out-")
  try:
    yield d
    upload_dir(d, out)
  finally:
    shutil.rmtree(d, ignore_errors=True)


def upload_dir(local, url) -> list[str]:
  """Copies every file under local directory ``local`` to ``url/<relative path>``; the URLs."""
  import fsspec  # noqa: PLC0415 — only for URLs
  fs, _ = fsspec.core.url_to_fs(str(url))
  done = []
  for root, _, names in os.walk(local):
    for name in sorted(names):
      src = os.path.join(root, name)
      dest = f"{str(url).rstrip('/')}/{os.path.relpath(src, local).replace(os.sep, '/')}"
      fs.put_file(src, dest)
      done.append(dest)
  return done


def _check_url_dir(path, what: str):
  """check_writable_dir for a URL: a probe object is created and deleted under the prefix."""
  p = as_path(path)
  probe = p / f".chinchax-write-probe-{uuid.uuid4().hex[:12]}"

  def attempt():
    probe.write_text("")
    probe.unlink()
  try:
    gcs.bounded(attempt)
  except gcs.Unreachable as e:
    raise PathError(f"{what} {path}: the storage service at {gcs.endpoint()} gave {e}; check the "
                    f"network and STORAGE_EMULATOR_HOST") from None
  except FileNotFoundError:
    bucket = str(p).split("://", 1)[1].split("/", 1)[0]
    raise PathError(f"{what} {path}: bucket {bucket} does not exist (or is not visible to these "
                    f"credentials); create it or choose another {what}") from None
  except PermissionError as e:
    raise PathError(f"{what} {path} is not writable ({_one_line(e)}); choose a writable "
                    f"{what} or grant storage.objects.create") from None
  except Exception as e:  # noqa: BLE001 — any client error: one line, no traceback
    raise PathError(f"{what} {path} cannot be written ({_one_line(e)}); choose a writable "
                    f"{what}") from None
  return p


def check_reachable(path, what: str) -> None:
  """For a URL: raises PathError when its storage service gives no answer to one ``exists``
  within ``gcs.CHECK_TIMEOUT_S`` (gcsfs alone retries a refused connection for over a minute);
  nothing for a local path."""
  if not is_url(path):
    return
  try:
    gcs.bounded(lambda: as_path(path).exists())
  except gcs.Unreachable as e:
    raise PathError(f"{what} {path}: the storage service at {gcs.endpoint()} gave {e}; check "
                    f"the network and STORAGE_EMULATOR_HOST, then rerun") from None
  except errors.UserError:
    raise
  except Exception as e:  # noqa: BLE001 — any client error: one line, no traceback
    raise PathError(f"{what} {path} cannot be read ({_one_line(e)})") from None


@contextlib.contextmanager
def storage_failures(what: str, *places):
  """Turns an error of the storage service (a refused connection, a client's retries given up)
  inside the block into one PathError line naming ``what`` was being done, when one of
  ``places`` is a URL; user errors and local paths pass through unchanged."""
  if not any(is_url(p) for p in places):
    yield
    return
  try:
    yield
  except errors.UserError:
    raise
  except Exception as e:  # noqa: BLE001 — gcsfs, aiohttp, google-api-core: one line
    raise PathError(f"{what}: the storage service at {gcs.endpoint()} failed "
                    f"({_one_line(e)}); rerun once it answers") from None


def _one_line(e: BaseException) -> str:
  text = " ".join(str(e).split())
  return f"{type(e).__name__}: {text[:160]}"


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
      directory (or ancestor) does not accept new files; for a URL: no
      bucket, a denied write, or no answer within ``gcs.CHECK_TIMEOUT_S``.
  """
  if is_url(path):
    return _check_url_dir(path, what)
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


def check_readable_file(path) -> None:
  """Raises PathError when ``path`` (local or URL) cannot be opened and read."""
  if is_url(path):
    def attempt():
      with as_path(path).open("rb") as f:
        f.read(1)
    try:
      gcs.bounded(attempt)
    except Exception as e:  # noqa: BLE001 — missing object, bucket, endpoint: one line
      raise PathError(f"corpus file {path} cannot be read ({_one_line(e)})") from None
    return
  try:
    with open(path, "rb") as f:
      f.read(1)
  except OSError as e:
    raise PathError(f"corpus file {path} cannot be read ({e.strerror or e})") from None
