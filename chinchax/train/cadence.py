"""Evals and checkpoints on the wall clock (``train.eval_every_s``, ``train.checkpoint_every_s``).

A pod run's eval and checkpoint cadence is wanted in time (every 30 minutes), not in
steps whose duration is unknown before the run. :class:`WallClock` is asked at the log
steps (``train.log_every``) only; process 0's clock decides and, in a multi-process run,
its answer is broadcast to every process, so all of them evaluate and save at the same
step (a collective every ``log_every`` steps, only when a time cadence is set).
"""

from __future__ import annotations

import time

import jax
import numpy as np
from jax.experimental import multihost_utils


class WallClock:
  """Seconds since the last eval and the last checkpoint against their intervals.

  Args:
    eval_every_s: evaluate when this many seconds have passed since the last eval (0 = never).
    checkpoint_every_s: checkpoint likewise (0 = never).
    clock: seconds, monotonic (default ``time.monotonic``; a test passes its own).
  """

  def __init__(self, eval_every_s: float, checkpoint_every_s: float, clock=time.monotonic):
    self.eval_every_s, self.checkpoint_every_s = float(eval_every_s), float(checkpoint_every_s)
    self.clock = clock
    self.last_eval = self.last_checkpoint = clock()

  @property
  def active(self) -> bool:
    return self.eval_every_s > 0 or self.checkpoint_every_s > 0

  def due(self) -> tuple[bool, bool]:
    """(an eval is due, a checkpoint is due), the same on every process (module doc)."""
    if not self.active:
      return False, False
    now = self.clock()
    flags = np.array([self.eval_every_s > 0 and now - self.last_eval >= self.eval_every_s,
                      self.checkpoint_every_s > 0
                      and now - self.last_checkpoint >= self.checkpoint_every_s], np.int32)
    if jax.process_count() > 1:
      flags = np.asarray(multihost_utils.broadcast_one_to_all(flags))
    return bool(flags[0]), bool(flags[1])

  def evaluated(self) -> None:
    self.last_eval = self.clock()

  def checkpointed(self) -> None:
    self.last_checkpoint = self.clock()
