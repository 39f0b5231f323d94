"""``--calibrate``: choose among measured shapes, not a step-time model's guesses.

Ranking by a fitted step-time model alone favours whichever shape the model
under-predicts most, so the time planner times its best candidates and the
FLOP-optimal shape (a ``measure`` function, on real devices
:func:`chinchax.planning.measure.measure_step_time`) and chooses among the
measured ones (:func:`calibrate`), their start-up (set-up, compile, first step)
paid out of the budget.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from chinchax.cost import budget
from chinchax.cost import hardware as hardware_lib
from chinchax.cost import step_time as step_time_lib
from chinchax.planning import layout as layout_lib
from chinchax.planning import timed
from chinchax.planning.errors import PlanError


@dataclasses.dataclass(frozen=True)
class ScaledStepTime:
  """A step-time model's predictions × ``factor`` (its bias measured by calibration)."""

  model: Any
  factor: float
  profile: Any = None

  def predict(self, shape: budget.ModelShape, global_batch_size: int,
              microbatches: int = 1) -> float:
    return self.factor * layout_lib.predict_step(self.model, shape, global_batch_size,
                                                 microbatches=microbatches)

  def startup_s(self, shape: budget.ModelShape, global_batch_size: int) -> float:
    return step_time_lib.model_startup_s(self.model, shape, global_batch_size)


def calibrate(ranked: list[timed.TimedCandidate], flop_opt: timed.TimedCandidate, k: int,
              measure: Any, seconds: float, C: float, law: Any, model: Any,
              hardware: hardware_lib.Hardware, has_loss: bool, progress: Any = None):
  """Measures candidates until the best one is a measured one.

  First the model's top ``k`` and the FLOP-optimal shape are measured; the
  unmeasured candidates' predictions are then multiplied by the median
  measured/predicted ratio (the model's bias on this machine), everything is
  re-ranked, and while the best is unmeasured it is measured too (at most
  ``k`` more). Only a measured candidate can be chosen.

  Args:
    ranked: the candidates ranked by the model (:func:`chinchax.planning.timed.rank_key`).
    flop_opt: the FLOP-optimal candidate.
    k: candidates to time first.
    measure: ``(ModelShape, global_batch_size) -> (step_time_s, startup_s)``,
      e.g. :func:`chinchax.planning.measure.measure_step_time` on ``hardware``.
    seconds, C, law, model, hardware: as in :func:`chinchax.planning.timed.evaluate`.
    has_loss: the law predicts loss (rank by loss, else by frontier distance).
    progress: called with a line before each measurement.

  Returns:
    (all candidates, measured and corrected, best first; the FLOP-optimal
    candidate with its measurement; the correction factor; warnings)
  Raises:
    PlanError: no measured candidate finishes a step once its start-up is paid.
  """
  if measure is None:
    raise PlanError("calibration needs a measure function (chinchax.planning.measure)")

  def key(tc):
    return tc.candidate.key

  by_key = {key(tc): tc for tc in ranked}
  by_key.setdefault(key(flop_opt), flop_opt)
  measured: dict[tuple[int, int], timed.TimedCandidate] = {}

  def measure_one(tc):
    s = tc.candidate.shape
    if progress is not None:
      progress(f"timing d_model {s.d_model} × {s.n_layers} layers, batch "
               f"{tc.batch.global_batch_size} (shape {len(measured) + 1})")
    t, startup = measure(s, tc.batch.global_batch_size)
    m = timed.Measurement(float(t), float(startup), tc.step_time_s)
    measured[key(tc)] = timed.evaluate(tc.candidate, seconds, C, law, model, hardware,
                                       measured=m)

  for tc in [tc for tc in ranked if tc.tokens > 0][:k] + [flop_opt]:
    if key(tc) not in measured:
      measure_one(tc)
  extra = 0
  while True:
    factor = float(np.median([tc.measured.step_time_s / tc.measured.model_step_time_s
                              for tc in measured.values()]))
    scaled = ScaledStepTime(model, factor, getattr(model, "profile", None))
    current = [measured.get(kk)
               or timed.evaluate(tc.candidate, seconds, C, law, scaled, hardware)
               for kk, tc in by_key.items()]
    current.sort(key=lambda tc: timed.rank_key(tc, has_loss))
    best = current[0]
    if key(best) in measured or extra >= k or best.tokens <= 0:
      break
    measure_one(by_key[key(best)])
    extra += 1
  chosen = min(measured.values(), key=lambda tc: timed.rank_key(tc, has_loss))
  if chosen.tokens <= 0:
    m = chosen.measured
    raise PlanError(
        f"{seconds:.4g} s is not enough for one training step once start-up is paid: the "
        f"measured shapes need {min(tc.measured.startup_s for tc in measured.values()):.3g} s "
        f"or more to start (set-up, compile, first step) and {m.step_time_s:.3g} s per step; "
        f"raise the budget or plan without --calibrate")
  notes = []
  better = [tc for tc in current if key(tc) not in measured and tc.tokens > 0
            and timed.rank_key(tc, has_loss) < timed.rank_key(chosen, has_loss)]
  if better:
    s = better[0].candidate.shape
    notes.append(f"calibration stopped after {len(measured)} timed shapes; the unmeasured "
                 f"d_model {s.d_model} × {s.n_layers} layers is predicted better than the chosen "
                 f"one (from the corrected model); rerun with a larger --calibrate to time it")
  return ([chosen] + [tc for tc in current if key(tc) != key(chosen)], measured[key(flop_opt)],
          factor, notes)
