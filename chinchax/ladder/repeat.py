"""A data-constrained ladder: the IsoFLOP grid trained at each of several unique-data sizes.

``ladder.unique_tokens`` = ``"0,187000,48000"`` trains every (C, N) of the
grid once per unique-data size U (``data.unique_tokens`` of the run: the first
U tokens of the training split, whole documents, read in epochs;
:mod:`chinchax.data.unique`). U = 0 is the whole split (every token new: the
base Chinchilla grid, fitted from the same ladder); a smaller U makes the
larger budgets read their data many times, as a fixed corpus does. A run at
U > 0 has the id ``U<U>_C<C>_N<N>``; its row records ``unique_tokens`` (U
after rounding to documents), ``epochs`` and ``repeated_tokens``
(Muennighoff et al. 2023, "Scaling Data-Constrained Language Models").

The validation run of such a ladder is fixed by its config, not by a fit:
``ladder.validate_unique_tokens`` at C = ``ladder.validate_factor`` ×
``ladder.c_max`` with the grid's centre rule N = sqrt(C / (6 ·
``ladder.tokens_per_param``)), a (U, epochs) the grid never trained, recorded
for a data-constrained fit to predict (:mod:`chinchax.ladder.validation`).
"""

from __future__ import annotations

import dataclasses

from chinchax import config as config_lib


def parse_axis(text) -> tuple[int, ...]:
  """``ladder.unique_tokens`` as distinct non-negative token counts in the given order; ()
  for ``""`` (no axis).

  Raises:
    ConfigError: not a comma-separated list of distinct integers >= 0.
  """
  parts = [p.strip() for p in str(text).split(",") if p.strip()]
  try:
    sizes = [int(float(p)) for p in parts]
  except ValueError:
    sizes = None
  if (sizes is None or any(u < 0 for u in sizes) or len(set(sizes)) != len(sizes)
          or any(float(p) != u for p, u in zip(parts, sizes))):
    raise config_lib.ConfigError(
        f"ladder.unique_tokens={text!r} must be distinct integers >= 0 separated by commas "
        f"(unique-data sizes in tokens; 0 = the whole training split), e.g. '0,187000,48000'")
  return tuple(sizes)


def validate_axis(lc) -> None:
  """Checks the unique-data axis against the rest of the ladder section.

  Raises:
    ConfigError: a bad ``ladder.unique_tokens`` or ``ladder.validate_unique_tokens``, or the
      axis with an IsoTime ladder or a wsd schedule (a trunk is one data stream per shape).
  """
  axis = parse_axis(lc.unique_tokens)
  v = lc.validate_unique_tokens
  if not isinstance(v, int) or isinstance(v, bool) or v < 0:
    raise config_lib.ConfigError(
        f"ladder.validate_unique_tokens={v!r} must be an integer >= 0 (the validation run's "
        f"data.unique_tokens with a ladder.unique_tokens axis; 0 = the whole split)")
  if not axis:
    return
  if lc.budget_kind != "flops":
    raise config_lib.ConfigError(
        f"ladder.unique_tokens={lc.unique_tokens!r} needs ladder.budget_kind='flops' (IsoFLOP "
        f"budgets); an IsoTime ladder has no unique-data axis")
  if lc.schedule != "cosine":
    raise config_lib.ConfigError(
        f"ladder.unique_tokens={lc.unique_tokens!r} needs ladder.schedule='cosine': a wsd "
        f"trunk and its cooldowns share one data stream, which differs with the unique size")


def expand(runs: list, lc) -> list:
  """The grid's runs once per unique-data size of ``ladder.unique_tokens`` (its order), each
  with ``unique_tokens`` set and, for U > 0, the id prefix ``U<U>_``; ``runs`` as they are
  without an axis."""
  axis = parse_axis(lc.unique_tokens)
  if not axis:
    return runs
  return [dataclasses.replace(r, unique_tokens=u, run_id=f"{prefix(u)}{r.run_id}")
          for u in axis for r in runs]


def prefix(unique_tokens: int) -> str:
  """The run-id prefix of a run at ``unique_tokens`` (``U<U>_``; none for 0, the whole split)."""
  return f"U{unique_tokens}_" if unique_tokens else ""


def axis_of(lc) -> tuple[int, ...]:
  """The ladder's unique-data sizes, () without an axis."""
  return parse_axis(lc.unique_tokens)
