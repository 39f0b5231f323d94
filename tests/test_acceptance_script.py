"""benchmarks/ladder_acceptance.py: the split of the runs' own time, against hand sums."""

import importlib.util
import json
import pathlib

import pytest

_PATH = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "ladder_acceptance.py"


@pytest.fixture(scope="module")
def acceptance():
  spec = importlib.util.spec_from_file_location("ladder_acceptance", _PATH)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _summary(root, name, text):
  d = root / "runs" / name
  d.mkdir(parents=True)
  (d / "summary.json").write_text(text if isinstance(text, str) else json.dumps(text))


def test_run_time_split_sums_uninterrupted_runs_and_counts_the_rest_left_out(tmp_path, acceptance):
  _summary(tmp_path, "a", {"wall_s": 10.0, "step_time_s": 0.01, "steps": 501, "compile_s": 2.0})
  _summary(tmp_path, "b", {"wall_s": 5.0, "step_time_s": 0.02, "steps": 300, "compile_s": 1.0,
                           "init_step": 200})                  # a cooldown off a trunk: 100 steps
  _summary(tmp_path, "resumed", {"wall_s": 4.0, "step_time_s": 0.01, "steps": 900,
                                 "compile_s": 1.0, "resumed": True})
  _summary(tmp_path, "truncated", '{"wall_s": 3.0, "step_ti')
  _summary(tmp_path, "list", [1, 2])
  _summary(tmp_path, "nan", {"wall_s": 1.0, "step_time_s": float("nan"), "steps": 1,
                             "compile_s": 0.5})
  _summary(tmp_path, "no-fields", {"wall_s": 1.0})
  t = acceptance.run_time_split(tmp_path)
  assert t["runs"] == 2 and t["skipped"] == 5
  assert t["wall_s"] == pytest.approx(15.0)
  assert t["step_s"] == pytest.approx(0.01 * 500 + 0.02 * 99)
  assert t["compile_s"] == pytest.approx(3.0)
  assert t["other_s"] == pytest.approx(15.0 - 6.98 - 3.0)
  assert acceptance.run_time_split(tmp_path / "nowhere") is None
