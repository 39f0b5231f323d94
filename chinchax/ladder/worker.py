"""Running the ladder: claim a run, train it under a heartbeat, record its row; repeat.

Every run of the grid is an idempotent unit of the shared workdir:

  ``leases/<run_id>.<gen>``  who runs it (:mod:`chinchax.ladder.lease`)
  ``runs/<run_id>/``         its training workdir (checkpoints: a run taken
                             over from a dead worker resumes from them)
  ``rows/<run_id>.json``     its result row, merged into ``results.jsonl``
                             (:mod:`chinchax.ladder.table`)

Any number of identical workers (one process, K local processes, a SLURM
array, TPU VMs) loop: claim the next claimable run, train it while a thread
renews the lease, write its row (``done`` or ``failed`` with the error),
release the lease. Runs are claimed largest budget first (the longest first,
so that parallel workers finish together). A run is claimable while it has no
row, or failed fewer than ``ladder.max_attempts`` times and not on this worker.
A worker leaves when nothing is claimable and no other worker holds a lease
of an unrecorded run; a dead worker's lease expires after
``ladder.lease_expiry_s`` and another worker takes the run over.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import pathlib
import signal
import threading
import time
import traceback

import jax

from chinchax import budget
from chinchax import config as config_lib
from chinchax import console
from chinchax import distributed as distributed_lib
from chinchax import train as train_lib
import chinchax.ladder.files as files
import chinchax.ladder.grid as grid
import chinchax.ladder.lease as lease_lib
import chinchax.ladder.table as table_lib
import chinchax.ladder.wsd as wsd_lib

GRID_FILE = "grid.json"
FIT_CLAIMS_DIR = "fit-claims"


@dataclasses.dataclass
class LadderPlan:
  """A validated ladder: its runs (grid order), workdir, base config and devices."""

  config: object
  runs: list[grid.LadderRun]
  workdir: pathlib.Path
  devices: list
  vocab: int
  wsd_plans: list | None = None

  def run_config(self, r: grid.LadderRun):
    """The training config of run ``r``: cosine (``grid.run_config``), a wsd trunk or a
    cooldown (``wsd.run_config``); the validation run trains directly on its schedule."""
    base = self.config.train_config
    if self.wsd_plans is None:
      return grid.run_config(base, r, self.workdir)
    if r.role == "validation":
      c = grid.run_config(base, r, self.workdir)
      c.train.update(schedule="wsd", decay_fraction=self.config.ladder.cooldown_fraction)
      return c
    return wsd_lib.run_config(base, self.wsd_plans, r, self.workdir)

  def ready(self, r: grid.LadderRun) -> bool:
    """Whether ``r`` can start now (a wsd cooldown waits for its trunk's branch checkpoint)."""
    return (self.wsd_plans is None or r.role == "validation"
            or wsd_lib.ready(self.wsd_plans, r, self.workdir))

  @property
  def table(self) -> table_lib.ResultsTable:
    return table_lib.ResultsTable(self.workdir / "results.jsonl", [r.run_id for r in self.runs])

  def leases(self, owner: str) -> lease_lib.Leases:
    return lease_lib.Leases(self.workdir / lease_lib.LEASES_DIR, owner,
                            self.config.ladder.lease_expiry_s)


def prepare(config, devices=None, check_data: bool = True, write: bool = True) -> LadderPlan:
  """Validates the ladder, plans its runs and (``check_data``) checks the corpus up front.

  With ``write`` (a ladder that will run), creates the workdir and writes
  ``grid.json`` (the run ids) into it; without (``ladder.status``, a read-only
  query), writes nothing.

  Raises:
    ConfigError: invalid ladder or training config, a run shorter than
      ``ladder.min_steps`` under its hyperparameter rule, a corpus too small
      for the largest D.
    DataError: the corpus cannot be read.
  """
  lc = config.ladder
  grid.validate_ladder(lc)
  base = config.train_config
  config_lib.validate(base)
  devices = list(jax.devices() if devices is None else devices)
  workdir = pathlib.Path(os.path.expanduser(config.workdir)).resolve()
  spec0 = train_lib.resolve(base, len(devices))
  runs = grid.plan_runs(lc, base.train, spec0.model.vocab_size,
                        batch_multiple=grid.data_parallel_size(base, len(devices)))
  short = [r for r in runs if r.hparams.steps < lc.min_steps]
  if short:
    r = short[0]
    raise config_lib.ConfigError(
        f"budget C={r.C_budget:.3g} gives run {r.run_id} only {r.hparams.steps} steps of "
        f"{r.hparams.global_batch_size}×{base.train.seq_len} tokens "
        f"(ladder.min_steps={lc.min_steps}, ladder.hparams={lc.hparams!r}); raise ladder.c_min "
        f"or shrink the batch")
  wsd_plans = (wsd_lib.plan_shapes(runs, None, lc.cooldown_fraction, base.train.warmup_steps)
               if lc.schedule == "wsd" else None)
  plan = LadderPlan(config, runs, workdir, devices, spec0.model.vocab_size, wsd_plans)
  if check_data:
    check_corpus(plan, runs)
  if write:
    workdir.mkdir(parents=True, exist_ok=True)
    files.write_atomic(workdir / GRID_FILE, json.dumps([r.run_id for r in runs]))
  return plan


def check_corpus(plan: LadderPlan, runs: list[grid.LadderRun]) -> None:
  """Builds (or loads) the token store and checks it feeds every run of ``runs`` without
  repetition (unless ``data.allow_repeat``).

  Raises:
    ConfigError: a run needs more than one epoch of the training split.
    DataError: the corpus cannot be read.
  """
  base = plan.config.train_config
  spec0 = train_lib.resolve(base, len(plan.devices))
  first = plan.run_config(runs[0])
  one_step = dataclasses.replace(spec0, steps=1, tokens=spec0.tokens_per_step)
  try:
    split = train_lib.prepare_data(first, one_step).train_split
  except OSError:  # workers started together built the same token store; it is complete now
    time.sleep(1.0)
    split = train_lib.prepare_data(first, one_step).train_split
  n_windows = (split.n_tokens - 1) // base.train.seq_len
  for r in runs:
    need = r.hparams.steps * r.hparams.global_batch_size
    if need > n_windows and not base.data.allow_repeat:
      raise config_lib.ConfigError(
          f"run {r.run_id} (budget C={r.C_budget:.3g}, N={r.counts.total:,}) needs D={r.D:,.0f} "
          f"tokens = {need / n_windows:.2f} epochs of the {split.n_tokens:,}-token training "
          f"split; lower ladder.c_max or set train_config.data.allow_repeat=True")


def _eval_curve(workdir: pathlib.Path, n_params: int, tokens_per_step: int) -> list[list[float]]:
  """[[FLOPs seen (6·N·tokens), eval loss], ...] from a run's metrics.jsonl."""
  curve = []
  path = workdir / "metrics.jsonl"
  if path.exists():
    for line in path.read_text().splitlines():
      row = json.loads(line)
      if "eval_loss" in row:
        curve.append([6.0 * n_params * row["step"] * tokens_per_step, row["eval_loss"]])
  return curve


def train_run(plan: LadderPlan, r: grid.LadderRun, attempt: int, owner: str) -> dict:
  """Trains (or resumes) one run; returns its row, ``done`` or ``failed`` (never raises for a
  failed run).

  Raises:
    Preempted: a preemption request stopped the run after a checkpoint.
    KeyboardInterrupt: Ctrl-C.
  """
  base = plan.config.train_config
  cfg = plan.run_config(r)
  cfg.train.progress = False
  t0 = time.time()
  hp = r.hparams
  row = {"run_id": r.run_id, "role": r.role, "C_budget": r.C_budget, "N": r.counts.total,
         "N_non_embedding": r.counts.non_embedding,
         "shape": {"d_model": r.shape.d_model, "n_layers": r.shape.n_layers,
                   "n_heads": r.shape.n_heads, "d_ff": r.shape.d_ff, "vocab_size": plan.vocab,
                   "seq_len": base.train.seq_len},
         "hparams": {"rule": hp.rule, "peak_lr": cfg.train.peak_lr,
                     "global_batch_size": cfg.train.global_batch_size, "b2": cfg.train.b2,
                     "warmup_steps": cfg.train.warmup_steps},
         "attempts": attempt, "worker": owner}
  try:
    summary = train_lib.train(cfg, devices=plan.devices, verbose=False)
    row.update({
        "status": "done", "D": summary["tokens"], "steps": summary["steps"],
        "C_6nd": budget.flops_6nd(r.counts.total, summary["tokens"]),
        "C_appendix_f": budget.chinchilla_flops_per_token(r.shape) * summary["tokens"],
        "final_train_loss": summary["final_train_loss"],
        "final_eval_loss": summary["final_eval_loss"],
        "final_eval_loss_se": summary.get("final_eval_loss_se"),
        "final_eval_bits_per_byte": summary["final_eval_bits_per_byte"],
        "eval_curve": _eval_curve(pathlib.Path(cfg.workdir), r.counts.total,
                                  cfg.train.global_batch_size * cfg.train.seq_len),
        "wall_time_s": time.time() - t0, "tokens_per_s": summary["tokens_per_s"],
        "mfu": summary["mfu"], "resumed": summary.get("resumed", False)})
  except (KeyboardInterrupt, distributed_lib.Preempted):
    raise
  except Exception as e:  # one failed run must not stop the ladder
    row.update({"status": "failed", "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc(limit=5), "wall_time_s": time.time() - t0})
  return row


class _Heartbeat:
  """Renews a lease every ``period_s`` on a thread; on loss, asks the run to stop.

  A lost lease (another worker took the run over, e.g. after this process was
  paused past the expiry) sets :attr:`lost` and, when a SIGTERM handler is
  installed (``chinchax ladder``), sends this process SIGTERM: the run stops
  at its next step boundary with a checkpoint, as on preemption.
  """

  def __init__(self, lease: lease_lib.Lease, period_s: float):
    self.lease, self.period_s = lease, period_s
    self.lost = False
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._loop, name=f"lease-{lease.run_id}", daemon=True)

  def __enter__(self):
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self._stop.set()
    self._thread.join()

  def _loop(self):
    while not self._stop.wait(self.period_s):
      if not self.lease.beat():
        self.lost = True
        if callable(signal.getsignal(signal.SIGTERM)):
          os.kill(os.getpid(), signal.SIGTERM)
        return


def _claim_order(plan: LadderPlan, table: table_lib.ResultsTable, failed_here: set[str]):
  """Runs this worker may claim: unrecorded ones largest budget first, then failed ones to retry."""
  by_size = sorted(plan.runs, key=lambda r: (-r.C_budget, -r.counts.total))
  fresh = [r for r in by_size if r.run_id not in table.rows]
  retry = [r for r in by_size if _retryable(table.rows.get(r.run_id), plan, failed_here)]
  return fresh + retry


def _retryable(row: dict | None, plan: LadderPlan, failed_here: set[str]) -> bool:
  return (row is not None and row.get("status") != "done"
          and row["run_id"] not in failed_here
          and row.get("attempts", 1) < plan.config.ladder.max_attempts)


def _claimable(row: dict | None, plan: LadderPlan, failed_here: set[str]) -> bool:
  return row is None or _retryable(row, plan, failed_here)


def _attempt(row: dict | None, held: lease_lib.Lease) -> int:
  """The attempt a new lease starts: a preempted or skipped predecessor's goes on, a dead
  (expired) one's counts as spent, and a recorded one's row says how many were made."""
  state, before = held.before
  spent = (row or {}).get("attempts", 0)
  if before is None:
    return spent + 1
  if state == "expired":
    return max(spent, before["attempt"]) + 1
  if before["released"] in ("preempted", "skipped"):
    return max(spent + 1, before["attempt"])
  return spent + 1


@dataclasses.dataclass
class WorkerReport:
  """What one worker did: run ids it finished, failed and abandoned (lease lost)."""

  owner: str
  done: list[str] = dataclasses.field(default_factory=list)
  failed: list[str] = dataclasses.field(default_factory=list)
  lost: list[str] = dataclasses.field(default_factory=list)


def work(plan: LadderPlan, *, owner: str | None = None, on_claim=None, on_row=None,
         say=console.say) -> WorkerReport:
  """Claims and runs runs of ``plan`` until none is left for this worker.

  Args:
    owner: this worker's id (default ``host-pid``).
    on_claim: called with (run, lease generation, attempt) when a run starts
      (default: a ``worker W: run R`` line through ``say``).
    on_row: called with each recorded row (progress display).
    say: where the worker's lines go.
  Returns:
    the :class:`WorkerReport`.
  Raises:
    Preempted: SIGTERM stopped a run after a checkpoint; its lease is released
      so another worker can resume it at once.
  """
  owner = owner or lease_lib.worker_id()
  lc = plan.config.ladder
  table, leases = plan.table, plan.leases(owner)
  report, failed_here = WorkerReport(owner), set()
  while True:
    table.refresh()
    order = _claim_order(plan, table, failed_here)
    if not order:
      return report
    claimed = _claim_first(plan, table, leases, order, failed_here)
    if claimed is None:  # every claimable run is held by a live worker
      time.sleep(lc.poll_s)
      continue
    r, held = claimed
    if held.attempt > lc.max_attempts:  # its workers died max_attempts times: record it failed
      row = {"run_id": r.run_id, "C_budget": r.C_budget, "N": r.counts.total, "status": "failed",
             "attempts": held.attempt - 1, "worker": owner,
             "error": f"RunAbandoned: its worker died or was lost in each of "
                      f"{held.attempt - 1} attempts (ladder.max_attempts={lc.max_attempts})"}
    elif not plan.ready(r):  # a wsd cooldown whose trunk failed (a later attempt may find it)
      row = {"run_id": r.run_id, "C_budget": r.C_budget, "N": r.counts.total, "status": "failed",
             "attempts": held.attempt, "worker": owner,
             "error": f"TrunkFailed: its wsd trunk {wsd_lib.depends_on(plan.wsd_plans, r)[0]} "
                      f"failed, so its branch checkpoint does not exist"}
    else:
      if on_claim is None:
        say(f"worker {owner}: run {r.run_id} (lease {held.gen}, attempt {held.attempt})")
      else:
        on_claim(r, held.gen, held.attempt)
      row = run_under_lease(plan, r, held, lc.heartbeat_s)
      if row is None:
        say(f"worker {owner}: lost the lease of {r.run_id} to another worker; leaving it")
        report.lost.append(r.run_id)
        continue
    table.upsert(row)
    held.release()
    if row["status"] == "done":
      report.done.append(r.run_id)
    else:
      failed_here.add(r.run_id)
      report.failed.append(r.run_id)
      say(f"\nrun {r.run_id} failed: {row['error']}")
    if on_row is not None:
      on_row(row)


def _claim_first(plan, table, leases, order, failed_here):
  """(run, lease) of the first run in ``order`` this worker could claim, or None.

  The row is read again under the new lease (another worker may have just
  recorded the run); the lease's attempt is set and written at once.
  """
  for r in order:
    if not plan.ready(r) and not _trunk_failed(plan, table, r, failed_here):
      continue  # a wsd cooldown whose branch checkpoint is not saved yet
    held = leases.try_claim(r.run_id)
    if held is None:
      continue
    prev = table.row(r.run_id)
    if not _claimable(prev, plan, failed_here):
      held.attempt = held.before[1].get("attempt", 0) if held.before[1] else 0
      held.release("skipped")
      continue
    held.attempt = _attempt(prev, held)
    held.beat()
    return r, held
  return None


def _trunk_failed(plan: LadderPlan, table: table_lib.ResultsTable, r: grid.LadderRun,
                  failed_here: set[str]) -> bool:
  """Whether ``r`` is a wsd cooldown whose trunk is recorded failed and will not be retried by
  this worker (it failed here, or ``ladder.max_attempts`` times)."""
  dep = None if plan.wsd_plans is None else wsd_lib.depends_on(plan.wsd_plans, r)
  if dep is None:
    return False
  row = table.rows.get(dep[0])
  return (row is not None and row.get("status") != "done"
          and (dep[0] in failed_here
               or row.get("attempts", 1) >= plan.config.ladder.max_attempts))


def run_under_lease(plan, r, held: lease_lib.Lease, heartbeat_s: float) -> dict | None:
  """Trains ``r`` while a thread renews ``held``; its row, or None when the lease was lost.

  Raises:
    Preempted, KeyboardInterrupt: after releasing the lease (the run resumes
      from its checkpoint on whichever worker claims it next).
  """
  try:
    with _Heartbeat(held, heartbeat_s) as hb:
      row = train_run(plan, r, held.attempt, held.owner)
  except (distributed_lib.Preempted, KeyboardInterrupt) as e:
    if isinstance(e, KeyboardInterrupt) or not hb.lost:
      held.release("preempted")
      raise
    distributed_lib.install_sigterm_handler()  # clears the stop request made for the lost lease
    return None
  return None if hb.lost or held.lost() else row


def run_states(plan: LadderPlan, owner: str = "status") -> list[tuple[grid.LadderRun, str]]:
  """Each run (grid order) with its state: ``done``, ``failed xK``, ``running on W``, ``pending``."""
  table, leases = plan.table, plan.leases(owner)
  out = []
  for r in plan.runs:
    row = table.rows.get(r.run_id)
    state, content = leases.state(r.run_id)
    if state == "held" and (row is None or row.get("status") != "done"):
      out.append((r, f"running on {content['owner']} (lease {content['gen']})"))
    elif row is None:
      out.append((r, "pending"))
    elif row.get("status") == "done":
      out.append((r, "done"))
    else:
      out.append((r, f"failed x{row.get('attempts', 1)}: {row.get('error', '')}"))
  return out


def claim_fit(table_path: pathlib.Path) -> bool:
  """True for exactly one caller once the ladder is settled (every run recorded, no live lease).

  The claim is keyed by the table's content (run ids, statuses, attempts), so a
  later change of the table (a retried run) can be fitted again.
  """
  workdir = pathlib.Path(table_path).parent
  grid_path = workdir / GRID_FILE
  if not grid_path.exists():
    return False
  run_ids = json.loads(grid_path.read_text())
  rows = table_lib.ResultsTable(table_path, run_ids).rows
  if any(i not in rows for i in run_ids):
    return False
  leases = lease_lib.Leases(workdir / lease_lib.LEASES_DIR, "fit", math.inf)
  if any(leases.state(i)[0] == "held" for i in run_ids):
    return False
  key = json.dumps([(i, rows[i].get("status"), rows[i].get("attempts", 1)) for i in run_ids])
  claims = workdir / FIT_CLAIMS_DIR
  claims.mkdir(exist_ok=True)
  table_lib.ResultsTable(table_path, run_ids).merge()
  return files.create_exclusive(claims / hashlib.sha256(key.encode()).hexdigest()[:16],
                                lease_lib.worker_id())
