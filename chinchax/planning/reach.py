"""What a FLOP budget can buy: the smallest budget the planner serves, and plans off budget.

The shape rule has a smallest shape (``chinchax.planning.shapes``) and a run has
at least one step of at least one sequence per data-parallel device, so a FLOP
budget below 6·N_min·seq_len cannot be planned (:func:`check_one_step` says
what the smallest one is); above it, whole steps can still move 6ND away from
the budget (:func:`budget_warnings`).
"""

from __future__ import annotations

import math

from chinchax.cost import budget
from chinchax.planning import shapes as shapes_lib
from chinchax.planning.errors import PlanError

# A plan whose 6ND differs from its FLOP budget by more than this fraction says so.
BUDGET_TOLERANCE = 0.10
# The chosen shape is this many times N* or more: the budget is below what the shape rule serves.
OVERSIZE_FACTOR = 2.0


def round_up(x: float, digits: int = 2) -> float:
  """``x`` rounded up to ``digits`` significant digits (5.647e9 → 5.7e9)."""
  scale = 10.0 ** (math.floor(math.log10(x)) - digits + 1)
  return math.ceil(x / scale - 1e-9) * scale


def smallest_flops(vocab_size: int, seq_len: int, accelerator: bool,
                   batch_multiple: int = 1) -> tuple[shapes_lib.ShapeCandidate, float]:
  """(the shape rule's smallest shape, its FLOPs for one step of ``batch_multiple`` sequences).

  That step's 6·N·D, D = ``batch_multiple`` × ``seq_len`` tokens, is the
  smallest FLOP budget the planner can serve.
  """
  smallest = shapes_lib.propose_shapes(1.0, vocab_size=vocab_size, seq_len=seq_len,
                                      accelerator=accelerator, k=1)[0]
  return smallest, budget.flops_6nd(smallest.N, batch_multiple * seq_len)


def check_one_step(C: float, chosen: shapes_lib.ShapeCandidate, tokens_per_step: int,
                    vocab_size: int, seq_len: int, accelerator: bool) -> None:
  """Raises PlanError when C / (6·N) of the chosen shape is less than one step of the smallest
  batch (``tokens_per_step``), naming the smallest budget that trains one step."""
  if C / (6.0 * chosen.N) >= tokens_per_step:
    return
  smallest, c_min = smallest_flops(vocab_size, seq_len, accelerator, tokens_per_step // seq_len)
  s = smallest.shape
  raise PlanError(
      f"--flops {C:.3g} cannot train one step: the smallest admissible shape (d_model "
      f"{s.d_model}, n_layers {s.n_layers}, N {smallest.N:,} params) needs 6·N·D = {c_min:.3g} "
      f"FLOPs for one step of {tokens_per_step:,} tokens ({tokens_per_step // seq_len} × seq_len "
      f"{seq_len}); give --flops {round_up(c_min):.2g} or more, or a shorter --seq-len")


def budget_warnings(plan, C: float) -> list[str]:
  """Warnings on a FLOP-budget plan (a ``planner.Plan``): when its 6ND is more than :data:`BUDGET_TOLERANCE` off the FLOP budget
  (whole steps), or its shape :data:`OVERSIZE_FACTOR` × N* or more (the smallest shapes)."""
  out = []
  rel = plan.C / C - 1.0
  if abs(rel) > BUDGET_TOLERANCE:
    out.append(f"the plan trains 6ND = {plan.C:.3g} FLOPs, {100 * rel:+.0f}% off the budget "
               f"{C:.3g} FLOPs: it rounds to whole steps of {plan.batch.tokens_per_step:,} tokens "
               f"({plan.batch.steps} step(s)); a budget of many steps keeps within 10%")
  if plan.N >= OVERSIZE_FACTOR * plan.allocation.N:
    out.append(f"the chosen shape has {plan.N / plan.allocation.N:,.1f}× the law's N* "
               f"({plan.N:,} against {plan.allocation.N:,.0f} params): the shape rule has no "
               f"smaller shape, so this plan is not compute-optimal")
  return out
