"""Ladder configs: `chinchax ladder --config configs/ladder.py:VARIANT`.

Overrides: `--config.ladder.c_max=3e12`, `--config.train_config.train.seq_len=256`.
Workers: `--config.ladder.workers=2` (local processes), `--config.ladder.worker=True` (one of
many sharing the workdir: launch/slurm_ladder.sbatch, tpu_ladder.sh, gke_ladder.yaml),
`--config.ladder.status=True` (each run's state).

Variants:
  default    4 IsoFLOP budgets (5e10 … 5e11 FLOPs) × 5 sizes on the embedded stdlib corpus.
  gutenberg  the same grid on ../shared/corpora/gutenberg-en/*.txt.
  tiny       3 × 3 very small runs, for tests.
"""

from chinchax import config as config_lib


def get_config(variant: str = "default"):
  """Returns the ladder ConfigDict of a named variant (see module doc)."""
  return config_lib.get_ladder_variant(variant or "default")
