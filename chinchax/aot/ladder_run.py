"""The run of a ladder that needs the most memory, as a train config ``chinchax compile`` compiles.

A ladder (``configs/ladder.py``) is many train runs; before its workers are
started on a slice, the one to check is the run whose parameters and
per-device tokens are largest: the largest size of the largest budget, with
its batch from the ladder's hyperparameter rule (``chinchax.ladder.grid``).
"""

from __future__ import annotations

import pathlib

from chinchax import config as config_lib
from chinchax.aot.topology import Target
from chinchax.ladder import grid
from chinchax.train import spec as spec_lib


def is_ladder_config(config) -> bool:
  """True for a ladder config (``ladder`` and ``train_config`` sections)."""
  return "ladder" in config and "train_config" in config


def largest_run_config(config, target: Target):
  """(train config of the ladder's largest run on ``target``, its run id).

  Raises:
    ConfigError: an invalid ladder or training config (as ``chinchax ladder`` would).
  """
  lc, base = config.ladder, config.train_config
  grid.validate_ladder(lc)
  n = target.n_devices
  config_lib.validate(base, n)
  vocab = spec_lib.resolve(base, n, backend=target.platform).model.vocab_size
  runs = grid.plan_runs(lc, base.train, vocab, batch_multiple=grid.data_parallel_size(base, n))
  run = max(runs, key=lambda r: (r.counts.total * r.hparams.global_batch_size, r.C_budget))
  return grid.run_config(base, run, pathlib.Path(config.workdir)), run.run_id
