"""Ladder workers: the table under concurrent writers, leases, the fit claim, and real workers
(2 local workers, a worker killed with SIGKILL mid-run, a duplicate worker started late)."""

import json
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

from chinchax import ladder
from chinchax.storage import atomic as files
from test_ladder import REPO, _ladder_cli, _ladder_config

# Runs the table and file modules without importing chinchax (and JAX): they use the stdlib only.
_STUB = f"""
import sys, types
for name, sub in (("chinchax", "chinchax"), ("chinchax.ladder", "chinchax/ladder")):
  m = types.ModuleType(name); m.__path__ = [{str(REPO)!r} + "/" + sub]; sys.modules[name] = m
"""

_WRITER = _STUB + """
import pathlib, time
from chinchax.ladder import table
path, me, n, start = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
while time.time() < start:
  time.sleep(0.001)
t = table.ResultsTable(pathlib.Path(path))
for i in range(n):
  t.upsert({"run_id": f"w{me}_r{i}", "status": "done", "C_budget": float(i), "N": int(me)})
  t.upsert({"run_id": f"shared_{i % 3}", "status": "done", "by": me, "C_budget": 0.0, "N": 0})
"""

_RACER = _STUB + """
import pathlib, time
from chinchax.storage import atomic as files
path, me, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
while time.time() < start:
  time.sleep(0.0005)
print(files.create_exclusive(pathlib.Path(path), me))
"""


def _start_together(script, args_of, n):
  start = time.time() + 1.5
  procs = [subprocess.Popen([sys.executable, "-c", script, *args_of(i), str(start)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(n)]
  outs = [p.communicate(timeout=120) for p in procs]
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err
  return [o for o, _ in outs]


def test_table_has_no_lost_or_duplicate_rows_under_concurrent_writers(tmp_path):
  n_writers, n_rows = 8, 15
  path = tmp_path / "results.jsonl"
  _start_together(_WRITER, lambda i: [str(path), str(i), str(n_rows)], n_writers)
  ids = [json.loads(line)["run_id"] for line in path.read_text().splitlines()]
  want = {f"w{w}_r{i}" for w in range(n_writers) for i in range(n_rows)} | {
      f"shared_{i}" for i in range(3)}
  assert len(ids) == len(set(ids)) == len(want) and set(ids) == want
  assert sorted(p.stem for p in (tmp_path / "rows").glob("*.json")) == sorted(want)
  assert not [p for p in tmp_path.rglob(".*") if p.is_file()]  # no temporary file left


def test_exclusive_create_has_one_winner_among_racing_processes(tmp_path):
  outs = _start_together(_RACER, lambda i: [str(tmp_path / "lease.0"), f"p{i}"], 8)
  assert sorted(o.strip() for o in outs) == ["False"] * 7 + ["True"]
  assert (tmp_path / "lease.0").read_text() in {f"p{i}" for i in range(8)}
  assert files.create_exclusive(tmp_path / "lease.0", "late") is False


def test_lease_heartbeat_expiry_takeover_and_release(tmp_path):
  now = [0.0]
  a = ladder.Leases(tmp_path, "A", 10.0, clock=lambda: now[0])
  b = ladder.Leases(tmp_path, "B", 10.0, clock=lambda: now[0])
  la = a.try_claim("r1")
  assert la.gen == 0 and b.try_claim("r1") is None and a.try_claim("r1") is None
  now[0] = 9.0
  assert la.beat() and b.try_claim("r1") is None
  now[0] = 18.0  # 9 s after the beat was first seen: still live
  assert b.try_claim("r1") is None and b.state("r1")[0] == "held"
  now[0] = 19.5  # no change for 10.5 s of B's clock: expired, B takes generation 1
  lb = b.try_claim("r1")
  assert lb is not None and lb.gen == 1 and lb.owner == "B"
  assert la.lost() and not la.beat()
  la.release()  # a lost lease is not touched
  assert json.loads((tmp_path / "r1.1").read_text())["owner"] == "B"
  c = ladder.Leases(tmp_path, "C", 10.0, clock=lambda: now[0])
  assert c.try_claim("r1") is None
  lb.release()
  assert c.state("r1")[0] == "released"
  lc = c.try_claim("r1")
  assert lc.gen == 2 and a.try_claim("r1") is None


def test_a_lease_read_mid_rewrite_is_held_until_its_text_stops_changing(tmp_path):
  now = [0.0]
  a = ladder.Leases(tmp_path, "A", 10.0, clock=lambda: now[0])
  b = ladder.Leases(tmp_path, "B", 10.0, clock=lambda: now[0])
  la = a.try_claim("r1")
  whole = (tmp_path / "r1.0").read_text()
  (tmp_path / "r1.0").write_text(whole[:len(whole) // 2])  # what a non-atomic rewrite shows
  assert b.state("r1")[0] == "held" and b.try_claim("r1") is None  # no traceback, no takeover
  (tmp_path / "r1.0").write_text(whole)  # the rewrite completes: an ordinary lease again
  now[0] = 5.0
  assert b.state("r1") == ("held", json.loads(whole))
  (tmp_path / "r1.0").write_text(whole[:7])  # torn for good (its writer died mid-write)
  now[0] = 6.0
  assert b.try_claim("r1") is None
  now[0] = 16.5  # unchanged for 10.5 s of B's clock: expired like any silent lease
  lb = b.try_claim("r1")
  assert lb is not None and lb.gen == 1 and la.lost()


def test_fit_is_claimed_once_when_the_ladder_settles(tmp_path):
  (tmp_path / "grid.json").write_text(json.dumps(["a", "b"]))
  table = ladder.ResultsTable(tmp_path / "results.jsonl", ["a", "b"])
  table.upsert({"run_id": "a", "status": "done"})
  assert not ladder.claim_fit(table.path)  # b not recorded
  held = ladder.Leases(tmp_path / "leases", "W", 60.0).try_claim("b")
  table.upsert({"run_id": "b", "status": "failed", "attempts": 1})
  assert not ladder.claim_fit(table.path)  # b's lease is live (a retry in progress)
  held.release()
  assert ladder.claim_fit(table.path)
  assert not ladder.claim_fit(table.path)
  table.upsert({"run_id": "b", "status": "done", "attempts": 2})
  assert ladder.claim_fit(table.path)  # a changed table may be fitted again


# ---- real workers on the tiny ladder ----

WORKER = ("--config.ladder.worker=True", "--config.ladder.lease_expiry_s=4",
          "--config.ladder.heartbeat_s=0.5", "--config.ladder.poll_s=0.2",
          "--config.train_config.train.checkpoint_every=5")
CLAIM = re.compile(r"worker (\S+): run (\S+) \(lease (\d+), attempt (\d+)\)")


@pytest.fixture
def tiny(tmp_path, small_corpus, store_root):
  """The tiny ladder (2 budgets x 3 sizes) on the small corpus, no fit; its store built."""
  c = _ladder_config(tmp_path, small_corpus, store_root)
  c.ladder.update(c_min=3e8, c_max=6e8, n_budgets=2, fit=False)
  plan = ladder.prepare(c)  # builds the token store once, before any worker starts
  return c, plan


def _rows(c):
  lines = (pathlib.Path(c.workdir) / "results.jsonl").read_text().splitlines()
  return [json.loads(line) for line in lines]


def _assert_each_run_once(c, plan):
  rows = _rows(c)
  ids = [r["run_id"] for r in rows]
  assert sorted(ids) == sorted(r.run_id for r in plan.runs) and len(set(ids)) == len(ids)
  assert all(r["status"] == "done" for r in rows), [r.get("error") for r in rows]
  return {r["run_id"]: r for r in rows}


def _wait(proc, log, timeout=600):
  assert proc.wait(timeout=timeout) == 0, pathlib.Path(log.name).read_text()[-3000:]


def test_two_local_workers_finish_the_tiny_ladder_each_run_once(tiny, tmp_path):
  c, plan = tiny
  with open(tmp_path / "k2.log", "w") as log:
    proc = _ladder_cli(c, log, "--config.ladder.workers=2")
    _wait(proc, log)
  out = (tmp_path / "k2.log").read_text()
  assert "2 local workers" in out
  rows = _assert_each_run_once(c, plan)
  assert len({r["worker"] for r in rows.values()}) == 2
  assert all(r["attempts"] == 1 for r in rows.values())  # every run claimed once
  assert out.count(f"ladder  finished: {len(rows)} runs done, 0 failed") == 1
  assert "os.fork()" not in out


def _victim(c, pid, deadline):
  """A run that worker `pid` holds, has a checkpoint of and has not recorded yet."""
  wd = pathlib.Path(c.workdir)
  while time.time() < deadline:
    for f in (wd / "leases").glob("*.*"):
      if f.name.startswith("."):
        continue
      try:
        lease = json.loads(f.read_text())
      except (OSError, ValueError):
        continue
      run = lease["run_id"]
      ckpts = wd / "runs" / run / "checkpoints"
      if (lease["owner"].endswith(f"-{pid}") and not lease["released"]
          and not (wd / "rows" / f"{run}.json").exists() and ckpts.exists()
          and any(p.name.isdigit() for p in ckpts.iterdir())):
        return run
    time.sleep(0.02)
  raise AssertionError("the worker never held a run with a checkpoint")


def test_killed_worker_lease_expires_and_the_other_resumes_its_run(tiny, tmp_path):
  c, plan = tiny
  with open(tmp_path / "a.log", "w") as la, open(tmp_path / "b.log", "w") as lb:
    a = _ladder_cli(c, la, *WORKER)
    b = _ladder_cli(c, lb, *WORKER)
    run = _victim(c, a.pid, time.time() + 300)
    a.send_signal(signal.SIGKILL)
    a.wait()
    _wait(b, lb)
  rows = _assert_each_run_once(c, plan)
  assert rows[run]["worker"].endswith(f"-{b.pid}") and rows[run]["resumed"] is True
  assert rows[run]["attempts"] == 2  # the killed worker's attempt counts
  assert (pathlib.Path(c.workdir) / "leases" / f"{run}.1").exists()  # taken over: generation 1
  claims = CLAIM.findall((tmp_path / "b.log").read_text())
  assert (run, "1") in {(r, g) for _, r, g, _ in claims}


def test_duplicate_worker_started_late_runs_nothing_twice(tiny, tmp_path):
  c, plan = tiny
  results = pathlib.Path(c.workdir) / "results.jsonl"
  with open(tmp_path / "a.log", "w") as la, open(tmp_path / "b.log", "w") as lb:
    a = _ladder_cli(c, la, *WORKER)
    deadline = time.time() + 300
    while time.time() < deadline and a.poll() is None:
      if results.exists() and len(results.read_text().splitlines()) >= 2:
        break
      time.sleep(0.05)
    b = _ladder_cli(c, lb, *WORKER)
    _wait(a, la)
    _wait(b, lb)
  rows = _assert_each_run_once(c, plan)
  claims = CLAIM.findall((tmp_path / "a.log").read_text() + (tmp_path / "b.log").read_text())
  assert sorted(r for _, r, _, _ in claims) == sorted(rows)  # each run started exactly once
  assert {g for _, _, g, _ in claims} == {"0"}  # no lease was ever taken over
  assert not any(r["resumed"] for r in rows.values())
  assert sorted(p.name for p in (pathlib.Path(c.workdir) / "leases").iterdir()) == sorted(
      f"{r}.0" for r in rows)


def test_run_whose_workers_keep_dying_is_recorded_failed_not_run_again(tmp_path, small_corpus,
                                                                       store_root, monkeypatch):
  from chinchax import train as train_lib
  c = _ladder_config(tmp_path, small_corpus, store_root)
  c.ladder.update(fit=False, max_attempts=2, lease_expiry_s=0.4, heartbeat_s=0.1, poll_s=0.05)
  runs = ladder.plan_runs(c.ladder, c.train_config.train, 257)
  doomed = runs[0].run_id
  leases = pathlib.Path(c.workdir) / "leases"
  leases.mkdir(parents=True)
  # A worker that died in its 2nd attempt (e.g. killed by the OOM killer) left this lease.
  (leases / f"{doomed}.1").write_text(json.dumps(
      {"run_id": doomed, "gen": 1, "owner": "ghost-1", "attempt": 2, "beat": 7, "time": 0.0,
       "released": False}))
  (leases / f"{doomed}.0").write_text("{}")
  calls = []

  def fake_train(cfg, devices=None, verbose=True, lease_held=False):
    calls.append(pathlib.Path(cfg.workdir).name)
    return {"tokens": 1000, "steps": 4, "final_train_loss": 3.0, "final_eval_loss": 3.1,
            "final_eval_bits_per_byte": 4.5, "tokens_per_s": 1.0, "mfu": 0.0}

  monkeypatch.setattr(train_lib, "train", fake_train)
  rows = {json.loads(l)["run_id"]: json.loads(l)
          for l in ladder.run_ladder(c).read_text().splitlines()}
  assert doomed not in calls and len(calls) == len(runs) - 1
  assert rows[doomed]["status"] == "failed" and "RunAbandoned" in rows[doomed]["error"]
  assert rows[doomed]["attempts"] == 2
  assert json.loads((leases / f"{doomed}.2").read_text())["released"] == "recorded"


def test_status_names_each_runs_state(tiny, capsys):
  c, plan = tiny
  from chinchax import cli
  a, b = plan.runs[0].run_id, plan.runs[1].run_id
  plan.table.upsert({"run_id": a, "status": "done"})
  plan.leases("host-42").try_claim(b)
  args = [f"--config={REPO}/configs/ladder.py:tiny", f"--config.workdir={c.workdir}",
          "--config.ladder.status=True", "--config.ladder.n_budgets=2"]
  for k in ("c_min", "c_max", "spread"):
    args.append(f"--config.ladder.{k}={c.ladder[k]}")
  assert cli.main(["ladder", *args]) == 0
  out = capsys.readouterr().out
  assert f"{a}: " in out and "(done)" in out and "(running on host-42 (lease 0))" in out
  assert f"ladder  1 runs done, 0 failed, {len(plan.runs) - 1} not recorded yet" in out
