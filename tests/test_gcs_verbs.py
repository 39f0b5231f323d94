"""The run-reading verbs on gs:// against the real fake-gcs-server (tests/gcs_server.py):
`export gs://…/run`, `sample gs://…/run`, `export --out gs://…` under the local --out rules,
`plan --law gs://…/fit.json`, and a gs:// ladder with its validation run."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from chinchax import cli
from chinchax.storage import paths as paths_lib
from gcs_server import BUCKET, gcs, gcs_url  # noqa: F401 — fixtures
from test_train import REPO


def _upload_run(local, url) -> str:
  paths_lib.upload_dir(local, url)
  return url


def _one_error(capsys, *needles) -> str:
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("error: "), err
  for n in needles:
    assert n in err, (n, err)
  return err


def test_export_and_sample_read_a_run_on_gs(bpe_run, gcs_url, tmp_path, capsys):
  c, _ = bpe_run
  run = _upload_run(c.workdir, f"{gcs_url}/run")
  assert cli.main(["export", c.workdir, "--out", str(tmp_path / "local")]) == 0
  assert cli.main(["export", run, "--out", str(tmp_path / "remote")]) == 0
  for name in ("model.safetensors", "config.json", "tokenizer.json"):
    assert ((tmp_path / "remote" / name).read_bytes()
            == (tmp_path / "local" / name).read_bytes()), name
  capsys.readouterr()
  flags = ["--prompt", "def ", "--temperature", "0", "--max-new-tokens", "12"]
  assert cli.main(["sample", c.workdir, *flags]) == 0
  local = capsys.readouterr().out
  assert cli.main(["sample", run, *flags]) == 0
  remote = capsys.readouterr().out
  text = lambda out: out.split("\n" + "-" * 40)[0].rsplit("\n", 2)[0]  # noqa: E731
  assert local.splitlines()[0] == remote.splitlines()[0] and text(local) == text(remote)
  # the default --out of a gs:// run is its export/ prefix
  assert cli.main(["export", run]) == 0
  assert paths_lib.as_path(f"{run}/export/export_info.json").exists()


def test_export_out_gs_follows_the_local_rules(bpe_run, gcs_url, capsys):
  c, _ = bpe_run
  other = _upload_run(c.workdir, f"{gcs_url}/runs/other")
  other_config = paths_lib.as_path(other, ).joinpath("config.json").read_text()
  notes = paths_lib.as_path(f"{gcs_url}/mine/notes.txt")
  notes.write_text("mine")
  cases = [
      (f"gs://{BUCKET}", ("names a whole bucket", f"gs://{BUCKET}/NAME")),
      (f"gs://{BUCKET}/", ("names a whole bucket",)),
      (other, ("holds a chinchax run",)),
      (f"{gcs_url}/runs", ("holds objects and is not an earlier export", "other")),
      (f"{gcs_url}/mine", ("holds objects and is not an earlier export", "notes.txt")),
      (f"{other}/checkpoints", ("is the checkpoints prefix of the run",)),
      (f"{other}/checkpoints/x", ("belongs to the run",)),
  ]
  for out, needles in cases:
    for extra in ([], ["--overwrite"]):
      assert cli.main(["export", c.workdir, "--out", out, *extra]) == 2, out
      _one_error(capsys, f"--out {out}", *needles)
  assert paths_lib.as_path(other).joinpath("config.json").read_text() == other_config
  assert notes.read_text() == "mine"
  # a new prefix inside a run is fine; an earlier export is replaced only with --overwrite
  assert cli.main(["export", c.workdir, "--out", f"{other}/hf"]) == 0
  capsys.readouterr()
  assert cli.main(["export", c.workdir, "--out", f"{other}/hf"]) == 2
  _one_error(capsys, "holds an earlier export; pass --overwrite")
  stale = paths_lib.as_path(f"{other}/hf/generation_config.json")
  assert stale.exists()
  assert cli.main(["export", c.workdir, "--out", f"{other}/hf", "--overwrite",
                   "--dtype", "bfloat16"]) == 0
  info = json.loads(paths_lib.as_path(f"{other}/hf/export_info.json").read_text())
  assert info["dtype"] == "bfloat16"
  assert "upload" not in info  # the last object written is the complete export_info.json
  # an upload cut short (the storage went away) leaves its first object marked incomplete:
  # an export --overwrite may replace, not a user's objects
  cut = paths_lib.as_path(f"{gcs_url}/cut")
  (cut / "export_info.json").write_text(json.dumps({**info, "upload": "incomplete"}))
  (cut / "config.json").write_text("{}")
  assert cli.main(["export", c.workdir, "--out", str(cut)]) == 2
  _one_error(capsys, "holds an export whose upload was interrupted; pass --overwrite")
  assert cli.main(["export", c.workdir, "--out", str(cut), "--overwrite"]) == 0
  assert "upload" not in json.loads((cut / "export_info.json").read_text())
  assert json.loads((cut / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]


def _cli(args, timeout=600):
  env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", "chinchax.cli", *args], env=env, cwd=REPO,
                        capture_output=True, text=True, timeout=timeout)


def test_plan_reads_a_law_from_gs(gcs_url, tmp_path):
  law = {"approach3": {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}}
  (tmp_path / "fit.json").write_text(json.dumps(law))
  paths_lib.as_path(f"{gcs_url}/fit/fit.json").write_text(json.dumps(law))
  local = _cli(["plan", "--flops", "1e19", "--law", str(tmp_path / "fit.json"), "--json"])
  remote = _cli(["plan", "--flops", "1e19", "--law", f"{gcs_url}/fit/fit.json", "--json"])
  assert local.returncode == 0 and remote.returncode == 0, remote.stderr[-2000:]
  a, b = json.loads(local.stdout), json.loads(remote.stdout)
  assert (a["N"], a["D"], a["predicted_loss"]) == (b["N"], b["D"], b["predicted_loss"])
  assert f"law file '{gcs_url}/fit/fit.json' records no recipe" in remote.stderr  # read too
  missing = _cli(["plan", "--flops", "1e19", "--law", f"{gcs_url}/nothing.json"])
  assert missing.returncode == 2 and "unknown law" in missing.stderr


def test_a_gcs_ladder_with_its_validation_run(gcs_url, small_corpus, store_root, tmp_path):
  from test_ladder import _ladder_cli, _ladder_config
  c = _ladder_config(tmp_path, small_corpus, store_root)
  c.workdir = f"{gcs_url}/ladder"
  c.ladder.update(bootstrap=0, fit=True)  # 3 budgets x 3 sizes (test_ladder)
  with open(tmp_path / "ladder.log", "w") as log:
    proc = _ladder_cli(c, log, "--config.ladder.validate=True",
                       "--config.ladder.heartbeat_s=0.5", "--config.ladder.poll_s=0.2")
    code = proc.wait(timeout=900)
  out = (tmp_path / "ladder.log").read_text()
  assert code == 0, out[-3000:]
  assert "cannot read a law" not in out and "no validation run" not in out, out[-3000:]
  wd = paths_lib.as_path(c.workdir)
  rows = [json.loads(l) for l in (wd / "results.jsonl").read_text().splitlines()]
  val = [r for r in rows if r.get("role") == "validation"]
  assert len(val) == 1 and val[0]["status"] == "done", val
  assert "validation" in json.loads((wd / "fit" / "fit.json").read_text())


def test_export_and_sample_of_an_unanswering_bucket_are_one_line(bpe_run, tmp_path):
  c, _ = bpe_run
  dead = "http://127.0.0.1:9"  # nothing listens there
  env = {"STORAGE_EMULATOR_HOST": dead, "TENSORSTORE_GCS_HTTP_URL": dead,
         "CHINCHAX_STORAGE_CHECK_TIMEOUT_S": "3"}
  run = f"gs://{BUCKET}/run"
  cases = [(["export", run, "--out", str(tmp_path / "x")], f"run directory {run}"),
           (["export", c.workdir, "--out", f"gs://{BUCKET}/x"], f"--out gs://{BUCKET}/x"),
           (["sample", run, "--prompt", "a"], f"run directory {run}")]
  for args, where in cases:
    r = subprocess.run([sys.executable, "-m", "chinchax.cli", *args], cwd=REPO, timeout=120,
                       env=dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu", **env),
                       capture_output=True, text=True)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert r.returncode == 2 and len(lines) == 1, (args, r.stderr[-2000:])
    assert lines[0].startswith(f"error: {where}: the storage service at {dead} gave no answer "
                               f"within 3 s"), lines
  assert not (tmp_path / "x").exists()
