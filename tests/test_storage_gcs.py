"""gs:// paths against a real GCS emulator (fake-gcs-server, tests/gcs_server.py): bad URLs,
the lease race, metrics on an object store, train → SIGKILL → resume, a 2-worker ladder, fit."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from chinchax.storage import paths as paths_lib
from chinchax.storage import atomic as files
from gcs_server import gcs, gcs_url  # noqa: F401 — fixtures
from test_train import REPO, _run_cli

# --- checks before expensive work -------------------------------------------------------------


def _cli(args, env=None, timeout=300):
  env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu", **(env or {}))
  return subprocess.run([sys.executable, "-m", "chinchax.cli", *args], env=env, cwd=REPO,
                        capture_output=True, text=True, timeout=timeout)


def test_bad_bucket_url_and_unreachable_endpoint_are_one_error_line(gcs, small_corpus, tmp_path):
  base = [f"train", f"--config={REPO}/configs/train.py:tiny", "--config.data.source=files",
          f"--config.data.paths={small_corpus}/*.txt", "--config.budget.steps=2",
          f"--config.data.store_root={tmp_path / 'stores'}"]
  cases = [
      ("gs://no-such-bucket/run", {}, "bucket no-such-bucket does not exist"),
      ("gs:///run", {}, "names no bucket"),
      # a port nothing listens on: the check gives up after CHINCHAX_STORAGE_CHECK_TIMEOUT_S
      ("gs://chinchax-test/run", {"STORAGE_EMULATOR_HOST": "http://127.0.0.1:9",
                                  "TENSORSTORE_GCS_HTTP_URL": "http://127.0.0.1:9",
                                  "CHINCHAX_STORAGE_CHECK_TIMEOUT_S": "3"}, "gave no answer"),
  ]
  for workdir, env, words in cases:
    r = _cli([*base, f"--config.workdir={workdir}"], env)
    assert r.returncode == 2, (workdir, r.stdout[-2000:], r.stderr[-2000:])
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], r.stderr
    assert workdir.rstrip("/") in lines[0] or workdir == "gs:///run"
    assert "Traceback" not in r.stdout + r.stderr and "default credentials" not in r.stderr


def test_writable_check_leaves_nothing_and_names_the_url(gcs_url):
  assert str(paths_lib.check_writable_dir(gcs_url, "workdir")) == gcs_url
  assert not paths_lib.as_path(gcs_url).exists()  # the probe object was deleted


# --- leases: atomic create and generation-matched rewrites ------------------------------------

_RACER = """
import sys, time
from chinchax.storage import atomic as files
url, me, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
while time.time() < start:
  time.sleep(0.0005)
print(files.create_exclusive(url, me))
"""


def test_two_workers_racing_for_a_lease_on_gcs_one_wins(gcs_url):
  url = f"{gcs_url}/leases/r1.0"
  for round_ in range(3):  # two processes, started together, create the same object
    start = time.time() + 2.0
    procs = [subprocess.Popen([sys.executable, "-c", _RACER, f"{url}.{round_}", f"p{i}",
                               str(start)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
    assert sorted(o.strip() for o, _ in outs) == ["False", "True"], outs
    assert paths_lib.as_path(f"{url}.{round_}").read_text() in {"p0", "p1"}
  assert files.create_exclusive(f"{url}.0", "late") is False


def test_lease_protocol_on_gcs_heartbeat_expiry_takeover(gcs_url):
  from chinchax import ladder
  now = [0.0]
  leases = paths_lib.as_path(gcs_url) / "leases"
  a = ladder.Leases(leases, "A", 10.0, clock=lambda: now[0])
  b = ladder.Leases(leases, "B", 10.0, clock=lambda: now[0])
  la = a.try_claim("r1")
  assert la.gen == 0 and la.generation is not None and b.try_claim("r1") is None
  g0 = la.generation
  now[0] = 9.0
  assert la.beat() and la.generation != g0 and b.try_claim("r1") is None
  stale = ladder.Lease(la.path, "r1", 0, "A")  # a second holder of the same generation …
  stale.generation = g0                        # … whose last write is not the latest
  assert not stale.beat()  # its generation-matched rewrite is refused
  assert json.loads(la.path.read_text())["beat"] == 1
  now[0] = 19.5  # unchanged for 10.5 s of B's clock: expired
  lb = b.try_claim("r1")
  assert lb is not None and lb.gen == 1 and la.lost() and not la.beat()
  lb.release()
  assert a.state("r1")[0] == "released" and a.try_claim("r1").gen == 2


# --- metrics rows on an object store ------------------------------------------------------------


def test_metrics_rows_reach_the_object_by_each_checkpoint(gcs_url):
  from chinchax.train.metrics import MetricsLog
  path = paths_lib.as_path(gcs_url) / "metrics.jsonl"
  log = MetricsLog(path, 0, enabled=True)
  for s in range(1, 4):
    log.write({"step": s, "loss": float(s)})
  log.sync()  # what the loop calls before a checkpoint save
  assert [json.loads(l)["step"] for l in path.read_text().splitlines()] == [1, 2, 3]
  log.write({"step": 4, "loss": 4.0})
  log.close()
  resumed = MetricsLog(path, 2, enabled=True)  # a resume from step 2 drops rows 3 and 4
  resumed.write({"step": 3, "loss": 3.5})
  resumed.close()
  assert [json.loads(l)["loss"] for l in path.read_text().splitlines()] == [1.0, 2.0, 3.5]


# --- a run on gs:// killed with SIGKILL, resumed ------------------------------------------------


def _losses_at(workdir):
  text = paths_lib.as_path(workdir).joinpath("metrics.jsonl").read_text()
  return {r["step"]: r["loss"] for r in map(json.loads, text.splitlines())}


def test_resume_after_sigkill_on_gcs_is_bitwise_identical(gcs_url, small_corpus, store_root,
                                                          tmp_path):
  ref = _run_cli(tmp_path / "ref", store_root, small_corpus)  # uninterrupted, on local disk
  out, _ = ref.communicate(timeout=300)
  assert ref.returncode == 0, out.decode()[-2000:]

  run, stores = f"{gcs_url}/run", f"{gcs_url}/stores"
  env_stage = {"CHINCHAX_STAGE_DIR": str(tmp_path / "stage")}
  os.environ.update(env_stage)
  proc = _run_cli(run, stores, small_corpus)
  ckpts = paths_lib.as_path(run) / "checkpoints"
  deadline = time.time() + 300
  while time.time() < deadline:
    try:
      if any(int(s) >= 20 for s in [p.name for p in ckpts.iterdir()] if s.isdigit()
             and (ckpts / s / "commit_success.txt").exists()):
        break
    except FileNotFoundError:
      pass
    time.sleep(0.2)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  killed = _losses_at(run)
  assert max(killed) < 60, "the run finished before it could be killed"
  assert sorted(killed)[:20] == list(range(1, 21))  # every row up to the checkpoint is there
  again = _run_cli(run, stores, small_corpus)
  out, _ = again.communicate(timeout=300)
  text = out.decode()
  assert again.returncode == 0, text[-2000:]
  assert "resumed from checkpoint at step" in text
  assert "default credentials" not in text and "Traceback" not in text

  a = json.loads((tmp_path / "ref" / "summary.json").read_text())
  b = json.loads(paths_lib.as_path(run).joinpath("summary.json").read_text())
  assert b["tokens"] == a["tokens"] == 60 * 8 * 32
  assert b["final_train_loss"] == a["final_train_loss"]  # bitwise, and equal to local disk
  assert b["final_eval_loss"] == a["final_eval_loss"]
  assert _losses_at(run) == _losses_at(tmp_path / "ref")
  assert b["workdir"] == run
  # the store was staged locally, uploaded (manifest last) and the staged copy removed
  store = [p for p in paths_lib.as_path(stores).iterdir() if p.name.startswith("bytes-")]
  assert len(store) == 1 and (store[0] / "manifest.json").exists()
  assert not list((tmp_path / "stage").rglob("manifest.json"))
  # TensorBoard events went to the bucket too
  assert any(p.name.startswith("events.") for p in
             paths_lib.as_path(run).joinpath("tensorboard").iterdir())


# --- a ladder on a gs:// workdir: two local workers, the fit -----------------------------------


def test_two_local_workers_run_a_gcs_ladder_each_run_once_and_fit_it(gcs_url, small_corpus,
                                                                    store_root, tmp_path):
  from chinchax import ladder
  from test_ladder import _ladder_cli, _ladder_config
  c = _ladder_config(tmp_path, small_corpus, store_root)
  c.workdir = f"{gcs_url}/ladder"
  c.ladder.update(bootstrap=0, fit=True)  # 3 budgets x 3 sizes (test_ladder)
  plan = ladder.prepare(c)  # the store (local) built once; grid.json written to the bucket
  with open(tmp_path / "ladder.log", "w") as log:
    proc = _ladder_cli(c, log, "--config.ladder.workers=2", "--config.ladder.validate=False",
                       "--config.ladder.heartbeat_s=0.5", "--config.ladder.poll_s=0.2")
    assert proc.wait(timeout=900) == 0, (tmp_path / "ladder.log").read_text()[-3000:]
  out = (tmp_path / "ladder.log").read_text()
  wd = paths_lib.as_path(c.workdir)
  rows = [json.loads(l) for l in (wd / "results.jsonl").read_text().splitlines()]
  ids = [r["run_id"] for r in rows]
  assert sorted(ids) == sorted(r.run_id for r in plan.runs) and len(set(ids)) == len(ids)
  assert all(r["status"] == "done" for r in rows), [r.get("error") for r in rows]
  assert len({r["worker"] for r in rows}) == 2
  leases = sorted(p.name for p in (wd / "leases").iterdir())
  assert leases == sorted(f"{i}.0" for i in ids)  # every run claimed once, never taken over
  fit = json.loads((wd / "fit" / "fit.json").read_text())
  assert fit and (wd / "fit" / "fit.md").exists()
  assert "default credentials" not in out and "Traceback" not in out


def test_fit_reads_and_writes_gs_urls(gcs_url, tmp_path):
  """`chinchax fit gs://…/results.jsonl --out gs://…/fit` on a synthetic Chinchilla-like table."""
  from chinchax.laws import parametric as laws
  law = laws.get_law("chinchilla-approach3")
  rows = []
  for C in (1e17, 3e17, 1e18):
    for N in (C / 6 / 20 / 4, C / 6 / 20 / 1.5, (C / 6 / 20) ** 0.5 * 1e0, C / 120 * 1.0):
      N = max(N, 1e6)
      D = C / (6 * N)
      rows.append({"run_id": f"r{len(rows)}", "status": "done", "C_budget": C, "N": N, "D": D,
                   "final_eval_loss": float(law.loss(N, D))})
  table = paths_lib.as_path(gcs_url) / "results.jsonl"
  table.write_text("".join(json.dumps(r) + "\n" for r in rows))
  r = _cli(["fit", str(table), "--out", f"{gcs_url}/out", "--bootstrap", "0", "--no-figures"])
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
  assert json.loads((paths_lib.as_path(gcs_url) / "out" / "fit.json").read_text())
  assert f"{gcs_url}/out/fit.json" in r.stdout + r.stderr


def test_export_and_compile_write_to_gs(gcs_url, bpe_run):
  from chinchax import cli
  c, _ = bpe_run
  out = f"{gcs_url}/hf"
  assert cli.main(["export", c.workdir, "--format", "safetensors", "--out", out]) == 0
  names = {p.name for p in paths_lib.as_path(out).iterdir()}
  assert {"config.json", "model.safetensors", "tokenizer.json"} <= names, names
  assert cli.main(["export", c.workdir, "--out", out]) == 2  # not replaced without --overwrite
  # compile --out: the URL's bucket is checked before compiling (the report is one object
  # write, paths.write_text_atomic, as config.json above)
  r = _cli(["compile", "--topology", "v5e-8", "--config=configs/train.py:tiny", "--no-eval",
            "--out", "gs://no-such-bucket/r.json"])
  assert r.returncode == 2 and r.stderr.startswith("error: --out's directory gs://no-such-bucket"), \
      r.stderr[-2000:]


# --- two processes (gloo) writing one checkpoint to gs:// --------------------------------------


def test_two_processes_write_one_checkpoint_to_gs_and_match_one_process(gcs_url, small_corpus,
                                                                       tiny_config, tmp_path):
  import jax
  from chinchax import train as train_lib
  from test_distributed_multiprocess import LAUNCHER, _flags
  run, stores = f"{gcs_url}/run", f"{gcs_url}/stores"
  env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu", PYTHON=sys.executable,
             CHINCHAX_STAGE_DIR=str(tmp_path / "stage"))
  proc = subprocess.run(
      ["bash", str(LAUNCHER), "--processes", "2", "--devices", "4", "--log-dir",
       str(tmp_path / "logs"), "--", *_flags(run, stores, small_corpus)],
      env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
  logs = {p.name: p.read_text() for p in (tmp_path / "logs").glob("*.log")}
  assert proc.returncode == 0, (proc.stderr[-2000:], {k: v[-3000:] for k, v in logs.items()})
  step_dir = paths_lib.as_path(run) / "checkpoints" / "20"
  assert (step_dir / "commit_success.txt").exists()
  # fsdp=8 over 2 processes: each process wrote its own shards of the state
  names = {p.name for p in (step_dir / "default").iterdir()}
  assert {"ocdbt.process_0", "ocdbt.process_1"} <= names, names
  two = _losses_at(run)
  c = tiny_config.copy_and_resolve_references()
  c.workdir = str(tmp_path / "one")
  c.mesh.update(data=1, fsdp=8, tensor=1)
  c.train.update(log_every=1, peak_flops_per_device=1e9)
  train_lib.train(c, devices=jax.devices()[:8], verbose=False)
  one = _losses_at(c.workdir)
  assert sorted(two) == sorted(one) == list(range(1, 21))
  for s in one:
    assert one[s] == pytest.approx(two[s], rel=1e-6), (s, one[s], two[s])


def test_wsd_cooldown_waits_for_a_committed_trunk_checkpoint_on_gs(gcs_url):
  from chinchax.ladder import wsd
  from test_ladder_wsd import A, _run
  runs = [_run(A, 100), _run(A, 400)]
  plans = wsd.plan_shapes(runs, 1, 0.2, 50)
  wd = paths_lib.as_path(gcs_url)
  assert wsd.ready(plans, runs[1], wd) and not wsd.ready(plans, runs[0], wd)
  step = wd / "runs" / "32_400" / "checkpoints" / "80"
  (step / "default" / "_METADATA").write_text("{}")  # orbax still writing: not complete
  assert not wsd.ready(plans, runs[0], wd)
  (step / "commit_success.txt").write_text("")
  assert wsd.ready(plans, runs[0], wd)
