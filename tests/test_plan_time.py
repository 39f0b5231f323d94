"""`chinchax plan` with time budgets: hours into tokens per candidate shape, calibration."""

import json
import math

import pytest

from chinchax.cost import budget
from chinchax.cost import hardware as hw
from chinchax.planning import allocate
from chinchax.planning import measure
from chinchax.planning import planner
from chinchax.planning import render
from chinchax.planning import shapes
from chinchax.cost import step_time
from chinchax.cost import work
from chinchax.planning.errors import PlanError
from chinchax.cost.work import StepTimeError
from test_plan import run_cli, plan_json, _synthetic_rows, _step_time_file


# ---------------------------------------------------------------- time budgets


# A law in byte tokens (the plan's own), so its losses are the plan's predictions.
BYTES_LAW = {"E": 0.8, "A": 48.2, "B": 208.5, "alpha": 0.348, "beta": 0.366,
             "units": {"tokenizer": "bytes", "vocab_size": 257, "corpus": "stdlib"}}


def test_hours_budget_converts_time_to_tokens_per_candidate(tmp_path):
  rows = _synthetic_rows()
  path, model = _step_time_file(tmp_path, rows)
  law_path = tmp_path / "bytes_law.json"
  law_path.write_text(json.dumps(BYTES_LAW))
  hours = 0.05
  j = plan_json("--hours", hours, "--hardware", "cpu", "--step-time-model", path,
                "--candidates", 50, "--law", law_path)
  law = allocate.resolve_law(str(law_path))
  losses = []
  for c in j["candidates"]:
    s = budget.ModelShape(d_model=c["d_model"], n_layers=c["n_layers"], n_heads=c["n_heads"],
                          d_ff=c["d_ff"], vocab_size=257, seq_len=128)
    t = model.predict(s, c["global_batch_size"])
    assert c["step_time_s"] == pytest.approx(t)
    assert c["steps"] == math.floor(hours * 3600 / t)
    assert c["D"] == c["steps"] * c["global_batch_size"] * 128
    assert c["predicted_loss"] == pytest.approx(law.loss(c["N"], c["D"]))
    losses.append(c["predicted_loss"])
  assert len(losses) >= 10
  assert j["predicted_loss"] == min(losses)  # the best candidate is chosen
  assert j["seconds"] <= hours * 3600 + 1e-6
  comp = j["comparison"]
  assert comp["loss_gain"] >= 0
  assert comp["flop_optimal"]["predicted_loss"] >= j["predicted_loss"]


def _trap_measure(model, trap, slow=3.0, bias=1.3, startup=2.0):
  """A fake machine: every step takes ``bias`` × the model's time, shape ``trap`` ``slow`` ×."""
  calls = []

  def measure(shape, gbs):
    calls.append((shape.d_model, shape.n_layers, gbs))
    f = slow if (shape.d_model, shape.n_layers) == trap else bias
    return f * model.predict(shape, gbs), startup
  return measure, calls


def test_calibrate_measures_top_candidates_and_avoids_a_mispredicted_shape(tmp_path):
  path, model = _step_time_file(tmp_path, _synthetic_rows())
  cpu = hw.parse_hardware("cpu")
  seconds = 0.05 * 3600
  base = planner.plan_time(seconds, cpu, step_time_model=model, k=50)
  trap = (base.chosen.shape.d_model, base.chosen.shape.n_layers)
  measure, calls = _trap_measure(model, trap)
  p = planner.plan_time(seconds, cpu, step_time_model=model, k=50, calibrate=3, measure=measure)
  measured = {(c[0], c[1]) for c in calls}
  assert trap in measured and len(calls) == len(measured) >= 3  # each shape timed once
  chosen = (p.chosen.shape.d_model, p.chosen.shape.n_layers)
  assert chosen != trap and chosen in measured
  # The chosen step time is its measurement; start-up comes out of the budget.
  t_true = 1.3 * model.predict(p.chosen.shape, p.batch.global_batch_size)
  assert p.step_time_s == pytest.approx(t_true)
  assert p.batch.steps == math.floor((seconds - 2.0) / t_true)
  assert p.seconds == pytest.approx(2.0 + p.batch.steps * t_true) and p.seconds <= seconds
  # Calibration rows: the model's error on each measured shape; the factor is their median.
  errs = {(r["d_model"], r["n_layers"]): r["model_error"] for r in p.calibration}
  assert set(errs) == measured
  assert errs[trap] == pytest.approx(1 / 3 - 1)
  assert p.calibration_factor == pytest.approx(1.3)
  # Unmeasured candidates carry the model's prediction × the factor; no unmeasured one
  # is predicted to beat the chosen (measured) shape.
  for c in p.candidates:
    s = budget.ModelShape(d_model=c["d_model"], n_layers=c["n_layers"], n_heads=c["n_heads"],
                          d_ff=c["d_ff"], vocab_size=257, seq_len=128)
    if c["step_time_source"] == "model":
      assert c["step_time_s"] == pytest.approx(1.3 * model.predict(s, c["global_batch_size"]))
      assert c["predicted_loss"] >= p.predicted_loss
  assert p.candidates[0]["step_time_source"] == "measured"
  assert "calibration" in render.format_plan(p)


def test_calibrate_keeps_the_model_pick_when_the_model_is_right(tmp_path):
  path, model = _step_time_file(tmp_path, _synthetic_rows())
  cpu = hw.parse_hardware("cpu")
  base = planner.plan_time(180.0, cpu, step_time_model=model)
  measure, calls = _trap_measure(model, trap=None, bias=1.0, startup=0.0)
  p = planner.plan_time(180.0, cpu, step_time_model=model, calibrate=2, measure=measure)
  assert (p.chosen, p.D) == (base.chosen, base.D)
  assert 2 <= len(calls) <= 3  # the top 2 and the FLOP-optimal shape


def test_calibrate_refuses_a_budget_that_start_up_eats(tmp_path):
  path, model = _step_time_file(tmp_path, _synthetic_rows())
  measure, calls = _trap_measure(model, trap=None, bias=1.0, startup=10.0)
  with pytest.raises(PlanError, match=r"5 s is not enough.*10 s or more to start"):
    planner.plan_time(5.0, hw.parse_hardware("cpu"), step_time_model=model, calibrate=2,
                       measure=measure)
  assert calls  # measured, then refused: no 0-step plan


def test_calibrate_warns_when_an_unmeasured_shape_looks_better(tmp_path):
  """With the timing cap reached, a better-looking unmeasured shape is named, not hidden."""
  path, model = _step_time_file(tmp_path, _synthetic_rows())
  cpu = hw.parse_hardware("cpu")
  lines = []
  calls = []

  def measure(shape, gbs):  # every shape timed is slow; unmeasured ones look fast
    calls.append(shape)
    return 4.0 * model.predict(shape, gbs) * (1 + len(calls)), 0.0

  p = planner.plan_time(600.0, cpu, step_time_model=model, k=50, calibrate=1, measure=measure,
                         progress=lines.append)
  assert len(calls) <= 3 and len(lines) == len(calls)  # top 1, FLOP-optimal, at most 1 more
  assert lines[0].startswith("timing d_model ")
  assert p.candidates[0]["step_time_source"] == "measured"
  assert any("calibration stopped" in w for w in p.warnings)


def test_calibrate_times_a_real_step_on_this_machine():
  s = shapes.shape_for(32, 2, vocab_size=257, seq_len=32, accelerator=False)
  t, startup = measure.measure_step_time(s, 4, hw.parse_hardware("cpu"), warmup_steps=1,
                                          timed_steps=3)
  assert 0 < t < startup  # compiling costs more than one tiny step


@pytest.mark.parametrize("argv,match", [
    (["--hours", "1", "--hardware", "cpu", "--calibrate", "-1"], "--calibrate must be >= 0"),
    (["--flops", "1e12", "--calibrate", "2"], "--calibrate times candidates for --hours"),
    (["--hours", "1", "--hardware", "h100x8", "--calibrate", "1"],
     "times candidates on this machine.*not h100x8"),
])
def test_calibrate_bad_input(tmp_path, argv, match):
  target = tmp_path / "planned.py"
  rc, out, err = run_cli(*argv, "--write-config", target)
  assert rc == 2 and out == "" and not target.exists()
  lines = [l for l in err.splitlines() if l.strip()]
  assert len(lines) == 1 and __import__("re").search(match, lines[0]), err


def test_start_up_in_the_step_time_file_comes_out_of_the_budget(tmp_path):
  rows = _synthetic_rows()
  for i, r in enumerate(rows):
    r["startup_s"] = 20.0 + i  # median 24.5 s
  path, model = _step_time_file(tmp_path, rows)
  hours = 0.05
  j = plan_json("--hours", hours, "--hardware", "cpu", "--step-time-model", path,
                "--candidates", 50)
  measured = {step_time.MeasuredStepTime.key(*step_time.measurement_shape(r)[:2]): r["startup_s"]
              for r in rows}
  for c in j["candidates"]:
    s = budget.ModelShape(d_model=c["d_model"], n_layers=c["n_layers"], n_heads=c["n_heads"],
                          d_ff=c["d_ff"], vocab_size=257, seq_len=128)
    startup = measured.get(step_time.MeasuredStepTime.key(s, c["global_batch_size"]), 24.5)
    assert c["startup_s"] == startup
    assert c["steps"] == math.floor((hours * 3600 - startup) / model.predict(
        s, c["global_batch_size"]))
  assert j["seconds"] == pytest.approx(j["startup_s"] + j["steps"] * j["step_time_s"])
  assert j["seconds"] <= hours * 3600
  rc, out, err = run_cli("--hours", 10 / 3600, "--hardware", "cpu", "--step-time-model", path)
  assert rc == 2 and out == "" and "start-up alone is 24.5 s" in err
  rc, out, _ = run_cli("--hours", hours, "--hardware", "cpu", "--step-time-model", path)
  assert rc == 0 and f"start-up {j['startup_s']:.3g} s + " in out
  for value in (-1, True, "abc"):
    bad = json.loads(path.read_text())
    bad["measurements"][0]["startup_s"] = value
    path.write_text(json.dumps(bad))
    with pytest.raises(StepTimeError, match=f"startup_s={value!r}"):
      step_time.load_step_time_model(path)


def test_wider_shape_beats_flop_optimal_on_h100():
  """Roofline on 8×H100: attention's seq_len² work per layer favours fewer, wider layers."""
  j = plan_json("--hours", 24, "--hardware", "h100x8", "--vocab-size", 32000)
  comp = j["comparison"]
  assert not comp["same_shape"]
  assert comp["best"]["aspect_ratio"] > comp["flop_optimal"]["aspect_ratio"]
  assert comp["loss_gain"] > 0
  assert comp["throughput_ratio"] > 1
  assert "wider/shallower" in comp["summary"]
  assert j["hours"] <= 24


def test_time_planner_with_allocation_only_law():
  j = plan_json("--hours", 10, "--hardware", "v5e-8", "--law", "chinchilla-approach1")
  assert j["predicted_loss"] is None
  gaps = [c["frontier_gap"] for c in j["candidates"]]
  assert j["candidates"][0]["frontier_gap"] == min(gaps)
