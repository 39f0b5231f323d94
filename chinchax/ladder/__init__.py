"""A miniature Chinchilla ladder: IsoFLOP grid → claimable runs → one results table → fit.

The grid (:mod:`~chinchax.ladder.grid`) places ``sizes_per_budget`` model sizes
around the predicted optimum of each FLOP budget. Each run is an idempotent
unit of the shared workdir — a lease (:mod:`~chinchax.storage.lease`), its
training workdir with checkpoints, and one result row
(:mod:`~chinchax.ladder.table`) — so one process, K local processes
(:mod:`~chinchax.ladder.local`) or workers on many machines
(:mod:`~chinchax.ladder.worker`) run the ladder the same way: a rerun skips
recorded runs and resumes unfinished ones from their checkpoints, a failed run
is recorded and retried a bounded number of times, and a dead worker's run is
taken over when its lease expires. ``chinchax ladder`` then has the analysis
package fit Approaches 1–3 (Hoffmann et al. 2022, Sec. 3) to the table, once,
and trains a held-out validation run at a larger budget with the fitted law's
N_opt (:mod:`~chinchax.ladder.validation`).
"""

from chinchax.ladder.driver import (FIT_FAILED_EXIT_CODE, INCOMPLETE_EXIT_CODE, RUNS_FAILED_EXIT_CODE,
                                    WORKER_DIED_EXIT_CODE, describe, failed_rows, finish_line,
                                    run_ladder)
from chinchax.ladder.grid import LadderRun, plan_runs, run_config, validate_ladder
from chinchax.storage.lease import Lease, Leases, worker_id
from chinchax.ladder.local import (LocalResult, die_with_parent, is_local_worker,
                                   run_local_workers, worker_command)
from chinchax.ladder.progress import LadderProgress, duration, fit_seconds
from chinchax.ladder.repeat import axis_of as unique_axis
from chinchax.ladder.table import ResultsTable
from chinchax.ladder.tuning import tuned
from chinchax.ladder.validation import plan_validation, run_validation
from chinchax.ladder.answer import closing_lines
from chinchax.ladder.worker import (LadderPlan, WorkerReport, claim_fit, fit_settled, prepare,
                                    run_states, settle_fit_claim, train_run, work)

__all__ = [
    "FIT_FAILED_EXIT_CODE", "INCOMPLETE_EXIT_CODE", "RUNS_FAILED_EXIT_CODE", "WORKER_DIED_EXIT_CODE", "LadderProgress",
    "LocalResult", "die_with_parent", "failed_rows", "is_local_worker", "settle_fit_claim",
    "LadderPlan", "LadderRun", "Lease", "Leases", "ResultsTable", "WorkerReport", "claim_fit",
    "closing_lines", "describe", "duration", "fit_seconds", "finish_line", "fit_settled", "plan_runs", "plan_validation", "prepare", "run_config",
    "run_ladder", "run_local_workers", "run_states", "run_validation", "train_run", "tuned",
    "unique_axis",
    "validate_ladder", "work", "worker_command", "worker_id",
]
