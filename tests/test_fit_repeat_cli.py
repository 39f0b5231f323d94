"""A published data-constrained table's shape fitted from the command line, as a new user would:
every run with its own unique set (no two repeated runs share a U, single-epoch runs read a
set at least as large as their D), as JSONL and as CSV, in real ``chinchax fit`` processes.

Truth is independent: the table is drawn from a known Muennighoff law (R_D* = 10, R_N* = 4,
0.3% noise in ln L); the fitted constants must land near it, and a CSV must give the JSONL's
numbers.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from chinchax.laws import parametric as laws
from chinchax.laws import repeat as lr
from analysis.io import load_results

BASE = laws.ParametricLaw(name="truth", E=1.8, A=400.0, B=1500.0, alpha=0.34, beta=0.30)
TRUTH = lr.MuennighoffLaw(BASE, 10.0, 4.0)
SMALL_GRID = "logA=4:8:3,logB=5:9:3,logE=0:1:2,alpha=0.2:0.5:2,beta=0.2:0.5:2"


def _crash_shape(seed: int = 0, n_repeated: int = 8):
  """(N, D, U, loss), shape (R,) each: 3 IsoFLOP budgets × 6 sizes of single-epoch runs, each
  with its own U drawn in [D, 3D]; ``n_repeated`` runs with their own U (log-uniform in
  [3e6, 1e8] tokens), 1.5-40 epochs and N in [1e6, 2e7]."""
  rng = np.random.default_rng(seed)
  rows = []
  for C in (1e15, 1e16, 1e17):
    n_opt, _ = BASE.optimal_allocation(C)
    for n in n_opt * np.geomspace(1 / 6, 2, 6):
      d = C / (6 * n)
      rows.append((n, d, d * rng.uniform(1.0, 3.0)))
  for _ in range(n_repeated):
    u = math.exp(rng.uniform(math.log(3e6), math.log(1e8)))
    ep = math.exp(rng.uniform(math.log(1.5), math.log(40)))
    rows.append((math.exp(rng.uniform(math.log(1e6), math.log(2e7))), ep * u, u))
  N, D, U = (np.array(c) for c in zip(*rows))
  return N, D, U, TRUTH.loss(N, D, U) * np.exp(0.003 * rng.standard_normal(len(N)))


def _write(tmp_path, kind: str) -> str:
  N, D, U, loss = _crash_shape()
  path = str(tmp_path / f"table.{kind}")
  with open(path, "w") as f:
    if kind == "csv":
      f.write("N,D,unique_tokens,loss\n")
      f.writelines(",".join(repr(float(c[i])) for c in (N, D, U, loss)) + "\n"
                   for i in range(len(N)))
    else:
      f.writelines(json.dumps({"run_id": f"r{i}", "N": N[i], "D": D[i], "unique_tokens": U[i],
                               "final_eval_loss": loss[i]}) + "\n" for i in range(len(N)))
  return path


def _chinchax(*argv) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "chinchax.cli", *map(str, argv)],
                        capture_output=True, text=True, timeout=900,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))


def test_csv_unique_tokens_column_is_read(tmp_path):
  """A CSV's unique-tokens column is the JSONL's ``unique_tokens`` (an empty cell: fresh data),
  under its usual names."""
  jsonl, csv = load_results(_write(tmp_path, "jsonl"), min_budgets=1), load_results(
      _write(tmp_path, "csv"), min_budgets=1)
  assert csv.unique_tokens is not None
  np.testing.assert_array_equal(csv.unique_tokens, jsonl.unique_tokens)
  (tmp_path / "u.csv").write_text("N,D,Unique Tokens,loss\n1e6,2e7,,3.1\n2e6,2e7,1e6,3.0\n")
  u = load_results(str(tmp_path / "u.csv"), min_budgets=1).unique_tokens
  assert math.isinf(u[0]) and u[1] == 1e6
  (tmp_path / "bad.csv").write_text("N,D,U,loss\n1e6,2e7,-5,3.1\n")
  with pytest.raises(Exception, match=r"bad.csv:2: column 'U' must be finite and > 0"):
    load_results(str(tmp_path / "bad.csv"), min_budgets=1)


def test_per_run_unique_sets_fit_from_the_command_line(tmp_path):
  """A CSV of the published shape, both procedures in real processes: the base fitted on the
  table and refitted jointly (the default without --law), and the papers' two-stage one in one
  command (``--repeat-base fixed``: the table's own Approach 3 fitted first, then held); every
  repeated run is its own leave-one-out fold."""
  table = _write(tmp_path, "csv")
  runs = {}
  for mode in ("joint", "fixed"):
    out = tmp_path / f"fit-{mode}"
    p = _chinchax("fit", table, *(["--repeat-base", mode] if mode == "fixed" else []),
                  "--approach", "3", "--grid", SMALL_GRID, "--bootstrap", "4", "--no-figures",
                  "--min-budgets", "1", "--out", out)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr and "error:" not in p.stderr
    assert "8 runs repeat data (D > unique_tokens): Approaches 1-3 fit the 18 runs" in p.stdout
    block = json.loads((out / "fit.json").read_text())["repeat"]
    assert block["status"] == "ok" and block["base_mode"] == mode
    assert block["input"]["n_repeated"] == 8 and len(block["input"]["unique_sizes"]) == 8
    m = block["muennighoff"]
    assert len(m["leave_one_unique_out"]["folds"]) == 8
    assert set(m["profile"]) >= {"R_D_star", "R_N_star"}
    runs[mode] = block
  # Refitted jointly, both constants are found. Held, the fitted law holds the table's own
  # Approach 3 (off the truth on 18 runs, which moves the constants: docs/fitting.md's
  # coverage table), and says so.
  joint, fixed = runs["joint"]["muennighoff"], runs["fixed"]["muennighoff"]
  assert joint["params"]["R_D_star"] == pytest.approx(10.0, rel=0.25)
  assert joint["params"]["R_N_star"] == pytest.approx(4.0, rel=0.25)
  assert joint["profile"]["R_D_star"]["identified"]
  assert "base held fixed (two-stage" in runs["fixed"]["base_text"]
  assert "Approach 3 (on the 18 runs of one epoch or less)" in runs["fixed"]["base_text"]
  assert fixed["base"] == pytest.approx({k: runs["fixed"]["base"][k] for k in fixed["base"]})
  # A base this table fitted is refitted on each bootstrap replicate's single-epoch runs, then
  # held: its own error widens the interval (a --law base stays, being given).
  assert "base refitted on the single-epoch runs, then held" in fixed["bootstrap"]["method"]
  assert joint["base"]["E"] != runs["joint"]["base"]["E"]


@pytest.mark.parametrize("law", [None, "base"])
def test_a_table_of_repeated_runs_only_is_one_error_line(tmp_path, law, capsys):
  """Every run repeats data: no run of one epoch or less for Approaches 1-3 (and the base)."""
  from chinchax import cli
  N, D, U, loss = _crash_shape()
  path = tmp_path / "rep.jsonl"
  path.write_text("".join(json.dumps({"run_id": f"r{i}", "N": N[i], "D": D[i],
                                      "unique_tokens": U[i], "final_eval_loss": loss[i]}) + "\n"
                          for i in range(18, len(N))))
  (tmp_path / "base.json").write_text(json.dumps(BASE.to_dict()))
  extra = ["--law", str(tmp_path / "base.json")] if law else []
  rc = cli.main(["fit", str(path), *extra, "--min-budgets", "1", "--out", str(tmp_path / "o")])
  err = capsys.readouterr().err.strip().splitlines()
  assert rc == 2 and len(err) == 1 and err[0].startswith("error:"), err
  assert "all 8 runs" in err[0] and "one epoch or less" in err[0]
  assert not (tmp_path / "o").exists()


def test_validation_run_carries_its_eval_standard_error():
  """The repetition laws' validation entry keeps the run's measured s.e. and fit.md shows it."""
  from analysis.repeat import report as rr
  law = lr.MuennighoffLaw(BASE, 10.0, 4.0)
  b = {k: getattr(BASE, k) for k in ("E", "A", "B", "alpha", "beta")}
  block = {"base": b, "muennighoff": {"params": law.params(), "base": b}}
  row = {"run_id": "val", "N": 2e6, "D": 4e8, "unique_tokens": 4e7,
         "final_eval_loss": 3.0, "final_eval_loss_se": 0.0012}
  v = rr.validation_from_block(block, row)
  assert v["measured_se"] == 0.0012
  assert v["predictions"]["muennighoff"]["predicted_loss"] == pytest.approx(
      float(law.loss(2e6, 4e8, 4e7)))
  assert rr.se_text(v) == " ± 0.0012 (s.e.)"
  assert rr.se_text(rr.validation_from_block(block, dict(row, final_eval_loss_se=None))) == ""


def test_a_base_without_units_is_taken_in_the_tables_with_a_warning(tmp_path, capsys):
  """A bare {E, A, B, alpha, beta} base against a table whose units are known: accepted (a
  published base is often given so), with one warning line naming the units assumed."""
  import argparse
  from chinchax.cli import fit as fit_cli
  N, D, U, loss = _crash_shape()
  path = tmp_path / "t.jsonl"
  path.write_text("".join(json.dumps({"run_id": f"r{i}", "N": N[i], "D": D[i],
                                      "unique_tokens": U[i], "final_eval_loss": loss[i],
                                      "recipe": {"tokenizer": {"kind": "bytes",
                                                               "vocab_size": 257}}}) + "\n"
                          for i in range(len(N))))
  (tmp_path / "bare.json").write_text(json.dumps({"E": 1.8, "A": 400.0, "B": 1500.0,
                                                  "alpha": 0.34, "beta": 0.30}))
  args = argparse.Namespace(results=str(path), law=str(tmp_path / "bare.json"), quiet=False)
  law = fit_cli._repeat_base(args)
  assert law.E == 1.8
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("warning:") and "records no loss units" in err[0]
  assert "bytes" in err[0], err
  args.quiet = True
  fit_cli._repeat_base(args)
  assert not capsys.readouterr().err
