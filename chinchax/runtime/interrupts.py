"""Ctrl-C (SIGINT) as a request to stop at the next step boundary, after a checkpoint.

A ``KeyboardInterrupt`` raised while XLA compiles on its thread pool, while
orbax writes a checkpoint on its event loop, or inside a garbage-collection
callback (where Python swallows it and the run trains on) ends a run badly:
a segmentation fault in the compiler, pages of "Event loop is closed"
tracebacks, or no stop at all. So :func:`install` replaces Python's SIGINT
handler:

* inside :func:`deferred` (``train()`` from restoring the state to its last
  step) Ctrl-C sets the same stop request as SIGTERM: the loop stops at the
  next step boundary, saves a checkpoint, waits for it and raises
  :class:`Interrupted`; ``chinchax`` prints one line and exits with 130. A
  second Ctrl-C there stops at once (no new checkpoint; exit 130).
* elsewhere (start-up, the token store build, the fit) Ctrl-C raises
  ``KeyboardInterrupt`` as usual, and ``chinchax`` prints one line and leaves
  with ``os._exit(130)`` (no interpreter teardown under running XLA or orbax
  threads). Inside a garbage-collection callback it only records the request,
  which the run honours when it enters :func:`deferred` or at its next step.

In a multi-process run the request is passed to JAX's preemption service as
SIGTERM, so every process stops at the same step.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading

from chinchax.runtime import distributed as distributed_lib
from chinchax.runtime import watchdog

INTERRUPTED_EXIT_CODE = watchdog.INTERRUPTED_EXIT_CODE  # 128 + SIGINT, as a shell reports it
_requested = threading.Event()
_depth = 0  # nesting of :func:`deferred` regions
_GC_CALLBACKS = ("_xla_gc_callback",)  # where a raised KeyboardInterrupt is swallowed


class Interrupted(distributed_lib.Preempted):
  """Ctrl-C stopped the run at a step boundary after its checkpoint (or before it trained).

  Attributes:
    step: the step of the checkpoint just written, or None when nothing was trained.
    workdir: the run's directory, or None.
  """

  def __init__(self, step: int | None = None, workdir: str | None = None):
    Exception.__init__(self, message(step, workdir))
    self.step, self.workdir = step, workdir


def message(step: int | None = None, workdir: str | None = None) -> str:
  """The one line printed for a Ctrl-C'd command."""
  where = (f"; checkpoint saved at step {step} in {workdir}" if step is not None
           else "")
  return f"interrupted{where}; rerun the same command to resume from the last checkpoint"


def requested() -> bool:
  """True once Ctrl-C was pressed in this process (since :func:`install`)."""
  return _requested.is_set()


def _in_gc_callback(frame) -> bool:
  while frame is not None:
    if frame.f_code.co_name in _GC_CALLBACKS:
      return True
    frame = frame.f_back
  return False


def _on_sigint(signum, frame):
  if watchdog.ends_at_once():  # a command with nothing to save yet: one line, now
    watchdog.end(INTERRUPTED_EXIT_CODE, f"\n{message()}")
  first = not _requested.is_set()
  _requested.set()
  distributed_lib._sigterm_received.set()  # noqa: SLF001 — the one stop flag the loop reads
  if _depth > 0:
    if first:
      _forward_to_preemption_service()
      return
    watchdog.end(INTERRUPTED_EXIT_CODE,
                 f"\n{message()} (stopped at once, without a new checkpoint)")
    os._exit(INTERRUPTED_EXIT_CODE)  # re-entered while already ending
  if first and _in_gc_callback(frame):
    return  # raising here would be swallowed; the request is honoured at the next check
  raise KeyboardInterrupt


def _forward_to_preemption_service() -> None:
  """Under ``jax.distributed`` the processes agree on a stop step through JAX's preemption
  service, which listens for SIGTERM."""
  import jax  # noqa: PLC0415 — started by now: we are inside a run
  if jax.distributed.is_initialized() and jax.config.jax_enable_preemption_service:
    os.kill(os.getpid(), signal.SIGTERM)


def install() -> bool:
  """Installs the SIGINT handler (main thread only); True when installed."""
  if threading.current_thread() is not threading.main_thread():
    return False
  _requested.clear()
  signal.signal(signal.SIGINT, _on_sigint)
  return True


def _closed_loop_callback(exc_type, exc, tb) -> bool:
  """True for the RuntimeError("Event loop is closed") raised by ``call_soon_threadsafe``: a
  tensorstore write of an async checkpoint save that failed (a full disk, a stop) completing
  after orbax closed the save's event loop. Nothing is lost with it: the save already failed
  and says so in its own line."""
  if exc_type is not RuntimeError or str(exc) != "Event loop is closed":
    return False
  frames = []
  t = tb if tb is not None else exc.__traceback__
  while t is not None:
    frames.append(t.tb_frame.f_code.co_name)
    t = t.tb_next
  return "call_soon_threadsafe" in frames


def quiet_closed_loop_callbacks() -> None:
  """Drops the late ``Event loop is closed`` callbacks of a failed async checkpoint save
  (:func:`_closed_loop_callback`) from ``sys.excepthook``, ``threading.excepthook`` and
  ``sys.unraisablehook``; every other exception is reported as before."""
  hook, thread_hook, unraisable = sys.excepthook, threading.excepthook, sys.unraisablehook

  def excepthook(exc_type, exc, tb):
    if not _closed_loop_callback(exc_type, exc, tb):
      hook(exc_type, exc, tb)

  def threading_hook(args):
    if not _closed_loop_callback(args.exc_type, args.exc_value, args.exc_traceback):
      thread_hook(args)

  def unraisable_hook(args):
    if not _closed_loop_callback(args.exc_type, args.exc_value, args.exc_traceback):
      unraisable(args)

  sys.excepthook, threading.excepthook, sys.unraisablehook = (excepthook, threading_hook,
                                                              unraisable_hook)


@contextlib.contextmanager
def deferred():
  """A region where Ctrl-C requests a stop at the next step boundary instead of raising.

  Raises:
    Interrupted: on entry, when Ctrl-C was pressed before (and not acted on).
  """
  global _depth
  if _requested.is_set():
    raise Interrupted()
  _depth += 1
  try:
    yield
  finally:
    _depth -= 1


def deferring(fn):
  """Decorator: runs ``fn`` inside :func:`deferred`."""
  @functools.wraps(fn)
  def wrapper(*args, **kw):
    with deferred():
      return fn(*args, **kw)
  return wrapper


def stop_error(step: int | None, workdir: str | None) -> distributed_lib.Preempted:
  """The exception a run stopped at ``step`` (checkpoint in ``workdir``) raises: Interrupted
  after a Ctrl-C, Preempted after a SIGTERM."""
  if _requested.is_set():
    return Interrupted(step, workdir)
  return distributed_lib.Preempted(step, workdir)


def exit_now(status: int) -> None:
  """Flushes stdout and stderr and ends the process with ``status`` without interpreter
  teardown (XLA's compile threads and orbax's event loop may still be running)."""
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  os._exit(status)
