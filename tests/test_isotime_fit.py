"""IsoTime fits (``analysis.isotime.fit``): step-time predictors held out by shape, loss from shape
and seconds, wider vs deeper, the validation run, bad tables, ``model_from_dict``, and
``chinchax plan --law`` / ``chinchax fit`` on an IsoTime fit. Synthetic tables, no training."""

import contextlib
import io
import json
import math
import os

import numpy as np
import pytest

from analysis.isotime import fit as isotime
from analysis.errors import ResultsError
from chinchax.cost import budget
from chinchax import cli
from chinchax.cost import hardware as hardware_lib
from chinchax.laws import parametric as laws
from chinchax.cost import step_time
from chinchax.cost import work
from chinchax.cli import fit as fit_cli
from chinchax.cost.work import StepTimeError

VOCAB, SEQ, GBS = 257, 128, 16
PROFILE = work.ExecutionProfile.from_names("float32", "xla")
TRUE = {"E": 1.8, "A": 40.0, "B": 50.0, "alpha": 0.34, "beta": 0.28}
LAW = laws.law_from_dict(TRUE)
T0, S_PER_BYTE, S_PER_FLOP = 2e-3, 1 / 5e9, 1 / 2e10
SMALL_GRID = "logA=0:10:3,logB=0:10:3,logE=0:1:2,alpha=0:1:3,beta=0:1:3"  # 162 starts


def shape_near(n_target, n_layers):
  """The width (multiple of 16) whose N at ``n_layers`` layers is nearest ``n_target``."""
  def make(d):
    return budget.ModelShape(d_model=d, n_layers=n_layers, n_heads=d // 16,
                             d_ff=16 * round(8 * d / 48), vocab_size=VOCAB, seq_len=SEQ)
  return min((make(d) for d in range(16, 2049, 16)),
             key=lambda s: abs(budget.param_counts(s).total - n_target))


def true_step_time(shape, kind):
  f = work.step_flops(shape, GBS, profile=PROFILE)
  b = work.bytes_per_step(shape, GBS, profile=PROFILE)
  return T0 + (b * S_PER_BYTE if kind == "bytes" else f * S_PER_FLOP)


def make_rows(kind="bytes", budgets=(30.0, 90.0), n_targets=(2e5, 6e5, 1.5e6),
              depths=(1, 2, 3, 4), noise=0.01, seed=0, depth_bonus=0.0, xla_factor=None):
  """IsoTime rows: step time t0 + b·bytes (or a·FLOPs) × (1 + noise); D = floor(T / t)·batch·
  seq_len; loss from TRUE (minus depth_bonus·n_layers). ``xla_factor``: shape -> factor on the
  true bytes term, recorded as the probe's xla_bytes_accessed (XLA sees the real traffic)."""
  rng = np.random.default_rng(seed)
  rows = []
  for T in budgets:
    for nt in n_targets:
      for L in depths:
        s = shape_near(nt, L)
        n = budget.param_counts(s).total
        t_model = true_step_time(s, kind)
        probe = None
        if xla_factor is not None:
          b = work.bytes_per_step(s, GBS, profile=PROFILE) * xla_factor(s)
          t_model = T0 + b * S_PER_BYTE
          probe = {"step_time_s": t_model, "startup_s": 1.0,
                   "xla_flops": work.step_flops(s, GBS, profile=PROFILE), "xla_bytes_accessed": b}
        t = t_model * (1 + rng.normal(0, noise))
        steps = math.floor(T / t)
        D = steps * GBS * SEQ
        loss = float(LAW.loss(n, D)) - depth_bonus * L
        rows.append({
            "run_id": f"T{T:g}-N{nt:g}-L{L}", "role": "grid", "status": "done",
            "budget_kind": "seconds", "seconds_budget": T, "N_target": nt, "N": n,
            "N_non_embedding": budget.param_counts(s).non_embedding,
            "shape": {"d_model": s.d_model, "n_layers": L, "n_heads": s.n_heads, "d_ff": s.d_ff,
                      "vocab_size": VOCAB, "seq_len": SEQ},
            "hparams": {"global_batch_size": GBS, "peak_lr": 3e-3}, "D": D, "steps": steps,
            "C_6nd": 6.0 * n * D, "final_eval_loss": loss, "final_eval_loss_se": 1e-3,
            "step_time_planned_s": t_model, "step_time_source": "model", "step_time_s": t,
            "train_time_s": steps * t, "compile_s": 2.0, "wall_time_s": steps * t + 5,
            "n_devices": 1, "hardware": "cpu", "compute_dtype": "float32", "attention": "xla",
            "probe": probe})
  return rows


def validation_row(loss=100.0, step_time_factor=10.0):
  s = shape_near(1e6, 2)
  n = budget.param_counts(s).total
  t_plan = true_step_time(s, "bytes")
  T = 120.0
  steps = math.floor(T / (t_plan * step_time_factor))
  return {"run_id": "V-T120", "role": "validation", "status": "done", "budget_kind": "seconds",
          "seconds_budget": T, "N_target": 1e6, "N": n,
          "shape": {"d_model": s.d_model, "n_layers": 2, "n_heads": s.n_heads, "d_ff": s.d_ff,
                    "vocab_size": VOCAB, "seq_len": SEQ},
          "hparams": {"global_batch_size": GBS}, "D": steps * GBS * SEQ, "steps": steps,
          "final_eval_loss": loss, "predicted_loss": 3.0, "predicted_step_time_s": t_plan,
          "step_time_planned_s": t_plan, "step_time_s": t_plan * step_time_factor,
          "train_time_s": steps * t_plan * step_time_factor, "predictor": "bytes",
          "n_devices": 1, "hardware": "cpu", "compute_dtype": "float32", "attention": "xla"}


def write_table(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


@pytest.fixture
def law_file(tmp_path):
  p = tmp_path / "law.json"
  p.write_text(json.dumps(TRUE))
  return str(p)


def fit(tmp_path, rows, law_path=None, name="fit", **kw):
  table = write_table(tmp_path / f"{name}.jsonl", rows)
  kw.setdefault("figures", False)
  if law_path is None:
    kw.setdefault("grid", SMALL_GRID)
  return isotime.fit_isotime(table, tmp_path / name, law_path=law_path, log=None, warn=None, **kw)


def strict_json(path):
  def no_nan(x):
    raise AssertionError(f"{path} holds {x}")
  with open(path) as f:
    return json.load(f, parse_constant=no_nan)


# ------------------------------------------------------------------ step-time predictors


def test_features_of_the_synthetic_shapes_are_not_collinear():
  rows = make_rows()
  shapes = [shape_near(nt, L) for nt in (2e5, 6e5, 1.5e6) for L in (1, 2, 3, 4)]
  assert len({(s.d_model, s.n_layers) for s in shapes}) == 12
  f = np.log([work.step_flops(s, GBS, profile=PROFILE) for s in shapes])
  b = np.log([work.bytes_per_step(s, GBS, profile=PROFILE) for s in shapes])
  assert abs(np.corrcoef(f, b)[0, 1]) < 0.99
  assert len(rows) == 24


def test_bytes_driven_step_time_chooses_bytes(tmp_path, law_file):
  d = fit(tmp_path, make_rows("bytes"), law_file)
  p = d["predictors"]
  assert p["bytes"]["heldout_mape"] < p["flops"]["heldout_mape"] / 3
  assert d["chosen_predictor"] in ("bytes", "flops+bytes")
  assert d["chosen_predictor"] != "flops"
  assert p["bytes"]["heldout_mape"] < 0.03  # 1% noise
  assert p["bytes"]["heldout_r2"] > 0.99 > p["flops"]["heldout_r2"]
  c = p["bytes"]["coefficients"]
  assert c["s_per_byte"] == pytest.approx(S_PER_BYTE, rel=0.05)
  assert d["step_time"]["predictor"] == d["chosen_predictor"]
  assert len(p["bytes"]["heldout_predictions_s"]) == len(d["runs"]) == 24


def test_flops_driven_step_time_chooses_flops(tmp_path, law_file):
  d = fit(tmp_path, make_rows("flops"), law_file)
  p = d["predictors"]
  assert p["flops"]["heldout_mape"] < p["bytes"]["heldout_mape"] / 3
  assert d["chosen_predictor"] in ("flops", "flops+bytes")
  assert p["flops"]["coefficients"]["s_per_flop"] == pytest.approx(S_PER_FLOP, rel=0.05)


def test_a_held_out_shape_is_not_in_its_own_fit(tmp_path, law_file):
  rows = make_rows("bytes", noise=0.0)
  odd = (rows[5]["shape"]["d_model"], rows[5]["shape"]["n_layers"])
  for r in rows:
    if (r["shape"]["d_model"], r["shape"]["n_layers"]) == odd:
      r["step_time_s"] *= 3.0  # one shape runs 3× slower than the bytes model says
  d = fit(tmp_path, rows, law_file)
  pred = d["predictors"]["bytes"]["heldout_predictions_s"]
  for r, t in zip(d["runs"], pred):
    s = shape_near(r["N_target"], r["n_layers"])
    if (r["d_model"], r["n_layers"]) == odd:  # predicted from the other shapes: the model's time
      assert t == pytest.approx(true_step_time(s, "bytes"), rel=1e-6)
      assert t / r["step_time_s"] == pytest.approx(1 / 3, rel=1e-6)


def test_xla_feature_predictor_falls_back_to_an_analytic_one(tmp_path, law_file):
  rng = np.random.default_rng(1)
  factors = {}
  rows = make_rows("bytes", xla_factor=lambda s: factors.setdefault(
      (s.d_model, s.n_layers), float(rng.uniform(0.6, 1.6))))
  d = fit(tmp_path, rows, law_file)
  assert "xla-bytes" in d["predictors"] and "xla-flops" in d["predictors"]
  assert d["chosen_predictor"] == "xla-bytes"
  st = d["step_time"]
  assert st["fallback_from"] == "xla-bytes" and st["predictor"] in ("flops", "bytes",
                                                                    "flops+bytes", "roofline")
  assert st["heldout_mape"] == d["predictors"][st["predictor"]]["heldout_mape"]
  assert "xla-bytes" in strict_json(tmp_path / "fit" / "fit.json")[
      "step_time"]["note"]
  step_time.model_from_dict(st)  # prices any shape


# ------------------------------------------------------------------ loss from shape and time


def test_loss_from_shape_and_time_with_a_given_law(tmp_path, law_file):
  d = fit(tmp_path, make_rows("bytes"), law_file)
  lp = d["loss_prediction"]
  assert lp["median_abs_rel_error"] < 0.005
  assert d["law"]["from"] == f"file {law_file}" and d["law"]["in_sample"] is False
  t_pred = d["predictors"][d["chosen_predictor"]]["heldout_predictions_s"]
  for r, row, t in zip(d["runs"], lp["rows"], t_pred):
    assert row["step_time_pred_s"] == t
    D = math.floor(r["seconds_budget"] / t) * GBS * SEQ
    assert row["D_pred"] == D
    assert row["loss_pred"] == pytest.approx(float(LAW.loss(r["N"], D)))
    assert row["rel_error"] == pytest.approx(row["loss_pred"] / r["loss"] - 1)
  errs = [abs(r["rel_error"]) for r in lp["rows"]]
  assert lp["max_abs_rel_error"] == pytest.approx(max(errs))
  assert lp["median_abs_rel_error"] == pytest.approx(float(np.median(errs)))


def test_loss_from_shape_and_time_with_the_in_sample_law(tmp_path):
  d = fit(tmp_path, make_rows("bytes"))
  assert d["law"]["in_sample"] is True and "in-sample" in d["law"]["from"]
  assert d["loss_prediction"]["median_abs_rel_error"] < 0.005
  assert d["E"] == pytest.approx(TRUE["E"], rel=0.05)
  fj = strict_json(tmp_path / "fit" / "fit.json")
  law = laws.law_from_dict(fj)  # what `chinchax plan --law fit.json` reads
  assert law.E == d["E"] and law.beta == d["beta"]
  assert "in-sample" in (tmp_path / "fit" / "fit.md").read_text()


# ------------------------------------------------------------------ wider or deeper


def test_wider_wins_when_bytes_make_depth_slow(tmp_path, law_file):
  rows = make_rows("bytes")
  d = fit(tmp_path, rows, law_file)
  wvd = d["wider_vs_deeper"]
  assert [b["seconds_budget"] for b in wvd["budgets"]] == [30.0, 90.0]
  for b in wvd["budgets"]:
    sel = [r for r in rows if r["seconds_budget"] == b["seconds_budget"]]
    best = min(sel, key=lambda r: r["final_eval_loss"])
    assert b["time_optimal"]["run_id"] == best["run_id"]
    for lv in b["levels"]:
      level = [r for r in sel if r["N_target"] == lv["N_target"]]
      assert lv["winner"] == min(level, key=lambda r: r["final_eval_loss"])["run_id"]
      assert [e["aspect"] for e in lv["runs"]] == sorted(e["aspect"] for e in lv["runs"])
    assert b["verdict"] == "the shallowest/widest shape wins"
    f = b["flop_optimal"]
    assert f["C"] == pytest.approx(6.0 * best["N"] * best["D"])
    assert f["N_opt"] == pytest.approx(float(LAW.optimal_allocation(f["C"])[0]))
  assert wvd["answer"].startswith("wider/shallower wins")


def test_deeper_wins_when_depth_lowers_the_loss(tmp_path, law_file):
  d = fit(tmp_path, make_rows("bytes", depth_bonus=0.2), law_file)
  verdicts = {b["verdict"] for b in d["wider_vs_deeper"]["budgets"]}
  assert verdicts == {"the deepest wins"}
  assert d["wider_vs_deeper"]["answer"].startswith("deeper wins")


def test_flop_optimal_shape_comes_from_the_callable(tmp_path, law_file):
  flop_shape = fit_cli.ladder_flop_shape(VOCAB, SEQ)
  d = fit(tmp_path, make_rows("bytes"), law_file, flop_shape=flop_shape, figures=True)
  for b in d["wider_vs_deeper"]["budgets"]:
    s = b["flop_optimal"]["shape"]
    shape = budget.ModelShape(d_model=s["d_model"], n_layers=s["n_layers"], n_heads=s["n_heads"],
                              d_ff=s["d_ff"], vocab_size=VOCAB, seq_len=SEQ)
    assert budget.param_counts(shape).total == s["N"]
    assert s["N"] == pytest.approx(b["flop_optimal"]["N_opt"], rel=0.1)
  out = tmp_path / "fit"
  for name in ("step_time_predictors.png", "loss_vs_aspect.png"):
    assert (out / name).read_bytes()[:4] == b"\x89PNG"
  assert sorted(os.listdir(out)) == ["fit.json", "fit.md", "loss_vs_aspect.png",
                                     "step_time_predictors.png"]


# ------------------------------------------------------------------ validation run


def test_validation_row_is_never_fitted(tmp_path):
  rows = make_rows("bytes")
  a = fit(tmp_path, rows, name="without")
  b = fit(tmp_path, rows + [validation_row(loss=100.0)], name="with")
  for key in ("E", "A", "B", "alpha", "beta", "chosen_predictor", "step_time", "n_runs"):
    assert a[key] == b[key], key
  assert a["predictors"] == b["predictors"]
  assert b["n_validation"] == 1
  table = str(tmp_path / "with.jsonl")
  block = isotime.add_isotime_validation(table, tmp_path / "with", log=None)
  assert block["run_id"] == "V-T120"
  assert block["rel_error"] == pytest.approx((100.0 - 3.0) / 3.0)
  v = validation_row()
  D = math.floor(v["seconds_budget"] / v["predicted_step_time_s"]) * GBS * SEQ
  law = laws.law_from_dict(b)
  assert block["predicted_loss_fit"] == pytest.approx(float(law.loss(v["N"], D)))
  assert block["step_time_rel_error"] == pytest.approx(9.0)
  fj = strict_json(tmp_path / "with" / "fit.json")
  assert fj["validation"]["run_id"] == "V-T120" and fj["E"] == b["E"]
  assert "Validation run" in (tmp_path / "with" / "fit.md").read_text()
  assert isotime.add_isotime_validation(str(tmp_path / "without.jsonl"), tmp_path / "without",
                                        log=None) is None


def test_a_later_row_of_a_run_replaces_an_earlier_one(tmp_path, law_file):
  rows = make_rows("bytes")
  first = dict(rows[0], status="failed", final_eval_loss=None)
  d = fit(tmp_path, [first] + rows, law_file)
  assert d["n_runs"] == 24 and d["n_failed"] == 0


def test_untimed_runs_are_left_out_with_a_warning(tmp_path, law_file):
  rows = make_rows("bytes")
  rows[3]["step_time_s"] = None
  warnings = []
  d = isotime.fit_isotime(write_table(tmp_path / "t.jsonl", rows), tmp_path / "fit",
                          law_path=law_file, log=None, warn=warnings.append, figures=False)
  assert d["n_runs"] == 23 and d["untimed"] == [rows[3]["run_id"]]
  assert any(rows[3]["run_id"] in w for w in warnings)


def test_roofline_runs_on_the_rows_devices(tmp_path, law_file):
  rows = make_rows("bytes")
  for r in rows:
    r["n_devices"] = 2
  d = fit(tmp_path, rows, law_file)
  hw = hardware_lib.parse_hardware("cpux2")
  for r, t in zip(d["runs"], d["predictors"]["roofline"]["heldout_predictions_s"]):
    s = shape_near(r["N_target"], r["n_layers"])
    assert t == pytest.approx(step_time.RooflineStepTime(hw, profile=PROFILE).predict(s, GBS))
  assert d["step_time"]["n_devices"] == 2


# ------------------------------------------------------------------ bad input


def test_bad_tables_raise_one_clear_error_and_leave_the_earlier_fit(tmp_path, law_file):
  fit(tmp_path, make_rows("bytes"), law_file, figures=True)
  out = tmp_path / "fit"
  before = {p: (out / p).read_bytes() for p in os.listdir(out)}
  isoflop = [{"run_id": f"r{i}", "status": "done", "C_budget": 1e15, "N": 1e5 * (i + 1),
              "D": 1e9, "final_eval_loss": 3.0} for i in range(8)]
  with pytest.raises(ResultsError, match="not an IsoTime table"):
    isotime.fit_isotime(write_table(tmp_path / "flop.jsonl", isoflop), out, law_path=law_file,
                        log=None, warn=None)
  with pytest.raises(ResultsError, match="at least 6"):
    isotime.fit_isotime(write_table(tmp_path / "few.jsonl", make_rows()[:3]), out,
                        law_path=law_file, log=None, warn=None)
  bad = make_rows()
  bad[4]["step_time_s"] = -1.0
  with pytest.raises(ResultsError, match="step_time_s"):
    isotime.fit_isotime(write_table(tmp_path / "bad.jsonl", bad), out, law_path=law_file,
                        log=None, warn=None)
  assert {p: (out / p).read_bytes() for p in os.listdir(out)} == before


def test_a_failure_while_writing_leaves_the_earlier_files(tmp_path, law_file, monkeypatch):
  fit(tmp_path, make_rows("bytes"), law_file)
  out = tmp_path / "fit"
  before = {p: (out / p).read_bytes() for p in os.listdir(out)}
  from analysis.isotime import report as isotime_report

  def broken(data):
    raise RuntimeError("disk full")
  monkeypatch.setattr(isotime_report, "markdown", broken)
  with pytest.raises(RuntimeError):
    fit(tmp_path, make_rows("flops"), law_file)
  assert {p: (out / p).read_bytes() for p in os.listdir(out)} == before


# ------------------------------------------------------------------ model_from_dict


def test_model_from_dict_round_trip(tmp_path, law_file):
  d = fit(tmp_path, make_rows("bytes"), law_file)
  st = strict_json(tmp_path / "fit" / "fit.json")["step_time"]
  model = step_time.model_from_dict(st, source="fit.json")
  assert model.name == st["predictor"]
  c = d["predictors"][st["predictor"]]["coefficients"]
  for L in (1, 3, 6):
    s = shape_near(4e5, L)
    f = work.step_flops(s, GBS, profile=PROFILE)
    b = work.bytes_per_step(s, GBS, profile=PROFILE)
    want = c["intercept_s"] + c.get("s_per_flop", 0.0) * f + c.get("s_per_byte", 0.0) * b
    assert model.predict(s, GBS) == pytest.approx(want, rel=1e-12)
  assert f"{st['predictor']} predictor" in model.describe() and "fit.json" in model.describe()
  for key in ("intercept_s", "predictor", "compute_dtype", "n_devices"):
    broken = {k: v for k, v in st.items() if k != key}
    with pytest.raises(StepTimeError, match=key):
      step_time.model_from_dict(broken)
  with pytest.raises(StepTimeError, match="predictor"):
    step_time.model_from_dict(dict(st, predictor="magic"))
  with pytest.raises(StepTimeError, match="s_per_byte"):
    step_time.model_from_dict(dict(st, predictor="bytes", s_per_byte=float("nan")))


def test_model_from_dict_roofline():
  d = {"predictor": "roofline", "hardware": "cpu", "compute_dtype": "float32",
       "attention": "xla", "mfu": 0.3}
  model = step_time.model_from_dict(d)
  ref = step_time.RooflineStepTime(hardware_lib.parse_hardware("cpu"), mfu=0.3,
                                   profile=PROFILE)
  s = shape_near(4e5, 2)
  assert model.predict(s, GBS) == ref.predict(s, GBS)
  with pytest.raises(StepTimeError, match="hardware"):
    step_time.model_from_dict({k: v for k, v in d.items() if k != "hardware"})


# ------------------------------------------------------------------ the command line


def run_cli(*argv):
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    rc = cli.main([str(a) for a in argv])
  return rc, out.getvalue(), err.getvalue()


def test_plan_uses_the_isotime_predictor(tmp_path, law_file):
  d = fit(tmp_path, make_rows("bytes"), law_file)
  fit_json = tmp_path / "fit" / "fit.json"
  rc, out, err = run_cli("plan", "--hours", 0.01, "--hardware", "cpu", "--law", fit_json, "--json")
  assert rc == 0, err
  j = json.loads(out)
  chosen = d["step_time"]["predictor"]
  assert f"IsoTime fit's {chosen} predictor" in j["step_time_model"]
  assert str(fit_json) in j["step_time_model"]
  assert j["law"]["source"] == str(fit_json)
  model = step_time.model_from_dict(d["step_time"])
  for c in j["candidates"]:
    s = budget.ModelShape(d_model=c["d_model"], n_layers=c["n_layers"], n_heads=c["n_heads"],
                          d_ff=c["d_ff"], vocab_size=c.get("vocab_size", 257), seq_len=128)
    assert c["step_time_s"] == pytest.approx(model.predict(s, c["global_batch_size"]))
  rc, _, err = run_cli("plan", "--hours", 0.01, "--hardware", "cpux2", "--law", fit_json)
  assert rc == 2 and "1 device(s)" in err and "cpux2" in err
  rc, out, err = run_cli("plan", "--hours", 0.01, "--hardware", "cpu", "--law", law_file,
                         "--json")
  assert rc == 0 and "IsoTime" not in json.loads(out)["step_time_model"]


def test_fit_command_fits_an_isotime_table(tmp_path, law_file):
  table = write_table(tmp_path / "results.jsonl", make_rows("bytes") + [validation_row()])
  rc, _, err = run_cli("fit", table, "--out", tmp_path / "out", "--law", law_file,
                       "--no-figures", "--quiet")
  assert rc == 0, err
  fj = strict_json(tmp_path / "out" / "fit.json")
  assert fj["kind"] == "isotime" and fj["validation"]["run_id"] == "V-T120"
  assert all(b["flop_optimal"]["shape"]["n_layers"] == 2  # the ladder rule's fixed depth
             for b in fj["wider_vs_deeper"]["budgets"])
  isoflop = write_table(tmp_path / "flop.jsonl", [{"run_id": "a", "status": "done", "N": 1e5,
                                                   "D": 1e9, "final_eval_loss": 3.0}])
  rc, _, err = run_cli("fit", isoflop, "--law", law_file, "--quiet")
  assert rc == 2 and "--law" in err
