"""The one output idiom of chinchax: lines through :func:`say` / :func:`warn`, bars through :func:`progress`.

* :func:`say` — a result or status line for the user, on stdout (or stderr for
  verbs whose stdout is data, e.g. ``chinchax plan --json``).
* :func:`warn` — one line ``warning: ...`` on stderr: something the user should
  know that does not stop the work.
* :func:`progress` — a tqdm progress bar (disabled when not wanted).

Errors are not printed here: they are raised as ``chinchax.errors.UserError``
and printed once by the command line. In a multi-process run only process 0
speaks: pass ``enabled=False`` (or use :func:`primary`) elsewhere.
"""

from __future__ import annotations

import os
import sys
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


def progress(*, total: float, initial: float = 0, unit: str, enabled: bool = True,
             stream: TextIO | None = None, **kw) -> tqdm:
  """A tqdm bar on ``stream`` (default stdout); ``enabled=False`` gives a silent one."""
  return tqdm(total=total, initial=initial, unit=unit, dynamic_ncols=True,
              file=stream or sys.stdout, disable=not enabled, **kw)
