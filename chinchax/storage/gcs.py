"""Google Cloud Storage specifics behind :mod:`chinchax.storage.paths`: conditional writes, bounded
probes, and quiet client libraries.

Three client stacks reach a bucket, each the one its library uses:

* ``etils.epath`` over ``gcsfs`` (fsspec) — plain object reads and writes of
  the path layer and orbax's metadata;
* tensorstore's ``gcs`` kvstore — checkpoint arrays and the token store's zarr arrays;
* ``google-cloud-storage`` — here, for what the other two do not offer: a create
  that succeeds only when the object does not exist (``ifGenerationMatch=0``)
  and a rewrite that succeeds only while the object is at a known generation
  (``ifGenerationMatch=<g>``), the ladder's lease primitives; and tensorboardX's
  event files.

All three honour an emulator: ``STORAGE_EMULATOR_HOST`` (gcsfs,
google-cloud-storage) and ``TENSORSTORE_GCS_HTTP_URL`` (tensorstore).
:func:`configure` (run when :mod:`chinchax.storage.paths` is imported) sets either from
the other, and against an emulator turns off what only the real service has
(the storage-layout lookup, credential discovery), so runs against it print no
credential warnings. Real buckets use Application Default Credentials (on a
Cloud TPU VM: the VM's service account).
"""

from __future__ import annotations

import functools
import logging
import os
import threading

# Seconds a bucket check (exists / writable / readable) may take before it is reported as
# unreachable: gcsfs retries a refused connection with backoff for ~30 s.
# (CHINCHAX_STORAGE_CHECK_TIMEOUT_S overrides it.)
CHECK_TIMEOUT_S = float(os.environ.get("CHINCHAX_STORAGE_CHECK_TIMEOUT_S", "15"))

_QUIET_LOGGERS = ("gcsfs", "google.auth", "google.auth.compute_engine._metadata",
                  "google.cloud.storage", "google_auth_httplib2", "urllib3.connectionpool",
                  "fsspec")


def configure() -> None:
  """Sets the emulator variables from each other and silences the clients' credential warnings.

  With ``STORAGE_EMULATOR_HOST`` or ``TENSORSTORE_GCS_HTTP_URL`` set: the other
  is set to the same URL; gcsfs's storage-layout lookup (absent from
  emulators) is turned off; tensorstore gets a fixed token instead of looking
  for credentials (unless ``GOOGLE_APPLICATION_CREDENTIALS`` names some). The
  loggers of gcsfs and google-auth show errors only. Variables already set
  are kept. gcsfs keeps no directory listings cache (fsspec's config), so a
  listing or ``exists`` sees objects other hosts wrote a moment ago.
  """
  env = os.environ
  host = env.get("STORAGE_EMULATOR_HOST") or env.get("TENSORSTORE_GCS_HTTP_URL")
  if host:
    if "://" not in host:
      host = "http://" + host
    env.setdefault("STORAGE_EMULATOR_HOST", host)
    env.setdefault("TENSORSTORE_GCS_HTTP_URL", host)
    env.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    if not env.get("GOOGLE_APPLICATION_CREDENTIALS"):
      env.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")
  for name in _QUIET_LOGGERS:
    logging.getLogger(name).setLevel(logging.ERROR)
  # gcsfs logs a traceback when it gives up on a request, then raises it: the caller's one line
  # (unreachable) says it
  logging.getLogger("gcsfs").setLevel(logging.CRITICAL)
  try:  # no cached directory listings: leases, rows and checkpoints are written by other hosts
    import fsspec.config  # noqa: PLC0415
  except ImportError:
    return
  for proto in ("gs", "gcs"):
    fsspec.config.conf.setdefault(proto, {}).setdefault("use_listings_cache", False)


def split(url: str) -> tuple[str, str]:
  """``gs://bucket/a/b`` → ``("bucket", "a/b")``; the key has no leading or trailing slash."""
  rest = str(url).split("://", 1)[1]
  bucket, _, key = rest.partition("/")
  return bucket, key.strip("/")


class Unreachable(OSError):
  """The storage service did not answer within the time allowed."""


def bounded(fn, timeout_s: float | None = None):
  """``fn()``'s result, or :class:`Unreachable` after ``timeout_s`` seconds.

  ``fn`` runs on a daemon thread, so a client stuck retrying a refused
  connection is left behind rather than waited for; its exceptions are raised here.
  """
  timeout_s = CHECK_TIMEOUT_S if timeout_s is None else timeout_s
  out: dict = {}

  def run():
    try:
      out["value"] = fn()
    except BaseException as e:  # noqa: BLE001 — handed to the caller
      out["error"] = e

  t = threading.Thread(target=run, daemon=True, name="chinchax-storage-check")
  t.start()
  t.join(timeout_s)
  if t.is_alive():
    raise Unreachable(f"no answer within {timeout_s:g} s")
  if "error" in out:
    raise out["error"]
  return out.get("value")


# Exceptions of the client stacks that mean "the service did not answer", by module prefix and
# class-name word (Python's own ConnectionError there is raised inside one of them).
_UNREACHABLE_MODULES = ("aiohttp", "google.api_core", "google.auth", "requests", "urllib3")
_UNREACHABLE_WORDS = ("Connect", "Timeout", "RetryError", "ServiceUnavailable", "ServerDisconnected")
_UNREACHABLE_TEXT = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "Connection refused", "Couldn't connect")


def unreachable(exc: BaseException) -> str | None:
  """When ``exc`` (or an exception it was raised from) says the storage service did not answer
  (a refused connection, a timeout, retries exhausted): its one-line reason; else None."""
  seen = set()
  while exc is not None and id(exc) not in seen:
    seen.add(id(exc))
    name, module = type(exc).__name__, type(exc).__module__ or ""
    text = str(exc).splitlines()[0] if str(exc) else name
    if isinstance(exc, Unreachable):
      return f"{name}: {text}"[:300]
    if module.startswith(_UNREACHABLE_MODULES) and any(w in name for w in _UNREACHABLE_WORDS):
      return f"{name}: {text}"[:300]
    if any(t in str(exc) for t in _UNREACHABLE_TEXT):
      return f"{name}: {text}"[:300]
    exc = exc.__cause__ or exc.__context__
  return None


def endpoint() -> str:
  """Where requests go: the emulator's URL, or the Cloud Storage API."""
  return os.environ.get("STORAGE_EMULATOR_HOST") or "https://storage.googleapis.com"


@functools.lru_cache(maxsize=1)
def _client():
  from google.cloud import storage  # noqa: PLC0415 — only for gs:// paths
  if os.environ.get("STORAGE_EMULATOR_HOST"):
    from google.auth.credentials import AnonymousCredentials  # noqa: PLC0415
    return storage.Client(project="chinchax", credentials=AnonymousCredentials())
  return storage.Client()


def _blob(url: str):
  bucket, key = split(url)
  return _client().bucket(bucket).blob(key)


def _exceptions():
  from google.api_core import exceptions  # noqa: PLC0415
  return exceptions


def create(url: str, data: bytes) -> int | None:
  """Creates object ``url`` holding ``data`` only if no object has that name (``ifGenerationMatch=0``).

  A create retried after a lost reply meets its own object: an existing object
  holding exactly ``data`` (which names its writer uniquely) counts as made here.

  Returns:
    the new object's generation, or None when the name was taken.
  Raises:
    OSError (FileNotFoundError for a missing bucket) on any other failure.
  """
  ex = _exceptions()
  blob = _blob(url)
  try:
    blob.upload_from_string(data, if_generation_match=0)
    return int(blob.generation)
  except ex.PreconditionFailed:
    got = read(url)
    return got[1] if got is not None and got[0] == data else None
  except ex.NotFound as e:
    raise FileNotFoundError(f"bucket of {url} not found ({e.code})") from None
  except ex.GoogleAPICallError as e:
    raise OSError(f"{url}: {e.code} {e.message}") from None


def rewrite(url: str, data: bytes, generation: int) -> int | None:
  """Replaces object ``url`` with ``data`` only while it is at ``generation``.

  Returns:
    the new generation, or None when the object changed or vanished meanwhile.
  """
  ex = _exceptions()
  blob = _blob(url)
  try:
    blob.upload_from_string(data, if_generation_match=int(generation))
    return int(blob.generation)
  except (ex.PreconditionFailed, ex.NotFound):
    got = read(url)  # a retried rewrite may meet its own result
    return got[1] if got is not None and got[0] == data else None
  except ex.GoogleAPICallError as e:
    raise OSError(f"{url}: {e.code} {e.message}") from None


def read(url: str) -> tuple[bytes, int] | None:
  """(content, generation) of object ``url``, or None when it does not exist."""
  ex = _exceptions()
  blob = _blob(url)
  try:
    data = blob.download_as_bytes()
  except ex.NotFound:
    return None
  return data, int(blob.generation)
