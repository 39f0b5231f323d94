"""Bench configs: `chinchax bench --config configs/bench.py:VARIANT`.

Overrides: `--config.bench.timed_steps=10`, `--config.sweeps.size.global_batch_size=8,16,32`,
`--config.train_config.train.z_loss=1e-4`.

Variants:
  default  19 points on 8 virtual CPU devices: 5 sizes × 2 batches (fits the step-time models),
           mesh layouts (fsdp, tp, 2x2x2), remat (full, dots), cuDNN attention (falls back to
           xla on CPU), bfloat16, a mesh that does not fit and an oversized model (both recorded
           as failed). 3–7 minutes on a shared 2-core CPU, depending on its load.
  h200     one GPU: ~110M (m125) and ~342M (m350) models (vocab 32768, seq_len 1024, bfloat16),
           XLA vs cuDNN attention at two batch sizes each (benchmarks/h200_bench.sh).
  tiny     two points and an invalid mesh, in one process; for tests.
"""

from chinchax import config as config_lib


def get_config(variant: str = "default"):
  """Returns the bench ConfigDict of a named variant (see module doc)."""
  return config_lib.get_bench_variant(variant or "default")
