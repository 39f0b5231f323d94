"""A run's metrics: ``metrics.jsonl`` rows and TensorBoard scalars, and the eval schedule."""

from __future__ import annotations

import json
import pathlib

import numpy as np

from chinchax import tblog


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


class MetricsLog:
  """Appends JSONL rows and TensorBoard scalars (``chinchax.tblog``; written when ``enabled``).

  On resume drops JSONL rows past the restored step and purges them in
  TensorBoard; :attr:`last_loss` is the last training loss kept (NaN if none),
  then the last one written; :attr:`last_trial_loss` the same for a trials run's
  per-trial list (``train/trials.py``).
  """

  def __init__(self, path: pathlib.Path, resume_step: int, enabled: bool):
    self.path, self.enabled = path, enabled
    self.tb = None
    self.last_loss = float("nan")
    self.last_trial_loss = None  # a trials run's last per-trial train losses (None: NaN)
    if path.exists():
      keep = [l for l in path.read_text().splitlines()
              if l.strip() and json.loads(l).get("step", 0) <= resume_step]
      losses = [json.loads(l)["loss"] for l in keep if "loss" in json.loads(l)]
      if losses:
        self.last_loss = float(losses[-1])
      trial = [json.loads(l)["trial_loss"] for l in keep if "trial_loss" in json.loads(l)]
      if trial:
        self.last_trial_loss = trial[-1]
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
    if self.enabled:
      with self.path.open("a") as f:
        f.write(json.dumps(row) + "\n")
      self.tb.write(row)

  def close(self) -> None:
    if self.tb is not None:
      self.tb.close()
      self.tb = None
