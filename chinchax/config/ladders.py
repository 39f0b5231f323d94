"""The data-constrained ladder variants ``repeat`` and ``repeat_tiny`` (a unique-data axis).

Kept beside :mod:`chinchax.config.defaults`, which returns them from
``get_ladder_variant``; see ``configs/ladder.py`` and docs/repeat.md.
"""

from __future__ import annotations

REPEAT_VARIANTS = ("repeat", "repeat_tiny")


def repeat_variant(c, name: str):
  """``c`` (the default ladder for ``repeat``, the ``tiny`` one for ``repeat_tiny``) made a
  data-constrained ladder: every (C, N) of its grid at each unique-data size of
  ``ladder.unique_tokens`` (0 = the whole split: the base grid), repetition allowed, and a
  validation run at a unique size and epoch count the grid never trains.

  ``repeat`` on the stdlib corpus (bytes, seq_len 64): 4 budgets 1e10 … 2.56e11 FLOPs × 5 sizes
  (N_opt/2.5 … N_opt·2.5, D 0.08 … 4.1 M tokens) at U = whole split (≤ 0.14 epochs), 400,000
  and 100,000 tokens (whole documents drawn in a seeded random order, ``data.unique_order``:
  about 0.2 … 10 and 0.9 … 45 epochs); validation at U = 200,000, C = 2 × 2.56e11 (≈ 11
  epochs). Smaller sets (40,000 tokens: 6 documents) sit 0.19 nats/token above fresh data at
  two epochs, a sampling gap that no repetition law describes.
  """
  if name == "repeat":
    c.workdir = "runs/ladder-repeat"
    c.ladder.update(c_min=1e10, c_max=2.56e11, n_budgets=4, sizes_per_budget=5, spread=2.5,
                    unique_tokens="0,400000,100000", validate_unique_tokens=200000,
                    validate_factor=2.0)
    # A uniform sample of whole documents: the store's first ones are the alphabetically first
    # stdlib modules, unlike the validation split (docs/data-constrained.md).
    c.train_config.data.update(allow_repeat=True, max_epochs=200.0, unique_order="shuffled")
    return c
  c.workdir = "runs/ladder-repeat-tiny"
  c.ladder.update(unique_tokens="0,5000", validate_unique_tokens=8000, validate_factor=1.5)
  c.train_config.data.update(allow_repeat=True, max_epochs=500.0)
  return c
