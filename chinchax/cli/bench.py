"""``chinchax bench``: the throughput sweep of a bench config.

Example:
  chinchax bench --config configs/bench.py:tiny --config.bench.timed_steps=10
"""

from __future__ import annotations

import signal

from chinchax import bench as bench_lib
from chinchax.runtime import jax_settings as runtime
from chinchax.cli import flags as flags_lib


def main(argv: list[str]) -> int:
  """Measures every point of the sweep; SIGTERM (e.g. ``timeout``) stops it and keeps the rows.

  Raises:
    UserError: bad flags or config, an invalid sweep (checked before any point runs).
  """
  config = flags_lib.parse_config(argv, flags_lib.config_file("bench.py"), "bench")
  if config is None:
    return 0
  points = bench_lib.validate_bench(config)
  if not config.bench.isolate:  # this process runs the points: set up its devices first
    runtime.setup_cpu_devices(config.train_config.mesh.num_cpu_devices)

  def on_sigterm(signum, frame):
    raise KeyboardInterrupt

  signal.signal(signal.SIGTERM, on_sigterm)  # stop, write the partial outputs
  bench_lib.run_bench(config, points)
  return 0
