"""Running the ladder: claim a run, train it under a heartbeat, record its row; repeat.

Every run of the grid is an idempotent unit of the shared workdir:

  ``leases/<run_id>.<gen>``  who runs it (:mod:`chinchax.storage.lease`)
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
import socket
import threading
import time

from chinchax import console
from chinchax.storage import diskfull
from chinchax.runtime import distributed as distributed_lib
from chinchax.runtime import interrupts
from chinchax.storage import atomic as files
import chinchax.ladder.grid as grid
from chinchax.storage import lease as lease_lib
import chinchax.ladder.table as table_lib
import chinchax.ladder.wsd as wsd_lib
from chinchax.ladder.plan import GRID_FILE, LadderPlan, check_corpus, prepare  # noqa: F401
from chinchax.ladder.trainrun import train_run

FIT_CLAIMS_DIR = "fit-claims"


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
    return max(spent, before.get("attempt", 0)) + 1
  if before.get("released") in ("preempted", "skipped"):
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
    if distributed_lib.stop_requested():  # SIGTERM or Ctrl-C after a run ended: no new one
      raise interrupts.stop_error(None, None)
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
    Preempted, KeyboardInterrupt, DiskFull: after releasing the lease (the run resumes
      from its checkpoint on whichever worker claims it next).
  """
  try:
    with _Heartbeat(held, heartbeat_s) as hb:
      row = train_run(plan, r, held.attempt, held.owner)
  except diskfull.DiskFull:  # the run is kept for a rerun, its attempt not spent
    try:
      held.release("preempted")
    except OSError:  # still full: the lease expires after ladder.lease_expiry_s
      pass
    raise
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
      out.append((r, f"running on {content.get('owner', '?')} (lease {content.get('gen', '?')})"))
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
  later change of the table (a retried run) can be fitted again. The claimer calls
  :func:`settle_fit_claim` when its fit ends; a claim on this host whose process died
  before that is taken over by the next caller.
  """
  workdir = files.as_path(table_path).parent
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
  claim = _fit_claim_path(workdir, run_ids, rows)
  claim.parent.mkdir(exist_ok=True)
  table_lib.ResultsTable(table_path, run_ids).merge()
  mine = json.dumps({"owner": lease_lib.worker_id(), "done": False})
  if files.create_exclusive(claim, mine):
    return True
  owner = _claim_content(claim).get("owner", "")
  host, _, pid = owner.rpartition("-")
  if (_claim_content(claim).get("done", True) or host != socket.gethostname()
          or not pid.isdigit() or _alive(int(pid))):
    return False
  # A fit on this host whose process died (e.g. killed) before it finished: take it over once.
  if not files.create_exclusive(claim.with_name(f"{claim.name}.after-{pid}"), mine):
    return False
  files.write_atomic(claim, mine)
  return True


def _fit_claim_path(workdir, run_ids, rows):
  key = json.dumps([(i, rows[i].get("status"), rows[i].get("attempts", 1)) for i in run_ids])
  return workdir / FIT_CLAIMS_DIR / hashlib.sha256(key.encode()).hexdigest()[:16]


def _claim_content(claim) -> dict:
  """A fit claim's content; an older plain-text claim (its owner) counts as a finished fit."""
  try:
    content = json.loads(claim.read_text())
  except (OSError, ValueError):
    return {"done": True}
  return content if isinstance(content, dict) else {"done": True}


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def fit_settled(plan: LadderPlan) -> bool:
  """Whether ``plan``'s ladder is finished: every run recorded ``done``, its fit claimed and
  settled (:func:`settle_fit_claim`, after the validation run), ``fit/fit.json`` written and,
  with ``ladder.validate``, a validation row ``done``. Reads only; a rerun then has nothing
  to train or fit."""
  run_ids = [r.run_id for r in plan.runs]
  rows = plan.table.refresh()
  if any(rows.get(i, {}).get("status") != "done" for i in run_ids):
    return False
  if not (plan.workdir / "fit" / "fit.json").exists():
    return False
  claim = _fit_claim_path(plan.workdir, run_ids, rows)
  if not claim.exists() or not _claim_content(claim).get("done"):
    return False
  return not plan.config.ladder.validate or any(
      r.get("role") == "validation" and r.get("status") == "done" for r in rows.values())


def settle_fit_claim(table_path: pathlib.Path, done: bool) -> None:
  """Marks this process's claim of the table's fit finished (``done``), or withdraws it (the fit
  was interrupted or failed: a rerun of the ladder fits again)."""
  workdir = files.as_path(table_path).parent
  run_ids = json.loads((workdir / GRID_FILE).read_text())
  rows = table_lib.ResultsTable(table_path, run_ids).rows
  claim = _fit_claim_path(workdir, run_ids, rows)
  if _claim_content(claim).get("owner") != lease_lib.worker_id():
    return
  if done:
    files.write_atomic(claim, json.dumps({"owner": lease_lib.worker_id(), "done": True}))
  else:
    claim.unlink()
