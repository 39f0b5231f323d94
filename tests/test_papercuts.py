"""Small things a first user meets: integer knobs in float form, a relative glob that matches
nothing, progress that a log file can read, a tiny run that shows it, and no `eval=nan`."""

import io
import pathlib

import pytest

from chinchax import cli
from chinchax import console
from chinchax.cli import flags as flags_lib

REPO = pathlib.Path(__file__).resolve().parent.parent
TRAIN = flags_lib.config_file("train.py")


@pytest.mark.parametrize("value, expected", [("1e6", 1_000_000), ("1_000_000", 1_000_000),
                                             ("2.0e3", 2000), ("1_000_000.0", 1_000_000)])
def test_integer_knobs_take_integral_numbers_in_any_form(value, expected):
  config = flags_lib.parse_config([f"--config.budget.tokens={value}"], TRAIN, "train")
  assert config.budget.tokens == expected and type(config.budget.tokens) is int


@pytest.mark.parametrize("value", ["2.5", "inf", "1e-3"])
def test_an_integer_knob_given_a_fraction_is_one_error_line(capsys, value):
  assert cli.main(["train", f"--config.budget.tokens={value}"]) == 2
  err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
  assert len(err) == 1 and f"budget.tokens={value} is not a whole number" in err[0], err


def test_a_relative_glob_that_matches_nothing_names_the_directory(capsys, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  rc = cli.main(["train", f"--config={REPO}/configs/train.py:tiny", "--config.data.source=files",
                 "--config.data.paths=corpus/*.txt", f"--config.workdir={tmp_path}/run",
                 "--config.mesh.num_cpu_devices=0"])
  err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
  assert rc == 2 and len(err) == 1 and "matches no file" in err[0], err
  assert f"relative to the current directory {tmp_path}" in err[0], err


def test_progress_off_a_terminal_is_whole_lines():
  out = io.StringIO()
  bar = console.progress(total=40, unit="step", stream=out)
  assert isinstance(bar, console.LineProgress)
  bar.period_s = 0.0
  for i in range(4):
    bar.set_postfix(loss=f"{3 - i:.3f}", refresh=False)
    bar.update(10)
  bar.close()
  lines = out.getvalue().splitlines()
  assert "\r" not in out.getvalue() and len(lines) == 4, out.getvalue()
  assert lines[0].startswith("10/40 step (25%)") and "ETA" in lines[0] and "loss=3.000" in lines[0]
  assert lines[-1].startswith("40/40 step (100%)") and "ETA" not in lines[-1]


def test_tiny_run_shows_progress_without_eval_nan(capsys, tmp_path, monkeypatch):
  monkeypatch.setattr(console, "LINE_PERIOD_S", 0.0)  # a line at every logged step
  rc = cli.main(["train", f"--config={REPO}/configs/train.py:tiny",
                 f"--config.workdir={tmp_path}/run", "--config.mesh.num_cpu_devices=0",
                 "--config.train.eval_every=10"])
  out = capsys.readouterr().out
  assert rc == 0
  bars = [l for l in out.splitlines() if "/20 step (" in l]
  assert bars and bars[-1].startswith("20/20 step (100%)"), out
  assert "nan" not in out and "\r" not in out, out
  assert any("loss=" in l and "eval=" not in l for l in bars), bars  # before the first eval
  assert "eval=" in bars[-1]


def test_plan_write_config_never_replaces_a_file_unasked(capsys, tmp_path):
  target = tmp_path / "planned.py"
  target.write_text("# mine\n")
  assert cli.main(["plan", "--flops", "1e13", "--write-config", str(target)]) == 2
  out, err = capsys.readouterr()
  err = [l for l in err.splitlines() if l.strip()]
  assert out == "" and len(err) == 1 and "exists; pass --overwrite" in err[0], err
  assert target.read_text() == "# mine\n"
  assert cli.main(["plan", "--flops", "1e13", "--write-config", str(target), "--overwrite"]) == 0
  assert "def get_config" in target.read_text()


@pytest.mark.parametrize("seconds, shown", [(36.0, "36 s"), (754.0, "12.6 min"),
                                            (3 * 3600.0, "3 h"), (48 * 3600.0, "2 days")])
def test_plan_wall_time_in_the_unit_that_reads_best(seconds, shown):
  from chinchax.planning import render
  assert render.duration(seconds) == shown


def test_plan_prints_a_short_wall_time_in_seconds(capsys):
  assert cli.main(["plan", "--hours", "0.01", "--hardware", "cpu"]) == 0
  (line,) = [l for l in capsys.readouterr().out.splitlines() if "wall time" in l]
  assert line.split()[-2:] == ["36", "s"] and "hours" not in line, line


def test_fit_with_a_window_too_narrow_says_so_in_one_short_clause(capsys, tmp_path):
  """Each budget's lowest loss at its largest size: --window 1 leaves 2 sizes per parabola."""
  table = tmp_path / "final.csv"
  rows = ["N,C,loss"] + [f"{n:.6g},{c:.6g},{3.0 - 0.1 * i - 0.01 * j:.4f}"
                         for j, c in enumerate((1e18, 1e19, 1e20))
                         for i, n in enumerate((1e7, 2e7, 4e7, 8e7, 1.6e8))]
  table.write_text("\n".join(rows) + "\n")
  rc = cli.main(["fit", str(table), "--approach", "2", "--window", "1", "--bootstrap", "0",
                 "--out", str(tmp_path / "fit")])
  err = [l for l in capsys.readouterr().err.splitlines() if l.startswith("error:")]
  assert rc == 2 and len(err) == 1, err
  assert err[0].count("C=") == 1 and "1e+18, 1e+19, 1e+20" in err[0], err[0]
  assert "a wider --window" in err[0] and len(err[0]) < 300, (len(err[0]), err[0])
