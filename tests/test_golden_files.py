"""Files written by an earlier chinchax still load: a run directory and a fitted law, checked in.

``tests/golden/old_run`` is a `tiny` run (20 steps, checkpoints at 10 and 20) trained on
``tests/golden/corpus``; ``tests/golden/old_fit.json`` is the fit of a `tiny` ladder. Both were
written before the package layout moved modules into packages; none of them may name a module
path (they are JSON and orbax arrays), so they must resume, export, sample and plan unchanged.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import pytest

from chinchax.data import sources

REPO = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden"
TRAIN_ARGS = ["--config", "configs/train.py:tiny", "--config.data.source=files",
              "--config.data.paths=tests/golden/corpus/*.txt", "--config.mesh.num_cpu_devices=0",
              "--config.data.val_fraction=0.25"]


def _chinchax(*args, cwd=REPO):
  # One CPU device, as the golden run was trained (the suite's 8 virtual devices would reduce
  # in another order).
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  return subprocess.run([sys.executable, "-m", "chinchax.cli", *args], cwd=cwd, capture_output=True,
                        text=True, timeout=600, env=env)


@pytest.fixture
def old_run(tmp_path):
  """A copy of the old run whose recorded corpus fingerprint is that of the same files in this
  checkout: a corpus's documents are named by their absolute paths, and the golden run was
  trained in another directory (same bytes, other names)."""
  run = tmp_path / "old_run"
  shutil.copytree(GOLDEN / "old_run", run)
  config = json.loads((run / "config.json").read_text())
  source = sources.FileSource(str(REPO / "tests" / "golden" / "corpus" / "*.txt"))
  assert [f.read_bytes() for f in source.files] == [
      f.read_bytes() for f in sorted((GOLDEN / "corpus").glob("*.txt"))]
  config["data_signature"]["store_fingerprint"] = sources.scan(source).fingerprint
  (run / "config.json").write_text(json.dumps(config, indent=2))
  return run


def test_golden_files_name_no_module_path():
  for path in [GOLDEN / "old_fit.json", *(GOLDEN / "old_run").glob("*.json")]:
    text = path.read_text()
    assert "chinchax." not in text and "analysis." not in text, path


def test_an_old_run_resumes_from_its_step_10_checkpoint_to_the_same_loss(old_run, tmp_path):
  """The step-20 checkpoint removed, the old run resumes at 10 and ends bitwise where it ended."""
  want = json.loads((GOLDEN / "old_run" / "summary.json").read_text())
  shutil.rmtree(old_run / "checkpoints" / "20")
  (old_run / "summary.json").unlink()
  r = _chinchax("train", *TRAIN_ARGS, f"--config.workdir={old_run}",
                f"--config.data.store_root={tmp_path / 'stores'}")
  assert r.returncode == 0, r.stderr[-3000:]
  assert "resum" in (r.stdout + r.stderr).lower()
  got = json.loads((old_run / "summary.json").read_text())
  assert got["steps"] == want["steps"] == 20
  for key in ("final_train_loss", "final_eval_loss"):
    _same_loss(got[key], want[key])


def _same_loss(got: float, want: float) -> None:
  """Bitwise under the JAX minor version that trained the golden run (0.10); another XLA's CPU
  fusion sums float32 in another order (jax 0.12: 4.2348084 for 4.2348089), so there the
  losses agree to float32 round-off of a 20-step run."""
  if jax.__version__.startswith("0.10."):
    assert got == want
  else:
    assert abs(got - want) <= 1e-6 * abs(want), (got, want)


def test_an_old_run_exports_and_samples(old_run, tmp_path):
  out = tmp_path / "export"
  r = _chinchax("export", str(old_run), "--out", str(out))
  assert r.returncode == 0, r.stderr[-3000:]
  cfg = json.loads((out / "config.json").read_text())
  assert (cfg["hidden_size"], cfg["num_hidden_layers"]) == (32, 2)
  assert (out / "model.safetensors").stat().st_size > 28864 * 4
  r = _chinchax("sample", str(old_run), "--prompt", "ROMEO:", "--max-new-tokens", "8",
                "--temperature", "0")
  assert r.returncode == 0, r.stderr[-3000:]
  assert r.stdout.startswith("ROMEO:") and len(r.stdout.rstrip("\n")) > len("ROMEO:")


def test_an_old_fit_plans(tmp_path):
  law = json.loads((GOLDEN / "old_fit.json").read_text())
  r = _chinchax("plan", "--flops", "1e11", "--law", str(GOLDEN / "old_fit.json"))
  assert r.returncode == 0, r.stderr[-3000:]
  assert "N*" in r.stdout or "N_opt" in r.stdout or "params" in r.stdout.lower(), r.stdout
  assert law["recipe"], "the old law carries its recipe"
