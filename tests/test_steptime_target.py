"""The step time an IsoTime shape's predictors are scored against (analysis.isotime.steptime_cv)."""

import pytest

from analysis.isotime import steptime_cv
from test_isotime_fit import make_rows


def test_a_shapes_step_time_is_its_run_and_probe_timed_together():
  """A run timed 8% slow and its probe 8% fast, as a drifting core gives: the bytes predictor
  scored against their geometric mean is within 0.5%, against the run alone about 8% off."""
  rows = make_rows("bytes", noise=0.0)
  for i, r in enumerate(rows):
    sign = 1 if i % 2 else -1
    truth = r["step_time_s"]
    r["step_time_s"] = truth * (1 + 0.08 * sign)
    r["probe"] = {"step_time_s": truth * (1 - 0.08 * sign) / (1 - 0.0064)}  # (1+e)(1-e)/(1-e²) = 1
    assert steptime_cv.measured_step_time(r) == pytest.approx(truth, rel=1e-12)
  p = steptime_cv.compare_predictors(rows)["predictors"]["bytes"]
  assert p["heldout_mape"] < 0.005
  assert 0.07 < p["heldout_mape_vs_run"] < 0.09
  del rows[0]["probe"]
  assert steptime_cv.measured_step_time(rows[0]) == rows[0]["step_time_s"]
