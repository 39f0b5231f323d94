"""``chinchax ladder``: run (or resume) an IsoFLOP ladder, then fit its results table.

    chinchax ladder [--config configs/ladder.py:VARIANT] [--config.ladder.KNOB=VALUE ...]

One process by default; ``--config.ladder.workers=K`` starts K local workers;
``--config.ladder.worker=True`` makes this process one of many workers sharing
the workdir (SLURM arrays, TPU VMs, GKE: ``launch/*_ladder*``);
``--config.ladder.status=True`` prints each run's state and exits, writing nothing.

Example:
  chinchax ladder --config configs/ladder.py:tiny --config.workdir=runs/ladder-tiny
  chinchax ladder --config.ladder.status=True
"""

from __future__ import annotations

import sys

import jax

from analysis import pipeline as fit_pipeline
from chinchax import config as config_lib
from chinchax import console
from chinchax import distributed as distributed_lib
from chinchax import errors
from chinchax import ladder as ladder_lib
from chinchax import runtime
from chinchax.cli import flags as flags_lib


def _fit(config, table, devices=None) -> None:
  """Approaches 1–3 on the table into ``fit/`` beside it, then (``ladder.validate``) the
  validation run on ``devices`` (default: all) and its comparison; a fit that fails keeps
  the runs."""
  lc = config.ladder
  try:
    fit_pipeline.fit_results(table, table.parent / "fit", n_bootstrap=lc.bootstrap,
                             log=console.say, warn=console.warn)
  except errors.UserError as e:  # the runs are kept; `chinchax fit` can be rerun on the table
    console.warn(f"could not fit the table {table}: {e}")
    return
  if not lc.validate:
    return
  plan = ladder_lib.prepare(config, devices, check_data=False)
  if ladder_lib.run_validation(plan, table.parent / "fit" / "fit.json") is not None:
    fit_pipeline.add_validation(table, table.parent / "fit", log=console.say)


def main(argv: list[str]) -> int:
  """Runs the ladder's missing runs, then (``ladder.fit``) Approaches 1–3 on its table, once.

  Returns 0, or 75 when a worker was preempted after a checkpoint (rerun to
  resume).

  Raises:
    UserError: bad flags or config, a corpus too small for the grid.
  """
  config = flags_lib.parse_config(argv, flags_lib.config_file("ladder.py"), "ladder")
  if config is None:
    return 0
  lc = config.ladder
  ladder_lib.validate_ladder(lc)
  config_lib.validate(config.train_config)
  local_workers = lc.workers > 1 and not lc.worker
  n_cpu = config.train_config.mesh.num_cpu_devices
  # With local workers this process trains only the validation run, after them: on CPU it takes
  # one device per worker's core (data parallel), which is 1.3x faster than one device on the
  # same cores (benchmarks/ladder_acceptance.sh; README, "The miniature ladder").
  runtime.setup_cpu_devices(max(n_cpu, lc.workers) if local_workers and n_cpu else n_cpu)
  runtime.setup_compilation_cache(config.train_config.compile_cache_dir)
  # The grid as a worker plans it (batches rounded to its own devices).
  worker_devices = (jax.devices()[:n_cpu] if local_workers and n_cpu
                    and jax.default_backend() == "cpu" else None)
  if lc.status:
    plan = ladder_lib.prepare(config, worker_devices, check_data=False, write=False)
    ladder_lib.describe(plan)
    console.say(ladder_lib.finish_line(plan))
    return 0
  if local_workers:
    plan = ladder_lib.prepare(config, worker_devices)  # builds the token store once, first
    ladder_lib.describe(plan)
    code = ladder_lib.run_local_workers(argv, lc.workers, pin=lc.pin_cpus)
    console.say(ladder_lib.finish_line(plan))
    if code == 0 and lc.fit and ladder_lib.claim_fit(plan.workdir / "results.jsonl"):
      _fit(config, plan.workdir / "results.jsonl", jax.devices())
    return code
  distributed_lib.install_sigterm_handler()
  try:
    table = ladder_lib.run_ladder(config)
  except distributed_lib.Preempted as e:
    console.say(str(e), stream=sys.stderr, enabled=console.primary())
    return distributed_lib.PREEMPTED_EXIT_CODE
  if lc.fit and console.primary() and (ladder_lib.claim_fit(table) or not lc.worker):
    _fit(config, table)
  return 0
