"""``chinchax ladder``: run (or resume) an IsoFLOP ladder, then fit its results table."""

from __future__ import annotations

from analysis import pipeline as fit_pipeline
from chinchax import config as config_lib
from chinchax import console
from chinchax import errors
from chinchax import ladder as ladder_lib
from chinchax import runtime
from chinchax.cli import flags as flags_lib


def main(argv: list[str]) -> int:
  """Runs the ladder's missing runs, then (``ladder.fit``) Approaches 1–3 on its table.

  Raises:
    UserError: bad flags or config, a corpus too small for the grid.
  """
  config = flags_lib.parse_config(argv, flags_lib.config_file("ladder.py"), "ladder")
  if config is None:
    return 0
  ladder_lib.validate_ladder(config.ladder)
  config_lib.validate(config.train_config)
  runtime.setup_cpu_devices(config.train_config.mesh.num_cpu_devices)
  runtime.setup_compilation_cache(config.train_config.compile_cache_dir)
  table = ladder_lib.run_ladder(config)
  if config.ladder.fit and console.primary():
    try:
      fit_pipeline.fit_results(table, table.parent / "fit", n_bootstrap=config.ladder.bootstrap,
                               log=console.say, warn=console.warn)
    except errors.UserError as e:  # the runs are kept; `chinchax fit` can be rerun on the table
      console.warn(f"could not fit the table {table}: {e}")
  return 0
