"""The one output idiom of chinchax: lines through :func:`say` / :func:`warn`, bars through :func:`progress`.

* :func:`say` — a result or status line for the user, on stdout (or stderr for
  verbs whose stdout is data, e.g. ``chinchax plan --json``).
* :func:`warn` — one line ``warning: ...`` on stderr: something the user should
  know that does not stop the work.
* :func:`progress` — a tqdm progress bar on a terminal, periodic lines elsewhere
  (disabled when not wanted).

Errors are not printed here: they are raised as ``chinchax.errors.UserError``
and printed once by the command line. In a multi-process run only process 0
speaks: pass ``enabled=False`` (or use :func:`primary`) elsewhere.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

from tqdm.auto import tqdm


def say(msg: str, *, stream: TextIO | None = None, enabled: bool = True) -> None:
  """Prints one message (flushed) on ``stream`` (default stdout) when ``enabled``.

  When the reader of a pipe has gone (``chinchax train ... | head``), later
  messages are discarded and the work goes on.
  """
  if enabled:
    stream = stream or sys.stdout
    try:
      print(msg, file=stream, flush=True)
    except BrokenPipeError:
      discard(stream)


def discard(stream: TextIO) -> None:
  """Points ``stream``'s file descriptor at /dev/null (its reader has gone)."""
  os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


def warn(msg: str, *, enabled: bool = True) -> None:
  """Prints ``warning: msg`` on stderr when ``enabled``."""
  if enabled:
    print(f"warning: {msg}", file=sys.stderr, flush=True)


def primary() -> bool:
  """True on process 0 of a (possibly multi-process) JAX run; starts JAX's backend."""
  import jax  # deferred: the planner and the fit never start a JAX backend
  return jax.process_index() == 0


LINE_PERIOD_S = 30.0  # a progress line at most this often when the stream is not a terminal
LINE_MIN_S = 2.0  # work done sooner than this, with no line printed yet, prints none at the end


class LineProgress:
  """Progress as whole lines, for a stream that is not a terminal (a log file, a pipe): one line
  at most every ``period_s`` seconds of wall time and one at :meth:`close` (unless the work took
  under ``LINE_MIN_S`` and printed nothing: a store of a few KB says nothing), instead of tqdm's
  ``\\r`` redraws (which a file keeps as one line of many KB). The subset of tqdm's interface
  that chinchax uses: ``update``, ``set_postfix``, ``set_description``, ``write``, ``close``.

  A line reads ``tokenize: 1.20M/4.00MB (30%), 0:12 elapsed, ETA 0:28, loss=3.210``.
  """

  def __init__(self, *, total: float, initial: float = 0, unit: str, stream: TextIO,
               desc: str = "", unit_scale: bool = False, period_s: float | None = None, **_):
    self.total, self.n, self.unit, self.stream = total, initial, unit, stream
    self.desc, self.unit_scale = desc, unit_scale
    self.period_s = LINE_PERIOD_S if period_s is None else period_s
    self.postfix, self._initial, self._closed = "", initial, False
    self._start = self._last = time.monotonic()
    self._n_last = initial

  def _count(self, x: float) -> str:
    return tqdm.format_sizeof(x) if self.unit_scale else f"{x:,.0f}"

  def line(self) -> str:
    """The current state in one line (no newline)."""
    elapsed = time.monotonic() - self._start
    done = self.n - self._initial
    parts = [f"{self._count(self.n)}/{self._count(self.total)} {self.unit}"
             + (f" ({100 * self.n / self.total:.0f}%)" if self.total else ""),
             f"{tqdm.format_interval(elapsed)} elapsed"]
    if self.total and 0 < done and self.n < self.total:
      parts.append(f"ETA {tqdm.format_interval(elapsed / done * (self.total - self.n))}")
    text = ", ".join(parts) + (f", {self.postfix}" if self.postfix else "")
    return f"{self.desc}: {text}" if self.desc else text

  def _emit(self) -> None:
    self._last, self._n_last = time.monotonic(), self.n
    say(self.line(), stream=self.stream)

  def update(self, n: float = 1) -> None:
    self.n += n
    if time.monotonic() - self._last >= self.period_s:
      self._emit()

  def set_postfix(self, refresh: bool = True, **kw) -> None:
    self.postfix = ", ".join(f"{k}={v}" for k, v in kw.items())

  def set_description(self, desc: str = "", refresh: bool = True) -> None:
    self.desc = desc

  def write(self, s: str) -> None:
    say(s, stream=self.stream)

  def close(self) -> None:
    if not self._closed:
      self._closed = True
      printed = self._last != self._start
      if (self.n != self._n_last and printed) or (
          not printed and time.monotonic() - self._start >= LINE_MIN_S):
        self._emit()


def _is_terminal(stream: TextIO) -> bool:
  try:
    return stream.isatty()
  except (AttributeError, ValueError):  # no isatty, or a closed stream
    return False


def progress(*, total: float, initial: float = 0, unit: str, enabled: bool = True,
             stream: TextIO | None = None, **kw) -> tqdm | LineProgress:
  """A tqdm bar on ``stream`` (default stdout) when it is a terminal, else a
  :class:`LineProgress` of periodic whole lines; ``enabled=False`` gives a silent tqdm."""
  stream = stream or sys.stdout
  if enabled and not _is_terminal(stream):
    return LineProgress(total=total, initial=initial, unit=unit, stream=stream, **kw)
  return tqdm(total=total, initial=initial, unit=unit, dynamic_ncols=True,
              file=stream, disable=not enabled, **kw)
