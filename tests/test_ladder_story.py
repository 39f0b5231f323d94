"""The ladder's console: its header, its ETA (learned from recorded runs), its closing block, and a
finished ladder's rerun that prints the answer without training or fitting."""

import json
import math
import pathlib
import shutil
import types

from chinchax import ladder
from chinchax.ladder import answer, progress
from test_ladder import REPO, _ladder_config

GOLDEN_FIT = pathlib.Path(__file__).parent / "golden" / "old_fit.json"


def test_run_time_model_recovers_start_up_and_rate_and_skips_resumed_rows():
  rows = [{"status": "done", "C_budget": C, "wall_time_s": 4.0 + C / 2e9} for C in (1e9, 4e9, 8e9)]
  rows += [{"status": "done", "C_budget": 8e9, "wall_time_s": 1.0, "resumed": True},
           {"status": "failed", "C_budget": 8e9, "wall_time_s": 0.5}]
  m = progress.RunTimeModel.fit(rows)
  assert math.isclose(m.t0, 4.0, rel_tol=1e-6) and math.isclose(m.rate, 2e9, rel_tol=1e-6)
  one = progress.RunTimeModel.fit([{"status": "done", "C_budget": 2e9, "wall_time_s": 10.0}])
  assert one.t0 == 0.0 and one.seconds(4e9) == 20.0  # one budget: proportional
  assert progress.RunTimeModel.fit([]) is None


def _plan(budgets, done, **lc):
  ladder_cfg = types.SimpleNamespace(**{"fit": True, "validate": True, "bootstrap": 20,
                                        "validate_factor": 3.0, "c_max": max(budgets),
                                        "budget_kind": "flops", **lc})
  runs = [types.SimpleNamespace(run_id=f"r{i}", C_budget=C) for i, C in enumerate(budgets)]
  rows = {f"r{i}": {"status": "done", "C_budget": budgets[i], "wall_time_s": 2.0 + budgets[i] / 1e9}
          for i in done}
  return types.SimpleNamespace(runs=runs, config=types.SimpleNamespace(ladder=ladder_cfg)), rows


def test_eta_covers_the_runs_left_the_fit_and_the_validation_run():
  plan, rows = _plan([1e9, 2e9, 4e9, 4e9], done=[0, 1])
  parts = progress.remaining_seconds(plan, rows, workers=2)
  # runs left: two of 4e9 at 2 s + 4 s each, shared by 2 workers; validation: 12e9 alone, 2 cores
  assert math.isclose(parts["runs"], 6.0) and math.isclose(parts["validation"], 14.0 / 2)
  assert parts["fit"] == progress.fit_seconds(plan.config.ladder, 4) > 0
  text = progress.eta_text(parts)
  assert text.startswith(f"ETA {progress.duration(sum(parts.values()))} = runs 6s + fit ~")
  plan2, rows2 = _plan([1e9, 2e9], done=[0, 1], fit=False)
  assert progress.eta_text(progress.remaining_seconds(plan2, rows2)) == "ETA 0s"
  assert progress.remaining_seconds(plan2, {}) is None


def _allocation(d, C):
  """N_opt, D_opt of L = E + A/N^alpha + B/D^beta at C = 6ND, by a grid search (not eq. 4)."""
  N = [math.exp(x / 2000) for x in range(2000 * 4, 2000 * 16)]
  best = min(N, key=lambda n: d["A"] / n ** d["alpha"] + d["B"] / (C / 6 / n) ** d["beta"])
  return best, C / 6 / best


def test_closing_block_reads_the_fit(tmp_path):
  fit = tmp_path / "fit"
  fit.mkdir()
  data = json.loads(GOLDEN_FIT.read_text())
  data["validation"]["measured_se"] = 0.05
  (fit / "fit.json").write_text(json.dumps(data))
  (fit / "isoflop.png").write_bytes(b"")
  lines = answer.closing_lines(fit, 4e9)
  text = "\n".join(lines)
  assert all(len(line) <= 100 for line in lines if str(tmp_path) not in line), lines
  assert f"a = {data['a']:.3f}" in text and f"b = {data['b']:.3f}" in text
  lo, hi = data["approach3"]["ci"]["a"]
  assert f"[{lo:.3g}, {hi:.3g}]" in text
  n_opt, d_opt = _allocation(data, 4e9)
  shown = [l for l in lines if "the largest budget" in l][0]
  dn = float(shown.rsplit("D/N = ", 1)[1])
  assert abs(dn - d_opt / n_opt) / (d_opt / n_opt) < 0.01, (shown, d_opt / n_opt)
  v = data["validation"]
  z = abs(v["measured_loss"] - v["predicted_loss"]) / 0.05
  assert (f"predicted {v['predicted_loss']:.4f}, measured {v['measured_loss']:.4f} ± 0.0500 "
          f"({100 * v['rel_error']:+.2f}%, {z:.1f} s.e.)") in text
  assert f"next: chinchax plan --flops 4e+10 --law {fit / 'fit.json'}" in text
  assert "figures isoflop" in text
  assert answer.closing_lines(tmp_path / "none") == []


def test_closing_block_of_a_data_constrained_fit_shows_the_repetition_laws(tmp_path):
  fit = tmp_path / "fit"
  fit.mkdir()
  data = json.loads(GOLDEN_FIT.read_text())
  v = {"run_id": "VU200000_C5e+11_N40536", "epochs": 10.8, "unique_tokens": 194821.0,
       "measured_loss": 1.97, "measured_se": 0.015,
       "predictions": {"base (no repetition)": {"predicted_loss": 1.61, "rel_error": 0.2236},
                       "muennighoff": {"predicted_loss": 1.95, "rel_error": 0.0103},
                       "overfit": {"predicted_loss": 1.93, "rel_error": 0.0207}}}
  data["repeat"] = {"form": "overfit", "validation": [v]}
  (fit / "fit.json").write_text(json.dumps(data))
  lines = answer.closing_lines(fit, 4e9)
  assert all(len(line) <= 100 for line in lines if str(tmp_path) not in line), lines
  text = "\n".join(lines)
  assert "measured 1.9700 ± 0.0150, predicted by" in text, text
  assert ("additive 1.9300 (+2.1%), Muennighoff 1.9500 (+1.0%), no repetition 1.6100 (+22.4%)"
          in text), text
  assert text.endswith("--unique-tokens 1.95e+05")
  assert f"predicted {data['validation']['predicted_loss']:.4f}" not in text  # not the base's alone


def test_a_finished_ladder_rerun_prints_its_answer_and_trains_nothing(tmp_path, small_corpus,
                                                                       store_root, capsys):
  c = _ladder_config(tmp_path, small_corpus, store_root)
  c.ladder.update(c_min=3e8, c_max=6e8, n_budgets=2, workers=1)
  plan = ladder.prepare(c)
  for r in plan.runs:
    plan.table.upsert({"run_id": r.run_id, "status": "done", "C_budget": r.C_budget,
                       "N": r.counts.total, "final_eval_loss": 3.0, "wall_time_s": 1.0})
  table = plan.workdir / "results.jsonl"
  (plan.workdir / "fit").mkdir()
  shutil.copy(GOLDEN_FIT, plan.workdir / "fit" / "fit.json")
  assert ladder.claim_fit(table)
  plan.table.upsert({"run_id": "Vx", "role": "validation", "status": "done", "C_budget": 1.8e9})
  ladder.settle_fit_claim(table, done=True)
  from chinchax import cli
  args = [f"--config={REPO}/configs/ladder.py:tiny", f"--config.workdir={c.workdir}",
          "--config.ladder.n_budgets=2", "--config.ladder.workers=1",
          f"--config.train_config.data.paths={small_corpus}/*.txt",
          "--config.train_config.data.source=files", f"--config.train_config.data.store_root={store_root}",
          "--config.train_config.data.val_fraction=0.1"]
  for k in ("c_min", "c_max", "spread", "bootstrap"):
    args.append(f"--config.ladder.{k}={c.ladder[k]}")
  assert cli.main(["ladder", *args]) == 0
  out = capsys.readouterr().out
  assert f"ladder  done before: {len(plan.runs)} runs" in out
  assert "ladder  answer of" in out and "next: chinchax plan --flops 6e+09" in out
  assert not (plan.workdir / "runs").exists()  # nothing trained
  assert not (plan.workdir / "fit" / "fit.log").exists()  # nothing fitted


def test_a_planned_config_carries_its_prediction_to_train(tmp_path):
  import subprocess
  import sys
  from chinchax.cli import flags, train
  path = tmp_path / "planned.py"
  subprocess.run([sys.executable, "-m", "chinchax.cli", "plan", "--flops", "2e10", "--law",
                  str(GOLDEN_FIT), "--write-config", str(path)], check=True, capture_output=True)
  planned = flags.planned_of(["--config", str(path)])
  from chinchax.laws import parametric as laws
  law = laws.law_from_dict(json.loads(GOLDEN_FIT.read_text()))
  assert math.isclose(planned["predicted_loss"], law.loss(planned["N"], planned["D"]), rel_tol=1e-5)
  line = train.plan_line(planned, {"final_eval_loss": 2.0, "final_eval_loss_se": 0.01}, [])
  rel = 100 * (2.0 - planned["predicted_loss"]) / planned["predicted_loss"]
  assert line == (f"plan    predicted {planned['predicted_loss']:.4f} (law old_fit), measured "
                  f"2.0000 ± 0.0100 nats/token ({rel:+.2f}%)")
  assert flags.planned_of([f"--config={REPO}/configs/train.py:tiny"]) is None
