"""A full disk, for real: a small tmpfs as the workdir, the store root, the fit's output. Each
write that fails ends in one `error:` line naming what, where and the space needed, with no
traceback and no temporary file left; once space is freed the run resumes to the same result.
Needs permission to mount a tmpfs (root); skipped otherwise."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from chinchax import cli as chinchax_cli
from chinchax.laws import parametric as laws
from analysis.isoflop import approach3
from analysis.io import write_results_jsonl
from analysis.isoflop.synthetic import synthetic_runs
from test_interrupts import REPO, _cmd, _env, _losses, reference  # noqa: F401 — a fixture

NOISE = ("Traceback", "ERROR:absl", "Event loop is closed", "Exception ignored")


@pytest.fixture
def small_disk(tmp_path):
  """mount(size) -> a directory on a tmpfs of that size; remount(size) resizes it."""
  mounted = []

  def mount(size):
    d = tmp_path / f"disk{len(mounted)}"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)],
                       capture_output=True, text=True)
    if r.returncode != 0:
      pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    mounted.append(d)
    return d

  yield mount
  for d in mounted:
    subprocess.run(["umount", "-l", str(d)], capture_output=True)


def _remount(d, size):
  subprocess.run(["mount", "-o", f"remount,size={size}", str(d)], check=True)


def _one_error(err, *needles):
  lines = [l for l in err.splitlines() if l.startswith("error:")]
  assert len(lines) == 1, err[-3000:]
  assert not [n for n in NOISE if n in err], err[-3000:]
  for n in needles:
    assert n in lines[0], lines[0]
  return lines[0]


def _leftovers(root):
  return [p for p in pathlib.Path(root).rglob("*")
          if ".orbax-checkpoint-tmp" in p.name or p.name.startswith(".") and ".tmp" in p.name]


def test_checkpoint_save_on_a_full_disk_then_resume_matches(small_corpus, store_root, small_disk,
                                                            reference):
  disk = small_disk("3m")
  wd = disk / "run"
  cmd = _cmd(wd, small_corpus, store_root, "--config.train.keep_checkpoints=1000")
  r = subprocess.run(cmd, env=_env(), cwd=REPO, capture_output=True, text=True, timeout=600)
  assert r.returncode == 2, r.stderr[-3000:]
  line = _one_error(r.stderr, "the disk is full", "saving the checkpoint of step",
                    str(wd / "checkpoints"), "free", "the last complete checkpoint is step")
  failed = int(line.split("checkpoint of step ")[1].split()[0])
  saved = sorted(int(p.name) for p in (wd / "checkpoints").iterdir() if p.name.isdigit())
  assert saved and max(saved) < failed  # the step named is the one that was not saved
  assert not _leftovers(wd)
  _remount(disk, "1g")  # space freed (a checkpoint every 5 steps, all kept)
  again = subprocess.run(cmd, env=_env(), cwd=REPO, capture_output=True, text=True, timeout=600)
  assert again.returncode == 0, again.stderr[-3000:]
  assert _losses(wd) == reference


def test_token_store_build_on_a_full_disk_then_resume(small_corpus, store_root, small_disk):
  disk = small_disk("600k")  # the corpus is ~0.6 MB of text: its tokens do not fit
  cmd = [sys.executable, "-m", "chinchax.cli", "prepare", f"--config={REPO}/configs/train.py:tiny",
         "--config.data.source=files", f"--config.data.paths={small_corpus}/*.txt",
         f"--config.data.store_root={disk}", "--config.data.val_fraction=0.1",
         "--config.data.shard_mb=0.1"]
  r = subprocess.run(cmd, env=_env(), cwd=REPO, capture_output=True, text=True, timeout=600)
  assert r.returncode == 2, r.stderr[-3000:]
  _one_error(r.stderr, "the disk is full", "building the token store", str(disk), "needs about")
  _remount(disk, "64m")
  again = subprocess.run(cmd, env=_env(), cwd=REPO, capture_output=True, text=True, timeout=600)
  assert again.returncode == 0, again.stderr[-3000:]
  built = [p for p in disk.iterdir() if not p.name.startswith(".")]
  ref = [p for p in pathlib.Path(store_root).iterdir() if p.name == built[0].name]
  assert ref, "the store of the same corpus and settings is in the shared store root"
  for f in ("train.bin", "val.bin"):
    if (ref[0] / f).exists():
      assert (built[0] / f).read_bytes() == (ref[0] / f).read_bytes()


def test_fit_figures_on_a_full_disk_one_line(tmp_path, small_disk, monkeypatch, capsys):
  full = approach3.chinchilla_grid()
  monkeypatch.setattr(approach3, "chinchilla_grid", lambda: full[::25])
  true = laws.ParametricLaw("true", E=1.8, A=480.0, B=2100.0, alpha=0.35, beta=0.37)
  runs = synthetic_runs(true, np.geomspace(1e18, 1e21, 5), n_sizes=7, noise=0.0005, seed=5,
                        curve_points=10)
  table = tmp_path / "results.jsonl"
  write_results_jsonl(runs, str(table))
  out = small_disk("64k") / "fit"
  rc = chinchax_cli.main(["fit", str(table), "--out", str(out), "--bootstrap", "4", "--jobs", "1"])
  err = capsys.readouterr().err
  assert rc == 2, err[-3000:]
  _one_error(err, "the disk is full", str(out))


def _fill(disk):
  """Fills the tmpfs at ``disk`` to its last byte."""
  fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
  try:
    while True:
      os.write(fd, b"\0" * 4096)
  except OSError:
    pass
  finally:
    os.close(fd)


def test_metrics_row_and_ladder_lease_on_a_full_disk(small_disk):
  from chinchax.storage import diskfull
  from chinchax import ladder
  from chinchax.train.metrics import MetricsLog
  disk = small_disk("256k")
  log = MetricsLog(disk / "metrics.jsonl", 0, True)
  log.write({"step": 1, "loss": 3.0})
  _fill(disk)
  with pytest.raises(diskfull.DiskFull) as e:
    for step in range(2, 100):  # the page already allocated takes a few rows
      log.write({"step": step, "loss": 3.0})
  msg = str(e.value)
  assert "writing the metrics row of step" in msg and str(disk / "metrics.jsonl") in msg
  assert "0 B are free" in msg
  leases = ladder.Leases(disk / "leases", "W", 60.0)
  with pytest.raises(OSError):
    leases.try_claim("run_a")
  assert not [p for p in (disk / "leases").iterdir()]  # no lease and no temporary file left
  (disk / "filler").unlink()
  assert leases.try_claim("run_a") is not None  # once space is freed


def test_export_on_a_full_disk_is_one_line_and_keeps_an_earlier_export(bpe_run, small_disk):
  c, _ = bpe_run
  disk = small_disk("4m")
  out = disk / "hf"
  cmd = [sys.executable, "-m", "chinchax.cli", "export", c.workdir, "--out", str(out)]
  first = subprocess.run(cmd, env=_env(), cwd=REPO, capture_output=True, text=True, timeout=300)
  assert first.returncode == 0, first.stderr[-3000:]
  before = {p.name: p.read_bytes() for p in out.iterdir()}
  size = sum(len(b) for b in before.values())
  _remount(disk, f"{size + size // 2}")  # room for less than a second copy beside the first
  r = subprocess.run([*cmd, "--overwrite", "--dtype", "float32"], env=_env(), cwd=REPO,
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 2, r.stderr[-3000:]
  assert r.stderr.count("\n") == 1, r.stderr[-3000:]
  _one_error(r.stderr, "the disk is full", "writing the export of step 10", str(out),
             f"{out} is as it was")
  assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the earlier export
  assert sorted(p.name for p in disk.iterdir()) == ["hf"]  # no temporary directory left
