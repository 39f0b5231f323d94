"""Every way a ``chinchax`` command ends is one line, whatever its main thread is doing.

Python runs a signal handler only when the main thread is back in bytecode. A
``chinchax`` command's main thread spends seconds inside C: importing JAX and
its extensions, compiling, waiting on an XLA collective or on a storage
server; a handler that raises there aborts the extension's initialisation (an
ImportError traceback, a SIGABRT from nanobind), one that only records the
request is honoured seconds later or never. So the command installs, as its
first import (:func:`install`, from ``chinchax.cli.start``, before JAX):

* SIGINT and SIGTERM handlers, and a wake-up file descriptor
  (``signal.set_wakeup_fd``) that the interpreter's C-level handler writes the
  signal's number to from whatever thread the signal lands on;
* a daemon thread that reads it. While there is nothing to save (the default:
  start-up, imports, the store scan, the compile, a restore) it ends the
  process at once: one line, exit status 130 for SIGINT, 75 for SIGTERM
  (``os._exit``: no teardown under XLA's or orbax's threads). Inside
  :func:`keeping` (a run with steps not yet checkpointed) the run's own
  handlers stop it at the next step boundary after a checkpoint; if the main
  thread does not reach a boundary (:func:`beat`) within :data:`SIGNAL_GRACE_S`
  the thread ends the process with the line, naming the last checkpoint.
  Inside :func:`raising` (a token store build) the handlers raise
  ``KeyboardInterrupt`` so the build removes its partial files; inside
  :func:`deferring` (a ladder, which stops its workers and releases its
  leases itself) the run's own handlers decide, as in a library;
* a stall watch (:func:`watch`): when no :func:`beat` came for the given
  number of seconds (a step stalled in an XLA collective on a loaded host, a
  storage server that froze) the thread ends the process with one line that
  says what stalled and what to do, exit status :data:`UNAVAILABLE_EXIT_CODE`.

A process that did not call :func:`install` (chinchax used as a library,
the tests) keeps Python's behaviour: nothing here acts. Imports only the
standard library.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
import threading
import time

INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, as a shell reports a Ctrl-C'd command
PREEMPTED_EXIT_CODE = 75     # sysexits EX_TEMPFAIL: stopped on request, relaunch to resume
UNAVAILABLE_EXIT_CODE = 69   # sysexits EX_UNAVAILABLE: a step stalled, or its storage stopped answering
# After a stop request, how long the main thread may take to reach a step boundary and start
# its checkpoint (a preemption notice is 30 s on Cloud TPU and Compute Engine).
SIGNAL_GRACE_S = 20.0
_POLL_S = 0.25

_guard = threading.Lock()
_state = {"installed": False, "mode": "exit", "ender": None, "signal": None, "signal_at": None,
          "beat": time.monotonic(), "doing": "", "stall_s": 0.0, "stall_hint": "",
          "saved": ""}


def installed() -> bool:
  """True in a ``chinchax`` command after :func:`install`."""
  return _state["installed"]


def stop_line(signum: int, saved: str = "") -> str:
  """The one line of a command stopped by ``signum`` (SIGINT or SIGTERM) before a step boundary
  (``saved``: where its last checkpoint is, or "")."""
  what = "interrupted" if signum == signal.SIGINT else "preempted"
  verb = "rerun" if signum == signal.SIGINT else "relaunch"
  kept = f"; {saved}" if saved else ""
  return f"{what}{kept}; {verb} the same command to resume"


def exit_code(signum: int) -> int:
  """130 for SIGINT, 75 for SIGTERM."""
  return INTERRUPTED_EXIT_CODE if signum == signal.SIGINT else PREEMPTED_EXIT_CODE


def end(code: int, line: str) -> None:
  """Prints ``line`` on stderr and ends the process with ``code`` at once (``os._exit``).
  Only the first caller prints: a later one from another thread waits for the end; one
  re-entered from a signal handler in the ending thread returns."""
  me = threading.get_ident()
  with _guard:
    first = _state["ender"] is None
    if first:
      _state["ender"] = me
  if not first:
    if _state["ender"] == me:
      return
    while True:
      time.sleep(3600)
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError, RuntimeError):  # RuntimeError: re-entered mid-write
      pass
  try:
    os.write(2, (line.rstrip("\n") + "\n").encode())
  except OSError:
    pass
  os._exit(code)


def last_signal() -> int | None:
  """The first SIGINT or SIGTERM this command received, or None."""
  return _state["signal"]


def ends_at_once() -> bool:
  """True when a signal must end the command now: installed, and neither inside
  :func:`keeping` nor :func:`raising`."""
  return _state["installed"] and _state["mode"] == "exit"


def raising_now() -> bool:
  """True inside :func:`raising` of an installed command."""
  return _state["installed"] and _state["mode"] == "raise"


def _record(signum: int) -> None:
  if signum in (signal.SIGINT, signal.SIGTERM) and _state["signal"] is None:
    _state["signal"], _state["signal_at"] = signum, time.monotonic()


def _on_signal(signum, frame):
  """The command's handler until a verb installs its own: end at once, or raise inside
  :func:`raising`."""
  _record(signum)
  if _state["mode"] == "keep":  # the run's own handler was not installed: the grace decides
    return
  if _state["mode"] == "raise" or _state["mode"] == "defer" and signum == signal.SIGINT:
    raise KeyboardInterrupt
  end(exit_code(signum), ("\n" if signum == signal.SIGINT else "") + stop_line(signum))


def _watch(rfd: int) -> None:
  while True:
    try:
      ready, _, _ = select.select([rfd], [], [], _POLL_S)
      data = os.read(rfd, 64) if ready else b""
    except (BlockingIOError, InterruptedError):
      data = b""
    for signum in data:
      if signum not in (signal.SIGINT, signal.SIGTERM):
        continue
      first = _state["signal"] is None
      _record(signum)
      if _state["mode"] == "exit":
        end(exit_code(signum), ("\n" if signum == signal.SIGINT else "") + stop_line(signum))
      elif not first and _state["mode"] == "keep":  # a second request: stop now
        end(exit_code(signum), stop_line(signum, _state["saved"]) + " (stopped at once, "
            "without a new checkpoint)")
    _check(time.monotonic())


def _check(now: float) -> None:
  signum, at = _state["signal"], _state["signal_at"]
  if signum is not None and _state["mode"] in ("keep", "raise"):
    if now - max(at, _state["beat"]) > SIGNAL_GRACE_S:
      doing = f" ({_state['doing']})" if _state["doing"] else ""
      end(exit_code(signum), stop_line(signum, _state["saved"]) + f"; stopped without a new "
          f"checkpoint: no step boundary within {SIGNAL_GRACE_S:g} s{doing}")
  stall = _state["stall_s"]
  if stall > 0 and now - _state["beat"] > stall:
    doing = f" while {_state['doing']}" if _state["doing"] else ""
    saved = f"; {_state['saved']}" if _state["saved"] else ""
    hint = _state["stall_hint"]
    end(UNAVAILABLE_EXIT_CODE, f"error: no progress for {stall:g} s{doing}{saved}; "
        f"{hint(_state['doing']) if callable(hint) else hint}")


def _in_child() -> None:
  """After ``os.fork``: the child neither shares the wake-up descriptor nor ends in our lines."""
  _state.update(installed=False, mode="exit", stall_s=0.0)
  with contextlib.suppress(ValueError, OSError):
    signal.set_wakeup_fd(-1)
  for s in (signal.SIGINT, signal.SIGTERM):
    with contextlib.suppress(ValueError, OSError):
      signal.signal(s, signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL)


def install() -> bool:
  """Installs the handlers, the wake-up descriptor and the watching thread (main thread only,
  once); True when installed."""
  if _state["installed"] or threading.current_thread() is not threading.main_thread():
    return False
  rsock, wsock = socket.socketpair()
  for s in (rsock, wsock):
    s.setblocking(False)
  signal.signal(signal.SIGINT, _on_signal)
  signal.signal(signal.SIGTERM, _on_signal)
  signal.set_wakeup_fd(wsock.fileno(), warn_on_full_buffer=False)
  _state["sockets"] = (rsock, wsock)  # kept open for the life of the process
  _state["installed"] = True
  os.register_at_fork(after_in_child=_in_child)
  threading.Thread(target=_watch, args=(rsock.fileno(),), name="chinchax-watchdog",
                   daemon=True).start()
  return True


def is_command(argv0: str | None = None, orig_argv: list[str] | None = None) -> bool:
  """True when this process is the ``chinchax`` command (its console script, or ``python -m
  chinchax.cli``)."""
  argv0 = sys.argv[0] if argv0 is None else argv0
  orig = list(getattr(sys, "orig_argv", []) if orig_argv is None else orig_argv)
  if os.path.basename(argv0) == "chinchax":
    return True
  return any(a == "-m" and b == "chinchax.cli" for a, b in zip(orig, orig[1:]))


def beat(doing: str = "") -> None:
  """The run made progress (a step, a save); ``doing``: what it does next, for the lines."""
  _state["beat"] = time.monotonic()
  _state["doing"] = doing


def doing() -> str:
  """What the run was doing at its last :func:`beat` ("" before any)."""
  return _state["doing"]


def last_saved() -> str:
  """Where the last checkpoint is, as :func:`saved` last recorded it ("" before any)."""
  return _state["saved"]


def saved(where: str) -> None:
  """Records where the last checkpoint is (``"the checkpoint of step 40 in DIR"``)."""
  _state["saved"] = where


@contextlib.contextmanager
def keeping():
  """A region holding state a signal must save first: SIGINT/SIGTERM request a stop at the next
  step boundary (the run's own handlers), bounded by :data:`SIGNAL_GRACE_S`."""
  previous = _state["mode"]
  _state["mode"] = "keep"
  beat(_state["doing"])
  try:
    yield
  finally:
    _state["mode"] = previous


@contextlib.contextmanager
def deferring():
  """A region whose own signal handlers decide (a ladder stopping its workers and releasing its
  leases): the watching thread only records a signal there; :func:`keeping` inside it still
  bounds a run's stop."""
  previous = _state["mode"]
  _state["mode"] = "defer"
  try:
    yield
  finally:
    _state["mode"] = previous


@contextlib.contextmanager
def raising():
  """A region that cleans up on ``KeyboardInterrupt``: SIGINT and SIGTERM raise it there (the
  exit status still follows the signal: :func:`last_signal`)."""
  previous = _state["mode"]
  _state["mode"] = "raise" if previous == "exit" else previous
  try:
    yield
  finally:
    _state["mode"] = previous


@contextlib.contextmanager
def watch(stall_s: float, hint):
  """Ends the command with one line (exit :data:`UNAVAILABLE_EXIT_CODE`) when no :func:`beat` comes
  for ``stall_s`` seconds inside the region (0: no watch); ``hint`` says what to do (a string, or
  a function of what the run was doing, :func:`doing`)."""
  previous = _state["stall_s"], _state["stall_hint"]
  _state["stall_s"], _state["stall_hint"] = float(stall_s), hint
  beat("the first step (compiling)")
  try:
    yield
  finally:
    _state["stall_s"], _state["stall_hint"] = previous
