"""One progress line for a ladder, read from its results table.

    ladder  7/25 runs done · 2m14s elapsed · ETA 7m40s = runs 5m10s + fit ~1m + validation 1m30s

On a terminal the line is redrawn in place; otherwise (a log file, a pipe) it
is printed as a new line when a run is recorded, and at least every
``every_s`` seconds. Other lines (a failed run, a worker's warning) are
printed above it through :meth:`LadderProgress.write`.

The ETA covers what the command still has to do: the runs not recorded yet, the fit and the
validation run. A run's wall time is modelled as ``t0 + C / rate`` (:class:`RunTimeModel`),
fitted to every run already recorded in the table (this process's and earlier ones'), so the
first, compile-heavy run does not set the pace alone; ``workers`` processes share the runs
left. The fit's time is :func:`fit_seconds`; the validation run's is the model's time at its
budget. Before any run is recorded the ETA is unknown.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import TextIO

import numpy as np


def duration(seconds: float) -> str:
  """``45s``, ``3m05s``, ``2h07m`` for a non-negative number of seconds."""
  s = int(round(seconds))
  if s < 60:
    return f"{s}s"
  if s < 3600:
    return f"{s // 60}m{s % 60:02d}s"
  return f"{s // 3600}h{s % 3600 // 60:02d}m"


@dataclasses.dataclass(frozen=True)
class RunTimeModel:
  """Wall seconds of one run at budget C: ``t0 + C / rate`` (``t0`` ≥ 0: start-up, compile and
  evals; ``rate``: FLOPs per wall second), least squares over the recorded runs."""

  t0: float
  rate: float

  def seconds(self, C: float) -> float:
    """Predicted wall seconds of a run of ``C`` FLOPs."""
    return self.t0 + C / self.rate

  @classmethod
  def fit(cls, rows) -> "RunTimeModel | None":
    """The model of ``rows`` (results rows with ``C_budget`` and ``wall_time_s``; failed rows and
    rows of a resumed run, whose wall time covers only part of it, are skipped); None without
    a usable row. With one budget (or a fit whose intercept or slope comes out negative) the
    model is proportional: ``t0 = 0``."""
    pts = [(float(r["C_budget"]), float(r["wall_time_s"])) for r in rows
           if r.get("status") == "done" and not r.get("resumed")
           and r.get("C_budget") and r.get("wall_time_s")]
    if not pts:
      return None
    C, t = np.array(pts).T
    if len(set(C)) >= 2:
      slope, t0 = np.polyfit(C, t, 1)
      if slope > 0 and t0 >= 0:
        return cls(float(t0), float(1.0 / slope))
    return cls(0.0, float(C.sum() / t.sum()))


# The fit's wall time, roughly: loading, figures and report; each bootstrap resample; Approach 3's
# 4500 L-BFGS starts per run of the table (the default ladder's fit: ~1 min on 2 idle cores).
FIT_SECONDS_BASE = 10.0
FIT_SECONDS_PER_RESAMPLE = 0.25
FIT_SECONDS_PER_RUN = 0.5
# A data-constrained ladder (ladder.unique_tokens) also fits two repetition laws, each bootstrapped
# and profiled: ~10.8 min for the repeat ladder's 200 resamples on this project's 2-core host
# under load, ~3 min idle (docs/data-constrained.md).
FIT_SECONDS_REPEAT_PER_RESAMPLE = 1.0


def fit_seconds(lc, n_runs: int = 25) -> float:
  """Rough wall seconds of the ladder's fit of ``n_runs`` runs (0 without ``ladder.fit``)."""
  if not lc.fit:
    return 0.0
  per_resample = FIT_SECONDS_PER_RESAMPLE + (FIT_SECONDS_REPEAT_PER_RESAMPLE
                                             if str(getattr(lc, "unique_tokens", "") or "") else 0.0)
  return (FIT_SECONDS_BASE + per_resample * max(int(lc.bootstrap), 0)
          + FIT_SECONDS_PER_RUN * n_runs)


def remaining_seconds(plan, rows: dict, workers: int = 1) -> dict | None:
  """{"runs", "fit", "validation"}: wall seconds each part of the ladder still needs, from the
  :class:`RunTimeModel` of the recorded rows; None before any run is recorded. The runs left are
  shared by ``workers`` processes; a validation run already recorded needs none."""
  model = RunTimeModel.fit(rows.values())
  if model is None:
    return None
  lc = plan.config.ladder
  left = [r.C_budget for r in plan.runs if r.run_id not in rows]
  runs = sum(model.seconds(C) for C in left) / max(workers, 1)
  val = 0.0
  validated = any(r.get("role") == "validation" and r.get("status") == "done"
                  for r in rows.values())
  if lc.fit and lc.validate and not validated and lc.budget_kind != "seconds":
    # trained alone, on one device per worker's core: about `workers` times a grid run's pace
    val = model.seconds(lc.validate_factor * lc.c_max) / max(workers, 1)
  elif lc.fit and lc.validate and not validated:
    val = lc.validate_factor * lc.t_max
  return {"runs": runs, "fit": fit_seconds(lc, len(plan.runs)), "validation": val}


def eta_text(parts: dict | None) -> str:
  """``ETA 7m40s = runs 5m10s + fit ~1m05s + validation 1m30s`` (the parts that are not 0)."""
  if parts is None:
    return "ETA after the first run"
  shown = [f"{k} {'~' if k == 'fit' else ''}{duration(v)}" for k, v in parts.items() if v > 0]
  return f"ETA {duration(sum(parts.values()))}" + (f" = {' + '.join(shown)}"
                                                   if len(shown) > 1 else "")


class LadderProgress:
  """The progress line of a ladder plan's grid (``plan.runs``, ``plan.table``).

  Args:
    plan: the :class:`~chinchax.ladder.plan.LadderPlan`.
    stream: where to print (default stdout).
    every_s: off a terminal, the gap (seconds) between two progress lines (a failed run is
      printed at once; the others wait for the next line).
    clock: wall seconds (tests pass a fake one).
    workers: processes training the runs at once (the ETA divides the runs left among them).
    failures: print a line for each newly failed run (off when the worker prints its own).
  """

  def __init__(self, plan, stream: TextIO | None = None, every_s: float = 60.0,
               clock=time.monotonic, workers: int = 1, failures: bool = True):
    self.plan, self.stream, self.every_s, self.clock = plan, stream or sys.stdout, every_s, clock
    self.workers, self.failures = workers, failures
    self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
    self.t0 = clock()
    rows = plan.table.refresh()
    self.reported = {i: (row.get("status"), row.get("attempts", 1)) for i, row in rows.items()}
    self.printed_at = None
    self.drawn = False

  def line(self) -> str:
    """The progress line for the table as last read."""
    rows = self.plan.table.rows
    ids = [r.run_id for r in self.plan.runs]
    n_done = sum(rows.get(i, {}).get("status") == "done" for i in ids)
    n_failed = sum(i in rows for i in ids) - n_done
    elapsed = self.clock() - self.t0
    parts = [f"ladder  {n_done}/{len(ids)} runs done"
             + (f", {n_failed} failed" if n_failed else ""), f"{duration(elapsed)} elapsed",
             eta_text(remaining_seconds(self.plan, rows, self.workers))]
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
      if row.get("status") != "done" and self.failures:
        self.write(f"run {row['run_id']} failed (attempt {row.get('attempts', 1)}): "
                   f"{row.get('error', '')}")
    now = self.clock()
    due = self.printed_at is None or now - self.printed_at >= self.every_s
    if self.tty or due or force:
      self._emit(self.line(), newline=False)
      self.drawn = self.tty
      self.printed_at = now
    return new

  def close(self) -> None:
    """Ends the progress line: a newline on a terminal; elsewhere the last state, once."""
    if self.tty and self.drawn:
      self._emit(self.line(), newline=True)
      self.drawn = False
    elif not self.tty and self.printed_at is not None and self.printed_at != self.clock():
      self.plan.table.refresh()
      self._emit(self.line(), newline=True)
      self.printed_at = self.clock()
