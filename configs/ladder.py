"""Ladder configs: `chinchax ladder --config configs/ladder.py:VARIANT`.

Overrides: `--config.ladder.c_max=3e12`, `--config.train_config.train.seq_len=256`.
Workers: `--config.ladder.workers=2` (local processes), `--config.ladder.worker=True` (one of
many sharing the workdir: launch/slurm_ladder.sbatch, tpu_ladder.sh, gke_ladder.yaml),
`--config.ladder.status=True` (each run's state).

Time budgets: `--config.ladder.budget_kind=seconds` with `ladder.t_min`, `ladder.t_max` (seconds)
and `ladder.depths` turns any variant into an IsoTime ladder.

Schedules and rules: `--config.ladder.schedule=wsd` (one trunk per shape, cooldowns off it),
`--config.ladder.hparams=fixed|deepseek|porian`, `--config.ladder.validate=False`.

Tuning: `--config.ladder.lr_trials=3` trains every run at ×0.5, ×1 and ×2 the rule's LR in one
program and fits each point's best; `--config.ladder.seeds=2` repeats each with two init seeds
(chinchax.ladder.tuning; the report is fit/tuning.md).

Variants:
  default    5 IsoFLOP budgets (2.5e10 … 8e11 FLOPs) × 5 sizes on the embedded stdlib corpus
             (bytes), then a validation run at 3 × 8e11.
  gutenberg  the same grid on ../shared/corpora/gutenberg-en/*.txt with a trained BPE tokenizer.
  isotime    "Time Matters": 3 time budgets (4, 12.6, 40 s of training per run on one core) ×
             3 N levels × n_layers 1, 2, 4 at ≈ equal N; warmup-stable-decay runs whose
             steps are fixed at the decay from their own measured step time
             (ladder.time_control=decay); then a validation run of 120 s
             (chinchax.ladder.isotime, isoclock, analysis.isotime.fit).
  repeat     data-constrained: 4 IsoFLOP budgets (1e10 … 2.56e11) × 5 sizes, each trained at
             ladder.unique_tokens = 0 (the whole split), 400,000 and 100,000 tokens of whole
             documents drawn in a seeded random order (data.unique_tokens, data.unique_order:
             up to ~45 epochs), then a validation run fixed by
             the config at 200,000 unique tokens and 2 × 2.56e11 FLOPs (docs/data-constrained.md).
  tiny       3 × 3 very small runs, for tests.
  repeat_tiny  tiny with ladder.unique_tokens = 0,5000, for tests.
"""

from chinchax import config as config_lib


def get_config(variant: str = "default"):
  """Returns the ladder ConfigDict of a named variant (see module doc)."""
  return config_lib.get_ladder_variant(variant or "default")
