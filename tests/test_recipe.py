"""A law carries its recipe and its units; plan follows the recipe and says where it departs."""

import json
import math
import re

import pytest

from chinchax import config as config_lib
from chinchax.cost import hparams as hparams_lib
from chinchax.laws import units as law_units
from chinchax.laws import parametric as laws
from chinchax.laws import recipe as recipe_lib
from chinchax.planning import shapes as shapes_lib
import chinchax.ladder.grid as grid
import chinchax.ladder.recipe as ladder_recipe
from analysis.isoflop import approach2
from analysis import pipeline
from analysis.isoflop import synthetic
from test_plan import plan_json, run_cli

BYTES = {"kind": "bytes", "vocab_size": 257, "sha256": "ab" * 32}


def _ladder():
  c = config_lib.get_ladder_variant("default")
  c.train_config.data.update(source="files", paths="corpus/*.txt")
  return c


def _run_recipe(c=None, **train):
  """The recipe a default-ladder run records (``chinchax.ladder.recipe``)."""
  c = c or _ladder()
  cfg = c.train_config.copy_and_resolve_references()
  cfg.train.update(**train)
  return recipe_lib.run_recipe(
      cfg, tokenizer=BYTES, fingerprint="cd" * 32,
      shape_family=ladder_recipe.shape_family(2, True),
      hparams=ladder_recipe.hparams_rule(c.ladder, c.train_config.train))


def test_combine_keeps_agreement_and_records_disagreement():
  a, b = _run_recipe(), _run_recipe(seq_len=128)
  same = recipe_lib.combine([a, a])
  assert same["complete"] and same["disagree"] == [] and same["seq_len"] == 64
  assert same["init"] == {"rule": "small", "init_std": None}
  assert same["hparams"]["rule"] == "deepseek" and same["hparams"]["min_steps"] == 20
  mixed = recipe_lib.combine([a, a, b])
  assert mixed["disagree"] == ["seq_len"]
  assert mixed["seq_len"] == {"disagree": [64, 128], "runs": [2, 1]}
  assert recipe_lib.agreed(mixed, "seq_len") is None
  partial = recipe_lib.combine([a, None])
  assert not partial["complete"] and partial["n_recorded"] == 1


def _table(tmp_path, recipes):
  """A results table of a known law, one recipe per row (None: an older row without one)."""
  law = laws.ParametricLaw("t", E=1.2, A=30.0, B=200.0, alpha=0.35, beta=0.35)
  runs = synthetic.synthetic_runs(law, [1e11, 3e11, 1e12, 3e12], n_sizes=5, span=3.0,
                                  noise=0.002)
  rows = []
  for i in range(len(runs.N)):
    row = {"run_id": f"r{i}", "status": "done", "C_budget": float(runs.budget[i]),
           "N": float(runs.N[i]), "D": float(runs.D[i]), "final_eval_loss": float(runs.loss[i]),
           "final_eval_bits_per_byte": float(runs.loss[i]) / math.log(2) / 1.0,
           "shape": {"seq_len": 64, "vocab_size": 257}, "hparams": {"rule": "deepseek"}}
    r = recipes[i % len(recipes)]
    if r is not None:
      row["recipe"] = r
    rows.append(row)
  tmp_path.mkdir(parents=True, exist_ok=True)
  path = tmp_path / "results.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


def _fit(tmp_path, recipes) -> dict:
  path = _table(tmp_path, recipes)
  pipeline.fit_results(path, tmp_path / "fit", approach="3", n_bootstrap=0, figures=False,
                       n_jobs=1, grid="alpha=0.2/0.5,beta=0.2/0.5,logE=0/0.5,logA=2/4,logB=4/6")
  return json.loads((tmp_path / "fit" / "fit.json").read_text())


def test_fit_json_records_the_recipe_and_units(tmp_path):
  d = _fit(tmp_path, [_run_recipe()])
  rec = d["recipe"]
  assert rec["complete"] and rec["n_runs"] == 20 and rec["source"] == "rows"
  assert rec["tokenizer"] == BYTES and rec["seq_len"] == 64
  assert rec["shape_family"]["name"] == "ladder" and rec["shape_family"]["n_heads"] == 2
  assert rec["schedule"] == {"kind": "cosine", "min_lr_ratio": 0.1}
  assert rec["optimizer"]["weight_decay"] == 0.1 and rec["n_kind"] == "total"
  assert d["units"]["tokenizer"] == "bytes" and d["units"]["vocab_size"] == 257
  assert d["units"]["bytes_per_token"] == pytest.approx(1.0)
  law = laws.get_law(str(tmp_path / "fit" / "fit.json"))
  assert law.units.same_tokenizer(law_units.LossUnits.from_dict(d["units"]))
  assert "## Recipe" in (tmp_path / "fit" / "fit.md").read_text()


def test_fit_json_says_where_runs_disagree_and_when_no_recipe(tmp_path):
  d = _fit(tmp_path / "a", [_run_recipe(), _run_recipe(peak_lr=1e-3, b1=0.8)])
  assert d["recipe"]["disagree"] == ["optimizer"]
  assert "disagree" in (tmp_path / "a" / "fit" / "fit.md").read_text()
  old = _fit(tmp_path / "b", [None])
  assert old["recipe"]["source"] == "older rows" and not old["recipe"]["complete"]
  assert old["recipe"]["seq_len"] == 64 and old["units"]["known"] is False


def _law_file(tmp_path, rec=None, units=None, E=0.5) -> str:
  d = {"E": E, "A": 20.0, "B": 150.0, "alpha": 0.35, "beta": 0.35}
  if rec is not None:
    d["recipe"] = recipe_lib.combine([rec])
  if units is not None:
    d["units"] = units
  path = tmp_path / "fit.json"
  path.write_text(json.dumps(d))
  return str(path)


def test_plan_follows_the_laws_recipe_like_the_ladders_validation_run(tmp_path):
  c = _ladder()
  law_path = _law_file(tmp_path, _run_recipe(c))
  C = 3 * c.ladder.c_max
  target = tmp_path / "planned.py"
  j = plan_json("--flops", C, "--law", law_path, "--write-config", target)
  # Independent truth: the run the ladder itself would train at C for the law's N*.
  law = laws.get_law(law_path)
  v = grid.make_run(c.ladder, c.train_config.train, C, law.optimal_allocation(C)[0], 257)
  assert (j["d_model"], j["n_layers"], j["n_heads"], j["d_ff"]) == (
      v.shape.d_model, v.shape.n_layers, v.shape.n_heads, v.shape.d_ff)
  assert j["seq_len"] == 64 and j["global_batch_size"] == v.hparams.global_batch_size
  assert j["peak_lr"] == pytest.approx(0.3118 * C ** -0.125)
  assert j["steps"] == v.hparams.steps and j["warmup_steps"] == v.hparams.warmup_steps
  assert j["recipe"]["departures"] == [] and not any("departs" in w for w in j["warnings"])
  assert j["predicted_loss"] == pytest.approx(law.loss(j["N"], j["D"]))
  cfg = _load(target)
  assert cfg.model.init == "small" and cfg.train.seq_len == 64 and cfg.train.b2 == 0.95
  assert cfg.train.eval_windows == 2048 and cfg.data.source == "files"
  assert cfg.train.peak_lr == pytest.approx(j["peak_lr"])


def _load(path):
  import importlib.util
  spec = importlib.util.spec_from_file_location("planned", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.get_config()


def test_departures_are_allowed_and_said(tmp_path):
  law_path = _law_file(tmp_path, _run_recipe())
  target = tmp_path / "p.py"
  rc, out, err = run_cli("--flops", 2.4e12, "--law", law_path, "--seq-len", 128,
                         "--set", "train.peak_lr=0.003", "--set", 'model.init="fixed"',
                         "--write-config", target)
  assert rc == 0, err
  dep = [line for line in out.splitlines() if "departs from the law's recipe" in line]
  assert dep and "--seq-len 128" in dep[0] and "train.peak_lr=0.003" in dep[0]
  assert "model.init='fixed'" in dep[0] and "no longer holds" in dep[0]
  cfg = _load(target)
  assert cfg.train.seq_len == 128 and cfg.train.peak_lr == 0.003 and cfg.model.init == "fixed"
  rc, out, err = run_cli("--flops", 2.4e12, "--law", law_path, "--set", "train.nope=1")
  assert rc == 2 and "train.nope is not a knob" in err


def test_an_old_fit_file_without_a_recipe_still_plans_and_warns(tmp_path):
  j = plan_json("--flops", 1e12, "--law", _law_file(tmp_path))
  assert j["recipe"] is None and j["seq_len"] == 2048  # chinchax's default
  assert any("records no recipe" in w for w in j["warnings"])
  assert j["loss_units"]["law"]["known"] is False


def test_published_laws_know_their_units():
  for law in laws.PUBLISHED_LAWS.values():
    assert law.units == law_units.MASSIVETEXT
    assert laws.law_from_dict(law.to_dict()).units == law_units.MASSIVETEXT
  assert "Chinchilla's MassiveText tokens" in law_units.MASSIVETEXT.describe()


def test_one_hour_on_cpu_prints_no_impossible_loss(monkeypatch, tmp_path):
  # The nominal CPU (no measured peak in this cache): an hour is too little compute for the
  # published law to give a loss possible in its own 32,000-token units.
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  rc, out, err = run_cli("--hours", 1, "--hardware", "cpu")
  assert rc == 0, err
  assert "law units      nats/token of Chinchilla's MassiveText tokens" in out
  assert "\n  predicted loss" not in out and "impossible" in out
  # No figure on a loss line or in the candidates' loss column exceeds ln(32000).
  for line in out.splitlines():
    if "loss" in line and "ln(" not in line:
      for x in re.findall(r"loss (\d+\.\d+)", line):
        assert float(x) <= math.log(32000), line
  j = plan_json("--hours", 1, "--hardware", "cpu")
  assert j["predicted_loss"] is None and j["loss_units"]["law_loss_impossible"]
  assert all(c["predicted_loss"] is None and c.get("law_loss") is None for c in j["candidates"])


def test_a_law_in_the_plans_tokens_predicts_but_never_above_ln_vocab(tmp_path):
  units = {"tokenizer": "bytes", "vocab_size": 257, "corpus": "stdlib", "bytes_per_token": 1.0}
  j = plan_json("--flops", 1e12, "--law", _law_file(tmp_path, units=units))
  assert j["predicted_loss"] is not None and j["loss_units"]["transfers"]
  rc, out, _ = run_cli("--flops", 1e12, "--law", _law_file(tmp_path, units=units))
  assert "bits/byte" in out and "law units      nats/token of" in out
  j = plan_json("--flops", 1e12, "--law", _law_file(tmp_path, units=units, E=6.0))
  assert j["predicted_loss"] is None and j["loss_units"]["law_loss_impossible"]
  assert "ln(257)" in j["loss_units"]["note"]
  # Another vocabulary: the law's loss does not transfer, it is kept in the law's units.
  j = plan_json("--flops", 1e12, "--law", _law_file(tmp_path, units=units), "--vocab-size", 1024)
  assert j["predicted_loss"] is None and not j["loss_units"]["transfers"]
  assert j["loss_units"]["law_loss"] is not None


def test_approach2_warning_says_how_many_budgets_it_concerns_and_how_many_were_fitted():
  law = laws.ParametricLaw("t", E=1.2, A=30.0, B=200.0, alpha=0.35, beta=0.35)
  runs = synthetic.synthetic_runs(law, [1e11, 1e12, 1e13], n_sizes=7, span=40.0)
  msgs = [m for m in approach2.fit_approach2(runs).warnings() if "sizes reach" in m]
  assert msgs and "budgets used" not in msgs[0]
  assert re.search(r"\(at 3 budgets: C = .*; the fit uses 3 budgets in all\)", msgs[0]), msgs[0]


def test_shape_family_round_trips_into_the_shape_rule():
  from chinchax.planning import recipe as plan_recipe
  rec = recipe_lib.combine([_run_recipe()])
  rule, tied = plan_recipe.shape_rule(rec)
  assert rule == shapes_lib.PRESETS["ladder"] and tied
  h, lr = plan_recipe.rule_hparams(rec, 20_000, 2.4e12, 64, 1)
  assert lr == pytest.approx(hparams_lib.DEEPSEEK_LR_COEF * 2.4e12 ** -0.125)


def test_a_tuned_ladder_records_each_points_lr_and_plan_applies_the_median(tmp_path):
  rows = [{"run_id": f"r{i}", "status": "done", "C_budget": 1e11, "N": 1e4 * (i + 1),
           "recipe": _run_recipe(), "best_peak_lr": 0.01 * m, "best_lr_mult": m}
          for i, m in enumerate((0.5, 2.0, 2.0))]
  path = tmp_path / "results.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  from analysis import recipe as analysis_recipe
  from chinchax.planning import recipe as plan_recipe
  rec = analysis_recipe.table_recipe(str(path))
  tuned = rec["hparams"]["tuned"]
  assert [p["peak_lr"] for p in tuned["points"]] == [0.005, 0.02, 0.02]
  assert tuned["median_lr_mult"] == 2.0
  h, lr = plan_recipe.rule_hparams(rec, 20_000, 2.4e12, 64, 1)
  assert lr == pytest.approx(2.0 * h.peak_lr)
  assert h.peak_lr == pytest.approx(0.3118 * 2.4e12 ** -0.125)
