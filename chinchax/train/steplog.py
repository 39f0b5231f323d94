"""The loop's bookkeeping: deferred metric rows, speed windows, finiteness checks, the bar."""

from __future__ import annotations

import math
import time

import jax

import chinchax.train.mfu as mfu_lib
from chinchax.train.metrics import MetricsLog
from chinchax.train.rundata import RunData


def none_if_nan(x) -> float | None:
  """``x`` as a float, or None where it is NaN/Inf (a JSON-safe entry of a per-trial list)."""
  x = float(x)
  return x if math.isfinite(x) else None


class StepLog:
  """The loop's bookkeeping: deferred metric rows, speed windows, eval loss, progress bar.

  A row for step t is fetched only after step t+1 has been dispatched
  (:meth:`defer` then :meth:`flush`); tokens/s and MFU are measured over the
  steps since the previous logged step, the first (compiling) step excluded.
  """

  def __init__(self, spec, data: RunData, metrics: MetricsLog, bar, flops_per_step: float,
               peak_total: float, peak_src: str = ""):
    self.spec, self.data, self.metrics, self.bar = spec, data, metrics, bar
    self.flops_per_step, self.peak_total, self.peak_src = flops_per_step, peak_total, peak_src
    self.eval_loss = float("nan")
    self.eval_loss_se = None  # standard error over the fixed eval windows (train.eval_windows > 0)
    self.timed_steps, self.timed_seconds = 0, 0.0
    self.compile_s = None
    self._pending = None
    self._window_t0, self._window_steps = time.perf_counter(), 0
    self._unchecked = []  # (step, loss, grad_norm) device scalars since the last finiteness check
    self.nonfinite_at = None  # (step, loss, grad_norm) of the first non-finite step seen
    self.warned_nonfinite = False
    self.stopped_by_time = False  # train.stop_after_s ended the run before its last step

  def watch(self, step_no: int, metrics) -> None:
    """Keeps step ``step_no``'s loss and grad norm (device scalars: no wait) for :meth:`check`."""
    self._unchecked.append((step_no, metrics["loss"], metrics["grad_norm"]))

  def check(self):
    """(step, loss, grad_norm) of the first non-finite step so far, or None.

    Fetches the scalars kept since the last call in one transfer: called at log
    and checkpoint steps, where the loop waits for the device anyway.
    """
    rows, self._unchecked = self._unchecked, []
    if self.nonfinite_at is None and rows:
      for step_no, loss, grad_norm in jax.device_get(rows):
        if not (math.isfinite(float(loss)) and math.isfinite(float(grad_norm))):
          self.nonfinite_at = (step_no, float(loss), float(grad_norm))
          break
    return self.nonfinite_at

  @property
  def last_train_loss(self) -> float:
    return self.metrics.last_loss

  def stepped(self, state, t_dispatch: float) -> None:
    """After a step's dispatch: the first one is waited for and timed as compilation."""
    if self.compile_s is None:
      jax.block_until_ready(state["step"])
      self.compile_s = time.perf_counter() - t_dispatch
      self.restart_window()
    else:
      self._window_steps += 1
    self.flush()
    self.bar.update(1)

  def speed(self) -> dict:
    """Step time, tokens/s and MFU over the current window (empty if no step was timed)."""
    if not self._window_steps:
      return {}
    dt = time.perf_counter() - self._window_t0
    self.timed_steps += self._window_steps
    self.timed_seconds += dt
    step_time = dt / self._window_steps
    return {"step_time_s": step_time, "tokens_per_s": self.spec.tokens_per_step / step_time,
            "mfu": self.mfu(step_time)}

  def mfu(self, step_time: float) -> float:
    """Model FLOPs utilisation at ``step_time`` seconds per step; a calibrated CPU peak that a
    step outruns is measured again first (:func:`chinchax.train.mfu.checked_peak`)."""
    achieved = self.flops_per_step / step_time
    if achieved > self.peak_total:
      self.peak_total, self.peak_src = mfu_lib.checked_peak(achieved, self.peak_total,
                                                            self.peak_src)
    return achieved / self.peak_total

  def trained_seconds(self) -> float:
    """Seconds of timed steps so far in this call (closed windows plus the open one); 0.0
    until a step after the first (compiling) one is done. Read on the host clock without waiting on
    the device, so it may run up to the dispatch queue ahead of the finished steps."""
    if self.compile_s is None or not (self._window_steps or self.timed_steps):
      return 0.0
    return self.timed_seconds + (time.perf_counter() - self._window_t0)

  def restart_window(self) -> None:
    self._window_t0, self._window_steps = time.perf_counter(), 0

  def defer(self, step_no: int, metrics, extra: dict) -> None:
    self._pending = (step_no, metrics, extra)

  def flush(self) -> None:
    """Writes the deferred row, if any (fetching its metrics from the device)."""
    if self._pending is None:
      return
    step_no, m, extra = self._pending
    self._pending = None
    m = jax.device_get(m)
    loss = float(m["loss"])
    if "trial_loss" in m:  # a trials run (train/trials.py): each trial's figures, NaN once diverged
      extra = {**{key: [none_if_nan(x) for x in m[key]]
                  for key in ("trial_loss", "trial_grad_norm", "trial_lr")}, **extra}
    self.metrics.write({"step": step_no, "loss": loss,
                        "bits_per_byte": self.data.train_bits_per_byte(loss),
                        "grad_norm": float(m["grad_norm"]), "lr": float(m["lr"]),
                        **({"z_loss": float(m["z_loss"])} if "z_loss" in m else {}),
                        "tokens": step_no * self.spec.tokens_per_step, **extra})
    shown = {"loss": f"{loss:.3f}"}
    if not math.isnan(self.eval_loss):  # no eval yet: nothing to show
      shown["eval"] = f"{self.eval_loss:.3f}"
    self.bar.set_postfix(refresh=False, **shown)

  def close(self) -> None:
    self.flush()
    self.metrics.close()
    self.bar.close()
