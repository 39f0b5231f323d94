"""`chinchax plan`: published numbers, time and dollar budgets, hardware, bad input, configs."""

import contextlib
import importlib.util
import io
import json
import math

import pytest

from chinchax.cost import budget
from chinchax import config as config_lib
from chinchax.cost import hardware as hw
from chinchax.planning import allocate
from chinchax.planning import measure
from chinchax import cli
from chinchax.planning import config_file
from chinchax.planning import planner
from chinchax.planning import render
from chinchax.planning import shapes
from chinchax.cost import step_time
from chinchax.cost import work
from chinchax.planning.errors import PlanError
from chinchax.cost.work import StepTimeError


def run_cli(*argv):
  """(exit code, stdout, stderr) of ``chinchax plan ARGV``."""
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    rc = cli.main(["plan", *[str(a) for a in argv]])
  return rc, out.getvalue(), err.getvalue()


def plan_json(*argv):
  rc, out, err = run_cli(*argv, "--json")
  assert rc == 0, err
  return json.loads(out)


# ---------------------------------------------------------------- acceptance 3

# Chinchilla (Hoffmann et al. 2022) Table 3, Approach 1: (params, FLOPs, tokens).
TABLE_3 = [(400e6, 1.92e19, 8.0e9), (1e9, 1.21e20, 20.2e9), (10e9, 1.23e22, 205.1e9),
           (67e9, 5.76e23, 1.5e12)]


@pytest.mark.parametrize("n,c,d", TABLE_3, ids=["400M", "1B", "10B", "67B"])
def test_table3_tokens_with_approach1(n, c, d):
  j = plan_json("--flops", c, "--law", "chinchilla-approach1", "--vocab-size", 32000,
                "--seq-len", 2048)
  assert j["D"] == pytest.approx(d, rel=0.05)
  assert j["N"] == pytest.approx(n, rel=0.05)
  assert j["C"] == pytest.approx(c, rel=0.01)  # the budget is spent, in whole steps
  assert j["predicted_loss"] is None  # Approach 1 predicts no loss


def test_epoch_law_at_gopher_budget_matches_closed_form():
  """Epoch refit (Besiroglu et al. 2024) at C = 5.76e23 against an independent computation."""
  E, A, B, alpha, beta = 1.817, 482.01, 2085.43, 0.348, 0.366
  C = 5.76e23
  G = (alpha * A / (beta * B)) ** (1 / (alpha + beta))
  n_opt = G * (C / 6) ** (beta / (alpha + beta))
  d_opt = (C / 6) ** (alpha / (alpha + beta)) / G
  j = plan_json("--flops", C, "--law", "epoch", "--vocab-size", 32000, "--seq-len", 2048)
  assert j["N_opt"] == pytest.approx(n_opt, rel=1e-9)
  assert j["D_opt"] == pytest.approx(d_opt, rel=1e-9)
  assert j["N"] == pytest.approx(n_opt, rel=0.02)
  assert j["D"] == pytest.approx(C / (6 * j["N"]), rel=0.01)
  N, D = j["N"], j["D"]
  # The law's loss is per token of Chinchilla's MassiveText SentencePiece, not the plan's tokens.
  assert j["predicted_loss"] is None and not j["loss_units"]["transfers"]
  assert j["loss_units"]["law_loss"] == pytest.approx(E + A / N ** alpha + B / D ** beta,
                                                      rel=1e-9)
  assert any("above" in w for w in j["warnings"])  # 5.76e23 is 44× above the fit range


def test_json_keys_and_flop_counts():
  j = plan_json("--flops", 1e19, "--law", "chinchilla-approach3")
  for key in ("N", "D", "C", "N_opt", "D_opt", "tokens_per_param", "predicted_loss", "d_model",
              "n_layers", "n_heads", "d_ff", "seq_len", "global_batch_size", "steps", "peak_lr",
              "warmup_steps", "candidates", "flops"):
    assert key in j
  assert j["D"] == j["steps"] * j["global_batch_size"] * j["seq_len"]
  s = budget.ModelShape(d_model=j["d_model"], n_layers=j["n_layers"], n_heads=j["n_heads"],
                        d_ff=j["d_ff"], vocab_size=j["vocab_size"], seq_len=j["seq_len"])
  assert budget.param_counts(s).total == j["N"]
  assert j["flops"]["matmul_mfu"] == pytest.approx(budget.matmul_flops_per_token(s) * j["D"])
  assert len(j["candidates"]) == 5
  assert j["seq_len"] == 2048 and j["d_model"] % 128 == 0


def test_table_output_is_readable():
  rc, out, _ = run_cli("--flops", 1e20)
  assert rc == 0
  for word in ("law", "shape", "d_model", "global_batch_size", "predicted loss", "candidates"):
    assert word in out


# ---------------------------------------------------------------- hardware specs


@pytest.mark.parametrize("spec,name,n", [("v5p-128", "v5p", 64), ("v4-8", "v4", 4),
                                         ("v5e-16", "v5e", 16), ("v6e-8", "v6e", 8),
                                         ("h100x8", "h100", 8), ("8xh100", "h100", 8),
                                         ("H200", "h200", 1), ("a100-80gbx4", "a100-80gb", 4),
                                         ("a100x2", "a100-40gb", 2), ("cpu", "cpu", 1)])
def test_parse_hardware(spec, name, n):
  h = hw.parse_hardware(spec)
  assert (h.accelerator.name, h.n_devices) == (name, n)


@pytest.mark.parametrize("spec,match", [("tpu9000", "known accelerators: a100-40gb"),
                                        ("h100x0", "at least 1"), ("v5p-3", "even"),
                                        ("", "empty")])
def test_parse_hardware_errors(spec, match):
  with pytest.raises(hw.HardwareError, match=match):
    hw.parse_hardware(spec)


def test_price_table_has_every_accelerator_with_date_and_source():
  table = hw.load_accelerators()
  for name in ("v4", "v5e", "v5p", "v6e", "a100-40gb", "a100-80gb", "h100", "h200"):
    a = table[name]
    assert a.price_per_device_hour > 0 and a.price_date and a.price_source
    assert a.peak_flops > 1e14 and a.hbm_bandwidth > 5e11 and a.memory_bytes > 1e10
  assert table["h100"].peak_flops == 989e12 and table["h200"].peak_flops == 989e12


# ---------------------------------------------------------------- step-time models


def _shape(d, L, V=257, S=128):
  return shapes.shape_for(d, L, vocab_size=V, seq_len=S, accelerator=False)


def test_roofline_is_memory_or_compute_bound():
  h = hw.parse_hardware("h100")
  model = step_time.RooflineStepTime(h)
  prof = work.ExecutionProfile.for_kind("gpu")
  tiny, gbs = _shape(64, 2), 8
  t_bytes = work.bytes_per_step(tiny, gbs, profile=prof) / (
      3350e9 * step_time.DEFAULT_BANDWIDTH_EFFICIENCY)
  assert model.predict(tiny, gbs) == pytest.approx(t_bytes)  # a tiny model is bandwidth-bound
  big = shapes.shape_for(4096, 32, vocab_size=32000, seq_len=2048, accelerator=True)
  t_flops = work.step_flops(big, 64, profile=prof) / (989e12 * step_time.DEFAULT_MFU)
  assert model.predict(big, 64) == pytest.approx(t_flops)  # a 7B model is compute-bound


def test_bytes_per_step_hand_count():
  s = budget.ModelShape(d_model=8, n_layers=1, n_heads=2, d_ff=16, vocab_size=10, seq_len=4)
  p = budget.param_counts(s).total
  prof = work.ExecutionProfile(activation_bytes=4, materialized_attention=True)
  per_token = 2 * 4 * (4 * 8 + 4 * 8 + 3 * 16 + 2 * 4) + 16 * 10
  assert work.bytes_per_step(s, 3, profile=prof) == 40 * p + 12 * per_token


def _synthetic_rows():
  """Step times of a known machine: 2 ms + FLOPs / 2e10 + bytes / 5e9."""
  prof = work.ExecutionProfile.for_kind("cpu")
  rows = []
  for d, L, gbs in [(32, 2, 8), (64, 2, 8), (64, 4, 16), (96, 3, 8), (128, 2, 16), (128, 6, 8),
                    (160, 3, 8), (192, 4, 16), (48, 3, 32), (256, 2, 8)]:
    s = _shape(d, L)
    t = 2e-3 + work.step_flops(s, gbs, profile=prof) / 2e10 + work.bytes_per_step(
        s, gbs, profile=prof) / 5e9
    rows.append({"d_model": s.d_model, "n_layers": s.n_layers, "n_heads": s.n_heads,
                 "d_ff": s.d_ff, "vocab_size": 257, "seq_len": 128, "global_batch_size": gbs,
                 "tie_embeddings": True, "step_time_s": t})
  return rows


def _step_time_file(tmp_path, rows):
  """(path, loaded model) of a step-time file holding ``rows``."""
  path = tmp_path / "steps.json"
  step_time.write_step_time_file(path, rows, hardware="cpu")
  return path, step_time.load_step_time_model(path)


def test_step_time_file_roundtrip_and_fit(tmp_path):
  rows = _synthetic_rows()
  path, model = _step_time_file(tmp_path, rows)
  fit = model.fallback
  assert fit.intercept_s == pytest.approx(2e-3, rel=1e-3)
  assert fit.s_per_flop == pytest.approx(1 / 2e10, rel=1e-3)
  assert fit.s_per_byte == pytest.approx(1 / 5e9, rel=1e-3)
  # A measured shape returns its measurement; an unmeasured one the fit.
  r = rows[3]
  s, gbs, t = step_time.measurement_shape(r)
  assert model.predict(s, gbs) == t
  other = _shape(112, 5)
  assert model.predict(other, 8) == pytest.approx(fit.predict(other, 8))


def test_heldout_errors_flops_only_vs_memory_traffic():
  errs = step_time.heldout_errors(_synthetic_rows(), [1, 4, 8],
                           profile=work.ExecutionProfile.for_kind("cpu"))
  assert errs["flops_and_bytes"]["mean_abs_error"] < 1e-3
  assert errs["flops_only"]["mean_abs_error"] > 10 * errs["flops_and_bytes"]["mean_abs_error"]


EMPTY_STEP_FILE = '{"format": "chinchax.cost.step_time/1", "measurements": []}'


@pytest.mark.parametrize("content,match", [("{", "not valid JSON|cannot be read"),
                                           ('{"format": "other"}', "format"),
                                           (EMPTY_STEP_FILE, "at least 3")])
def test_bad_step_time_file(tmp_path, content, match):
  p = tmp_path / "bad.json"
  p.write_text(content)
  with pytest.raises(StepTimeError, match=match):
    step_time.load_step_time_model(p)


# ---------------------------------------------------------------- dollar budgets


def test_dollar_budget():
  j = plan_json("--dollars", 5000, "--hardware", "h100x8")
  price = hw.parse_hardware("h100x8").price_per_hour
  assert j["budget"]["hours"] == pytest.approx(5000 / price)
  assert j["dollars"] <= 5000 + 1e-6
  assert j["tokens_per_dollar"] == pytest.approx(j["D"] / j["dollars"])
  curve = j["dollar_curve"]
  assert [p["dollars"] for p in curve] == [1250, 2500, 5000, 10000, 20000]
  losses = [p["law_loss"] for p in curve]  # in the law's (MassiveText) units: bytes differ
  assert all(p["predicted_loss"] is None for p in curve)
  assert all(a > b for a, b in zip(losses, losses[1:]))  # more dollars, lower loss
  assert curve[2]["D"] == j["D"]


# ---------------------------------------------------------------- bad input (acceptance 6)


def _law_file(tmp_path, payload):
  p = tmp_path / "law.json"
  p.write_text(json.dumps(payload))
  return p


@pytest.mark.parametrize("argv,match", [
    (["--flops", "0"], "--flops must be a positive"),
    (["--flops", "-1e20"], "--flops must be a positive"),
    (["--hours", "-2", "--hardware", "h100"], "--hours must be a positive"),
    (["--dollars", "0", "--hardware", "h100"], "--dollars must be a positive"),
    (["--flops", "nan"], "--flops must be a positive"),
    (["--hours", "5", "--hardware", "tpu9000"], "unknown hardware 'tpu9000'.*known accelerators"),
    (["--hours", "5"], "need --hardware"),
    (["--dollars", "100", "--hardware", "cpu"], "no price"),
    (["--flops", "1e20", "--law", "no-such-law"],  # one clause, naming the law once
     "^error: unknown law 'no-such-law': .*valid names: chinchilla-approach1"),
    (["--flops", "1e20", "--law", "/nonexistent/fit.json"],
     "^error: unknown law '/nonexistent/fit.json': not a published law nor an existing file"),
])
def test_bad_input_one_clear_error(tmp_path, argv, match):
  target = tmp_path / "planned.py"
  rc, out, err = run_cli(*argv, "--write-config", target)
  assert rc == 2
  assert out == ""
  lines = [l for l in err.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: ")
  assert __import__("re").search(match, lines[0]), lines[0]
  assert not target.exists()


def test_law_file_missing_parameters(tmp_path):
  path = _law_file(tmp_path, {"E": 1.8, "A": 400.0, "B": 400.0, "alpha": 0.34})  # no beta
  target = tmp_path / "planned.py"
  rc, out, err = run_cli("--flops", 1e20, "--law", path, "--write-config", target)
  assert rc == 2 and out == "" and not target.exists()
  assert "cannot use law" in err and "beta" in err


def test_law_file_is_used(tmp_path):
  path = _law_file(tmp_path, {"E": 1.8, "A": 400.0, "B": 400.0, "alpha": 0.3, "beta": 0.3,
                              "fit_range_flops": [1e18, 1e21]})
  j = plan_json("--flops", 1e20, "--law", path)
  # alpha = beta and A = B: the frontier has N* = D* = sqrt(C / 6).
  assert j["N_opt"] == pytest.approx(math.sqrt(1e20 / 6), rel=1e-9)
  assert [w for w in j["warnings"] if "records no recipe" not in w] == []


def test_two_budgets_at_once(tmp_path):
  target = tmp_path / "planned.py"
  rc, out, err = run_cli("--flops", 1e20, "--hours", 3, "--hardware", "h100",
                         "--write-config", target)
  assert rc == 2 and out == "" and not target.exists()
  assert "not allowed with argument" in err


def test_no_budget():
  rc, _, err = run_cli("--law", "epoch")
  assert rc == 2 and "one of the arguments --flops --hours --dollars is required" in err


# ---------------------------------------------------------------- written config


def _load_config(path):
  spec = importlib.util.spec_from_file_location("planned_config", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.get_config(), mod.get_config(variant=None)


@pytest.mark.parametrize("argv", [["--flops", 3e11, "--hardware", "cpu"],
                                  ["--flops", 1e21],
                                  ["--hours", 0.1, "--hardware", "cpu"],
                                  ["--dollars", 300, "--hardware", "v5e-8"]])
def test_written_config_validates_and_matches_plan(tmp_path, argv):
  target = tmp_path / "planned.py"
  j = plan_json(*argv, "--write-config", target, "--workdir", tmp_path / "run")
  cfg, cfg2 = _load_config(target)
  assert cfg.to_dict() == cfg2.to_dict()
  config_lib.validate(cfg, n_devices=1)
  m, t, b = cfg.model, cfg.train, cfg.budget
  shape = budget.ModelShape(d_model=m.d_model, n_layers=m.n_layers, n_heads=m.n_heads,
                            d_ff=m.d_ff, vocab_size=m.vocab_size, seq_len=t.seq_len,
                            tie_embeddings=m.tie_embeddings)
  assert budget.param_counts(shape).total == j["N"]
  assert (b.mode, b.tokens, b.n_kind) == ("tokens", j["D"], "total")
  assert (t.global_batch_size, t.seq_len) == (j["global_batch_size"], j["seq_len"])
  assert t.peak_lr == j["peak_lr"] and t.warmup_steps == j["warmup_steps"]
  assert cfg.workdir == str(tmp_path / "run")
  # The trainer's own budget arithmetic sees exactly the plan's steps and D.
  from chinchax import train as train_lib
  spec = train_lib.resolve(cfg, n_devices=1)
  assert (spec.steps, spec.tokens, spec.n_params) == (j["steps"], j["D"], j["N"])
  if "cpu" in argv:  # CPU plans train on the devices they were timed on
    assert cfg.mesh.num_cpu_devices == j["hardware"]["n_devices"]


@pytest.mark.parametrize("make", [
    lambda: planner.plan_flops(3e11, hardware=hw.parse_hardware("cpu")),
    lambda: planner.plan_flops(1e21),
    lambda: planner.plan_time(360.0, hw.parse_hardware("cpux2")),
    lambda: planner.plan_dollars(300, hw.parse_hardware("v5e-8"))])
def test_validated_config_is_the_written_one(tmp_path, make):
  # write_config validates the ConfigDict it builds; the file it writes must return the same.
  plan = make()
  workdir = str(tmp_path / "run")
  path = config_file.write_config(plan, tmp_path / "planned.py", workdir)
  cfg, _ = _load_config(path)
  assert config_file.planned_config(plan, workdir).to_dict() == cfg.to_dict()
  assert path.read_text() == config_file.config_source(plan, workdir)
