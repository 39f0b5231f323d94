"""A run's metrics: ``metrics.jsonl`` rows and TensorBoard scalars, and the eval schedule."""

from __future__ import annotations

import json
import pathlib
import time

import numpy as np

from chinchax import console
from chinchax.storage import diskfull
from chinchax.storage import paths as paths_lib
from chinchax.tracking import tblog

# On an object store (gs://) an append rewrites the whole object: metrics.jsonl is rewritten at
# most this often (seconds), and at every checkpoint (:meth:`MetricsLog.sync`) and at the end.
OBJECT_REWRITE_S = 5.0


def log_spaced_steps(steps: int, n: int, from_fraction: float = 0.0) -> set[int]:
  """Up to ``n`` distinct steps, log-spaced from ``from_fraction · steps`` (at least step 1)
  to ``steps`` (for loss-vs-FLOPs curves).

  ``from_fraction`` 0 spreads the points over the whole run; 0.1 over its last
  decade of FLOPs, where an IsoFLOP ladder's lower envelope (Approach 1 of
  Hoffmann et al. 2022) reads the curves.
  """
  if n <= 0:
    return set()
  first = max(1.0, from_fraction * steps)
  return {int(s) for s in np.unique(np.round(np.geomspace(first, steps, n)).astype(int))}


def read_lines(path, warn: bool = True) -> list[tuple[str, dict]]:
  """The rows of a metrics.jsonl as (line, row); [] when the file does not exist.

  A line that is not a JSON object (the half-written last line of a run killed
  mid-write, or a line damaged otherwise) is left out, with one warning naming
  the file and the line(s) when ``warn``.
  """
  if not path.exists():
    return []
  out, bad = [], []
  lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()  # local or gs://
  for i, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except ValueError:
      row = None
    if isinstance(row, dict) and isinstance(row.get("step", 0), int):
      out.append((line, row))
    else:
      bad.append(i)
  if bad and warn:
    which = (f"its last line ({bad[0]}) is half-written" if bad == [len(lines)]
             else f"line(s) {', '.join(map(str, bad[:5]))}{' …' if len(bad) > 5 else ''} "
                  f"of {len(lines)} are not JSON rows")
    console.warn(f"{path}: {which} (a run stopped mid-write?); left out")
  return out


class MetricsLog:
  """Appends JSONL rows and TensorBoard scalars (``chinchax.tracking.tblog``; written when ``enabled``),
  and gives the rows to ``wandb`` (``chinchax.tracking.wandblog``) when one is given.

  On resume drops JSONL rows past the restored step and purges them in
  TensorBoard; :attr:`last_loss` is the last training loss kept (NaN if none),
  then the last one written; :attr:`last_trial_loss` the same for a trials run's
  per-trial list (``train/trials.py``).

  Locally each row is appended as it comes. On an object store (a ``gs://``
  workdir), where objects cannot be appended to, the rows are kept in memory
  and the object is rewritten whole: at most every :data:`OBJECT_REWRITE_S`
  seconds, at each checkpoint (:meth:`sync`, called before the save starts) and
  at :meth:`close`. A run killed at any moment therefore has every row up to
  its last checkpoint in the object; the rows after it are dropped on resume
  and written again, as locally.
  """

  def __init__(self, path: pathlib.Path, resume_step: int, enabled: bool, wandb=None):
    self.path, self.enabled = path, enabled
    self.wandb = wandb  # a chinchax.tracking.wandblog.RunLogger: the same rows to Weights & Biases
    self._object = paths_lib.is_url(path)
    self._lines: list[str] = []  # an object store's rows (rewritten whole)
    self._dirty, self._rewritten_at = False, time.monotonic()
    self.tb = None
    self.last_loss = float("nan")
    self.last_trial_loss = None  # a trials run's last per-trial train losses (None: NaN)
    if path.exists():
      kept = [(l, row) for l, row in read_lines(path, warn=enabled)
              if row.get("step", 0) <= resume_step]  # a torn last line is dropped here
      keep = [l for l, _ in kept]
      losses = [row["loss"] for _, row in kept if "loss" in row]
      if losses:
        self.last_loss = float(losses[-1])
      trial = [row["trial_loss"] for _, row in kept if "trial_loss" in row]
      if trial:
        self.last_trial_loss = trial[-1]
      self._lines = keep if self._object else []
      if enabled:
        path.write_text("".join(l + "\n" for l in keep))
    if enabled:
      self.tb = tblog.ScalarWriter(path.parent / tblog.TB_DIR,
                                   purge_step=resume_step + 1 if resume_step else None)

  def write(self, row: dict) -> None:
    """Appends ``row`` (a flat dict of scalars with a ``step``)."""
    if "loss" in row:
      self.last_loss = float(row["loss"])
    if "trial_loss" in row:
      self.last_trial_loss = row["trial_loss"]
    if not self.enabled:
      return
    if self._object:
      self._lines.append(json.dumps(row))
      self._dirty = True
      if time.monotonic() - self._rewritten_at >= OBJECT_REWRITE_S:
        self.sync()
    else:
      line = json.dumps(row) + "\n"
      try:
        with self.path.open("a") as f:
          f.write(line)
        self.tb.write(row)
      except OSError as e:
        if not diskfull.is_disk_full(e):
          raise
        raise diskfull.disk_full(f"writing the metrics row of step {row.get('step')}",
                                 self.path, len(line)) from None
    if self._object:
      self.tb.write(row)
    if self.wandb is not None:
      self.wandb.write(row)

  def sync(self) -> None:
    """Makes the file hold every row written so far (an object store's rewrite; locally a no-op)."""
    if self.enabled and self._object and self._dirty:
      self.path.write_text("".join(l + "\n" for l in self._lines))
      self._dirty, self._rewritten_at = False, time.monotonic()

  def close(self) -> None:
    self.sync()
    if self.tb is not None:
      self.tb.close()
      self.tb = None
    if self.wandb is not None:
      self.wandb.close()
      self.wandb = None
