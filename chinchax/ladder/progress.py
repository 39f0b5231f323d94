"""One progress line for a ladder run by local workers, read from its results table.

    ladder  7/25 runs done · 2m14s elapsed · ETA 5m40s · last C3.36e+11_N49200: eval loss 2.4071

On a terminal the line is redrawn in place; otherwise (a log file, a pipe) it
is printed as a new line when a run is recorded, and at least every
``every_s`` seconds. Other lines (a failed run, a worker's warning) are
printed above it through :meth:`LadderProgress.write`.

The ETA assumes the FLOPs still to train go at the rate (FLOPs per second of
wall time) of the runs recorded since this process started; before the first
one it is unknown.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def duration(seconds: float) -> str:
  """``45s``, ``3m05s``, ``2h07m`` for a non-negative number of seconds."""
  s = int(round(seconds))
  if s < 60:
    return f"{s}s"
  if s < 3600:
    return f"{s // 60}m{s % 60:02d}s"
  return f"{s // 3600}h{s % 3600 // 60:02d}m"


class LadderProgress:
  """The progress line of a ladder plan's grid (``plan.runs``, ``plan.table``).

  Args:
    plan: the :class:`~chinchax.ladder.plan.LadderPlan`.
    stream: where to print (default stdout).
    every_s: off a terminal, the longest gap (seconds) between two progress lines.
    clock: wall seconds (tests pass a fake one).
  """

  def __init__(self, plan, stream: TextIO | None = None, every_s: float = 60.0,
               clock=time.monotonic):
    self.plan, self.stream, self.every_s, self.clock = plan, stream or sys.stdout, every_s, clock
    self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
    self.t0 = clock()
    rows = plan.table.refresh()
    self.c_total = sum(r.C_budget for r in plan.runs)
    self.c_before = sum(r.C_budget for r in plan.runs if r.run_id in rows)
    self.reported = {i: (row.get("status"), row.get("attempts", 1)) for i, row in rows.items()}
    self.last = None  # the last recorded row seen
    self.printed_at = None
    self.drawn = False

  def line(self) -> str:
    """The progress line for the table as last read."""
    rows = self.plan.table.rows
    ids = [r.run_id for r in self.plan.runs]
    n_done = sum(rows.get(i, {}).get("status") == "done" for i in ids)
    n_failed = sum(i in rows for i in ids) - n_done
    elapsed = self.clock() - self.t0
    c_now = sum(r.C_budget for r in self.plan.runs if r.run_id in rows) - self.c_before
    c_left = self.c_total - self.c_before - c_now
    if c_left <= 0:
      eta = "ETA 0s"
    elif c_now > 0 and elapsed > 0:
      eta = f"ETA {duration(elapsed * c_left / c_now)}"
    else:
      eta = "ETA after the first run"
    parts = [f"ladder  {n_done}/{len(ids)} runs done"
             + (f", {n_failed} failed" if n_failed else ""), f"{duration(elapsed)} elapsed", eta]
    if self.last is not None:
      loss = self.last.get("final_eval_loss")
      parts.append(f"last {self.last['run_id']}: "
                   + (f"eval loss {loss:.4f}" if loss is not None else self.last["status"]))
    return " · ".join(parts)

  def _emit(self, text: str, newline: bool) -> None:
    try:
      if self.tty:
        self.stream.write("\r" + text + "\x1b[K" + ("\n" if newline else ""))
      else:
        self.stream.write(text + "\n")
      self.stream.flush()
    except BrokenPipeError:
      pass

  def write(self, msg: str) -> None:
    """Prints ``msg`` on its own line (above the progress line on a terminal)."""
    self._emit(msg, newline=True)
    self.drawn = False
    if self.tty and self.printed_at is not None:
      self._emit(self.line(), newline=False)
      self.drawn = True

  def update(self, force: bool = False) -> list[dict]:
    """Reads the table; reports newly failed runs, redraws or prints the progress line.

    Returns the rows recorded (or re-recorded) since the last call.
    """
    rows = self.plan.table.refresh()
    new = [row for i, row in rows.items()
           if self.reported.get(i) != (row.get("status"), row.get("attempts", 1))]
    for row in new:
      self.reported[row["run_id"]] = (row.get("status"), row.get("attempts", 1))
      self.last = row
      if row.get("status") != "done":
        self.write(f"run {row['run_id']} failed (attempt {row.get('attempts', 1)}): "
                   f"{row.get('error', '')}")
    now = self.clock()
    due = self.printed_at is None or now - self.printed_at >= self.every_s
    if self.tty or new or due or force:
      self._emit(self.line(), newline=False)
      self.drawn = self.tty
      self.printed_at = now
    return new

  def close(self) -> None:
    """Ends the progress line (a newline on a terminal)."""
    if self.tty and self.drawn:
      self._emit(self.line(), newline=True)
      self.drawn = False
