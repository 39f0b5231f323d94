"""End-to-end tests of `chinchax fit` (chinchax.cli.fit, analysis.pipeline) on synthetic ladders."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from chinchax import errors
from chinchax.laws import parametric as laws
from analysis import pipeline
from analysis.isoflop import approach3
from chinchax import cli as chinchax_cli
from analysis.errors import ApproachUnsupported, FitOptionError, ResultsError
from analysis.io import write_results_jsonl
from analysis.isoflop.synthetic import synthetic_runs

TRUE = laws.ParametricLaw("true", E=1.8, A=480.0, B=2100.0, alpha=0.35, beta=0.37)
BUDGETS = np.geomspace(1e18, 1e21, 7)
FIGURES = ("isoflop", "frontier", "contours", "residuals")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def small_grid(monkeypatch):
  """Every 25th start of the 4500-point grid, to keep the CLI tests quick."""
  full = approach3.chinchilla_grid()
  monkeypatch.setattr(approach3, "chinchilla_grid", lambda: full[::25])


@pytest.fixture
def ladder(tmp_path):
  runs = synthetic_runs(TRUE, BUDGETS, n_sizes=9, noise=0.0005, curve_noise=0.0005, seed=5,
                        curve_points=25)
  path = tmp_path / "results.jsonl"
  write_results_jsonl(runs, str(path), failed=["c9_n9"])
  return path


@pytest.fixture
def final_csv(tmp_path):
  runs = synthetic_runs(TRUE, BUDGETS, n_sizes=7, noise=0.002, seed=6)
  path = tmp_path / "final.csv"
  with open(path, "w") as f:
    f.write("N,C,loss\n")
    for n, c, l in zip(runs.N, runs.C, runs.loss):
      f.write(f"{float(n)!r},{float(c)!r},{float(l)!r}\n")
  return path


def test_all_approaches_end_to_end(ladder, tmp_path, small_grid, capsys):
  out = tmp_path / "out"
  rc = chinchax_cli.main(["fit", str(ladder), "--approach", "all", "--out", str(out), "--bootstrap", "12",
                 "--seed", "1", "--jobs", "1"])
  assert rc == 0, capsys.readouterr().err
  for stem in FIGURES:
    png, svg = out / f"{stem}.png", out / f"{stem}.svg"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in svg.read_bytes()[:2000]
  data = json.loads((out / "fit.json").read_text())
  assert data["input"]["n_runs"] == 63 and data["input"]["n_failed"] == 1
  for key in ("1", "2", "3"):
    section = data[f"approach{key}"]
    assert section["status"] == "ok"
    assert abs(section["a"] - TRUE.a) < 0.02, key
    assert section["bootstrap"]["n_resamples"] == 12
    for name, (lo, hi) in section["ci"].items():
      assert lo is not None and lo <= hi, (key, name)
  # Parameter recovery within 5% is tested in test_analysis_fit.py; here the
  # numbers only have to reach the JSON (B is the least determined, as in Epoch's refit).
  for name in ("E", "A", "B", "alpha", "beta"):
    assert data[name] == pytest.approx(getattr(TRUE, name), rel=0.1)
  assert {"a", "b", "G"} <= set(data)
  rows = data["frontier"]
  assert rows and all("approach3" in r and "loss" in r["approach3"] for r in rows)
  assert set(data["published"]) == set(laws.PUBLISHED_LAWS)
  md = (out / "fit.md").read_text()
  assert "| Approach 1 |" in md and "| Approach 2 |" in md and "| alpha |" in md
  assert isinstance(laws.get_law(str(out / "fit.json")), laws.ParametricLaw)


def test_csv_all_skips_approach1_with_reason(final_csv, tmp_path, small_grid):
  out = tmp_path / "out"
  rc = chinchax_cli.main(["fit", str(final_csv), "--out", str(out), "--bootstrap", "0", "--jobs", "1", "--quiet"])
  assert rc == 0
  data = json.loads((out / "fit.json").read_text())
  assert data["approach1"]["status"] == "skipped"
  assert "eval-loss curve" in data["approach1"]["reason"]
  assert data["approach2"]["status"] == "ok" and data["approach3"]["status"] == "ok"
  assert "skipped" in (out / "fit.md").read_text()


def test_a_skipped_approach_is_said_once(final_csv, tmp_path, small_grid, capsys):
  rc = chinchax_cli.main(["fit", str(final_csv), "--out", str(tmp_path / "out"), "--bootstrap",
                          "0", "--jobs", "1"])
  assert rc == 0
  said = capsys.readouterr()
  lines = [l for l in (said.out + said.err).splitlines() if "approach 1: skipped" in l]
  assert len(lines) == 1, lines


def test_fit_results_returns_the_report_and_raises_user_errors(final_csv, tmp_path, small_grid,
                                                               capsys):
  out = tmp_path / "api"
  report = pipeline.fit_results(final_csv, out, n_bootstrap=0, n_jobs=1, figures=False)
  assert set(report.results) == {"2", "3"} and "eval-loss curve" in report.skipped["1"]
  assert json.loads((out / "fit.json").read_text())["approach3"]["status"] == "ok"
  assert capsys.readouterr().out == ""  # no log: silent
  with pytest.raises(ApproachUnsupported, match="^approach 1: .*eval-loss curve"):
    pipeline.fit_results(final_csv, tmp_path / "o", approach="1", figures=False)
  with pytest.raises(ResultsError, match="does not exist"):
    pipeline.fit_results(tmp_path / "missing.csv")
  with pytest.raises(FitOptionError, match="unknown law 'gpt5'"):
    pipeline.fit_results(final_csv, compare=["gpt5"])
  for cls in (ApproachUnsupported, ResultsError, FitOptionError):
    assert issubclass(cls, errors.UserError)
  assert not (tmp_path / "o").exists()


def test_explicit_unsupported_approach_is_an_error(final_csv, tmp_path, capsys):
  rc = chinchax_cli.main(["fit", str(final_csv), "--approach", "1", "--out", str(tmp_path / "o"), "--quiet"])
  assert rc == 2
  err = capsys.readouterr().err
  assert "approach 1" in err and "eval-loss curve" in err
  assert not (tmp_path / "o" / "fit.json").exists()


def test_bad_input_errors(tmp_path, capsys):
  p = tmp_path / "two.csv"
  p.write_text("N,C,loss\n1e8,1e18,3.0\n2e8,1e18,2.9\n1e8,1e19,2.7\n")
  assert chinchax_cli.main(["fit", str(p), "--out", str(tmp_path / "o")]) == 2
  assert "only 2 IsoFLOP budget(s)" in capsys.readouterr().err
  assert chinchax_cli.main(["fit", str(tmp_path / "missing.jsonl")]) == 2
  assert "does not exist" in capsys.readouterr().err
  assert chinchax_cli.main(["fit", str(p), "--compare", "gpt5"]) == 2
  err = capsys.readouterr().err
  assert "unknown law 'gpt5'" in err and "chinchilla-approach3" in err
  for flag, value in (("--jobs", "0"), ("--drop-highest-loss", "-1"), ("--bootstrap", "-2"),
                      ("--min-budgets", "0")):
    assert chinchax_cli.main(["fit", str(p), flag, value, "--out", str(tmp_path / "bad")]) == 2
    assert f"{flag} must be >= " in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_python_dash_m_entry_point(ladder, tmp_path):
  out = tmp_path / "m"
  proc = subprocess.run([sys.executable, "-m", "chinchax.cli", "fit", str(ladder), "--approach",
                         "2", "--out", str(out), "--bootstrap", "5", "--no-figures"],
                        cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert "approach 2: a = 0.51" in proc.stdout
  data = json.loads((out / "fit.json").read_text())
  assert data["approach2"]["status"] == "ok" and "approach3" not in data
  assert isinstance(laws.get_law(str(out / "fit.json")), laws.PowerLawAllocation)


def test_a_table_of_runs_with_different_tokenizers_is_refused_in_one_line(ladder, tmp_path,
                                                                           small_grid, capsys):
  rows = [json.loads(l) for l in open(ladder)]
  toks = [{"kind": "bytes", "vocab_size": 257, "sha256": "a" * 64},
          {"kind": "bpe", "vocab_size": 512, "sha256": "b" * 64}]
  for i, row in enumerate(rows):  # the first three runs used a BPE, the rest bytes
    row["recipe"] = {"tokenizer": toks[1] if i < 3 else toks[0], "seq_len": 128}
  mixed = tmp_path / "mixed.jsonl"
  mixed.write_text("".join(json.dumps(r) + "\n" for r in rows))
  out = tmp_path / "fit"
  assert chinchax_cli.main(["fit", str(mixed), "--out", str(out), "--bootstrap", "0",
                            "--no-figures"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("error: "), err
  n = sum(r["status"] == "done" for r in rows) - 3
  assert f"bpe (512 ids, sha256 bbbbbbbbbbbb…): 3 runs; bytes (257 ids, sha256 aaaaaaaaaaaa…): " \
         f"{n} runs" in err and "--mixed-tokenizers" in err, err
  assert not out.exists()  # nothing written
  # older rows without a recipe: told apart by their vocabulary
  for i, row in enumerate(rows):
    del row["recipe"]
    row["shape"] = {"vocab_size": 512 if i < 3 else 257}
  mixed.write_text("".join(json.dumps(r) + "\n" for r in rows))
  assert chinchax_cli.main(["fit", str(mixed), "--out", str(out), "--bootstrap", "0",
                            "--no-figures"]) == 2
  assert "a 512-id vocabulary: 3 runs; a 257-id vocabulary" in capsys.readouterr().err
  # fitted anyway with the flag, with one warning; the law's units are unknown
  assert chinchax_cli.main(["fit", str(mixed), "--out", str(out), "--bootstrap", "0",
                            "--no-figures", "--mixed-tokenizers"]) == 0
  err = capsys.readouterr().err
  assert "warning: fitting runs of 2 tokenizers together (--mixed-tokenizers)" in err
  # one tokenizer: no refusal
  for row in rows:
    row["shape"] = {"vocab_size": 257}
  mixed.write_text("".join(json.dumps(r) + "\n" for r in rows))
  assert chinchax_cli.main(["fit", str(mixed), "--out", str(tmp_path / "fit2"), "--bootstrap",
                            "0", "--no-figures"]) == 0
