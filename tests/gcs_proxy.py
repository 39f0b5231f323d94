"""A counting HTTP proxy to put between the storage clients and fake-gcs-server (tests/gcs_server.py).

    proxy = CountingProxy(server.url)          # listens on a free loopback port
    gcs_server.point_clients_at(proxy.url)     # every client now talks to the proxy
    before = proxy.snapshot()
    ...                                        # the reads to measure
    got = proxy.since(before)                  # Counts: requests, body bytes, by kind

It forwards every request as is (method, path, headers, body) over a kept-alive
connection per thread and counts, per request, the bytes of the response body
(after any chunked transfer encoding is undone: the payload, not the framing)
and of the response headers. Standard library only (``http.server`` and
``http.client``), one thread per client connection, so the clients' concurrency
reaches the server unchanged.
"""

from __future__ import annotations

import dataclasses
import http.client
import http.server
import sys
import threading
import urllib.parse

# Hop-by-hop headers (RFC 9110 §7.6.1) are not forwarded; the body is re-sent with Content-Length.
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
        "upgrade", "content-length"}


@dataclasses.dataclass
class Counts:
  """Totals over some requests: ``requests``, response ``body_bytes`` and ``header_bytes``,
  and ``by_kind``: {"GET object" | "GET object range" | "GET metadata" | "<METHOD> other":
  [requests, body bytes]}, and ``log``: (method, percent-decoded path, body bytes) per request."""
  requests: int = 0
  body_bytes: int = 0
  header_bytes: int = 0
  by_kind: dict = dataclasses.field(default_factory=dict)
  log: list = dataclasses.field(default_factory=list)

  def add(self, kind: str, body: int, header: int, entry: tuple) -> None:
    self.log.append(entry)
    self.requests += 1
    self.body_bytes += body
    self.header_bytes += header
    k = self.by_kind.setdefault(kind, [0, 0])
    k[0] += 1
    k[1] += body

  def minus(self, other: "Counts") -> "Counts":
    """These totals less ``other`` (an earlier snapshot of the same proxy: ``log`` grows only
    at its end)."""
    kinds = {k: [v[0] - other.by_kind.get(k, [0, 0])[0], v[1] - other.by_kind.get(k, [0, 0])[1]]
             for k, v in self.by_kind.items()}
    return Counts(self.requests - other.requests, self.body_bytes - other.body_bytes,
                  self.header_bytes - other.header_bytes,
                  {k: v for k, v in kinds.items() if v[0]}, self.log[len(other.log):])


def _kind(method: str, path: str, headers) -> str:
  query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
  if method == "GET" and query.get("alt") == ["media"] or method == "GET" and "/download/" in path:
    return "GET object range" if headers.get("Range") else "GET object"
  if method == "GET" and "/o/" in path:
    return "GET metadata"
  return f"{method} other"


class CountingProxy:
  """Forwards HTTP to ``upstream`` (``http://host:port``) and counts what comes back.

  Attributes:
    url: ``http://127.0.0.1:PORT`` to point the clients at.
  Raises:
    OSError: no loopback port could be bound.
  """

  def __init__(self, upstream: str):
    target = urllib.parse.urlsplit(upstream)
    host, port = target.hostname, target.port or 80
    self._counts = Counts()
    self._lock = threading.Lock()
    proxy = self

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = "HTTP/1.1"  # keep-alive, as a real endpoint

      def log_message(self, *args):  # quiet
        pass

      def _forward(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        conn = getattr(self.server.local, "conn", None)
        for attempt in range(2):  # the kept-alive upstream connection may have been closed
          if conn is None:
            conn = http.client.HTTPConnection(host, port, timeout=60)
            self.server.local.conn = conn
          try:
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            break
          except (http.client.HTTPException, OSError):
            conn.close()
            conn = self.server.local.conn = None
            if attempt:
              raise
        sent = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP]
        header_bytes = sum(len(k) + len(v) + 4 for k, v in sent) + 20
        with proxy._lock:  # counted as sent, even if the client hangs up before reading it all
          proxy._counts.add(_kind(self.command, self.path, self.headers), len(data),
                            header_bytes,
                            (self.command, urllib.parse.unquote(self.path), len(data)))
        self.send_response(resp.status, resp.reason)
        for k, v in sent:
          self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
          self.wfile.write(data)

      do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _forward

    class Server(http.server.ThreadingHTTPServer):
      def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that hung up: quiet
          super().handle_error(request, client_address)

    self._server = Server(("127.0.0.1", 0), Handler)
    self._server.daemon_threads = True
    self._server.local = threading.local()
    self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
    self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
    self._thread.start()

  def snapshot(self) -> Counts:
    """A copy of the totals so far."""
    with self._lock:
      c = self._counts
      return Counts(c.requests, c.body_bytes, c.header_bytes,
                    {k: list(v) for k, v in c.by_kind.items()}, list(c.log))

  def since(self, before: Counts) -> Counts:
    """The totals of the requests answered since ``before`` (a :meth:`snapshot`)."""
    return self.snapshot().minus(before)

  def close(self) -> None:
    """Stops listening."""
    self._server.shutdown()
    self._server.server_close()
