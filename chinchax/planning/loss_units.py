"""Which of a plan's loss figures may be printed, and in what units (``chinchax.laws.units``).

:func:`judge` compares the law's units with the tokens the plan trains on
(:func:`chinchax.laws.units.plan_units`):

* the same tokenizer: the law's L(N, D) is the plan's predicted loss, unless it
  exceeds ln(vocab_size), a uniform guess's loss: then it is refused as
  impossible (the law does not hold at this size) and withheld;
* another tokenizer: no predicted loss; the law's own loss is kept, labelled in
  the law's units (e.g. "Chinchilla's MassiveText tokens"), when it is possible
  in those units, with a note that it does not transfer;
* bits per byte beside it where both sides know their bytes per token.

The plan's ``predicted_loss`` and its candidates' and dollar curve's losses are
cleared where they are not the plan's own; ``plan.loss_units`` says why.
"""

from __future__ import annotations

import math
import re

from chinchax.laws import units as law_units
from chinchax.planning import planner


def _possible(loss, units: law_units.LossUnits):
  return loss if loss is not None and units.possible(loss) else None


def judge(plan: planner.Plan, plan_units: law_units.LossUnits) -> None:
  """Sets ``plan.loss_units`` and clears the loss figures that are not the plan's own.

  ``plan.loss_units``: {"law": the law's units, "plan": the plan's, "transfers": bool,
  "law_loss": the law's L(N, D) in its own units (None when impossible there),
  "law_loss_impossible": bool, "law_bits_per_byte", "note": one line for the report}.
  """
  units = getattr(plan.law, "units", None) or law_units.LossUnits.unknown()
  law_loss = plan.predicted_loss
  transfers = units.same_tokenizer(plan_units) or not units.known
  own = plan_units if transfers else units  # whose vocabulary bounds the loss
  ceiling = own.ceiling
  impossible = law_loss is not None and ceiling is not None and law_loss > ceiling
  info = {"law": units.to_dict(), "plan": plan_units.to_dict(), "transfers": transfers,
          "law_loss": None if impossible else law_loss, "law_loss_impossible": impossible,
          "law_bits_per_byte": None if impossible else units.bits_per_byte(law_loss),
          "ceiling": ceiling}
  vocab = own.vocab_size
  if law_loss is None:
    note = "the law predicts no loss (an allocation only)"
  elif impossible:
    note = (f"the law's L(N, D) here exceeds ln({vocab:,}) = {ceiling:.3f} nats/token, the loss "
            f"of a uniform guess over {'the plan' if transfers else 'the law'}'s {vocab:,}-token "
            f"vocabulary: impossible, so the law does not hold at this size and no loss is "
            f"predicted")
  elif not units.known:
    note = ("the law file records no tokenizer: its loss is printed as it is, in the unknown "
            "tokens of the runs it was fitted on")
  elif transfers:
    note = f"the plan trains the law's tokens ({units.describe()})"
  else:
    note = (f"the law's loss is in {units.describe()}; this plan trains "
            f"{plan_units.label or plan_units.tokenizer}, so it does not transfer: any loss "
            f"shown is the law's, in its units (it ranks shapes), not this plan's predicted loss")
  info["note"] = note
  plan.loss_units = info
  if not transfers or impossible:
    plan.predicted_loss = None
  _clear_rows(plan, units, plan_units, transfers)
  _clear_comparison(plan, units, own, transfers)


_GAIN = re.compile(r"predicted loss (\S+) vs (\S+) nats/token \(−\S+\)")


def _clear_comparison(plan: planner.Plan, units: law_units.LossUnits,
                      own: law_units.LossUnits, transfers: bool) -> None:
  """A time plan's "vs FLOP-opt" sentence and rows: losses only where possible, labelled."""
  comp = plan.comparison
  if not comp or not comp.get("summary"):
    return
  m = _GAIN.search(comp["summary"])
  if m is None:
    return
  losses = [float(m.group(1)), float(m.group(2))]
  if not all(own.possible(x) for x in losses):
    text = "a lower loss under the law (values withheld: above ln of the vocabulary, impossible)"
    comp["loss_gain"] = None
  elif transfers:
    return
  else:
    text = (f"law's loss {losses[0]:.4f} vs {losses[1]:.4f} in the law's units "
            f"(does not transfer to this plan's tokens)")
  comp["summary"] = comp["summary"][:m.start()] + text + comp["summary"][m.end():]
  for key in ("flop_optimal", "best"):
    row = comp.get(key)
    if isinstance(row, dict) and row.get("predicted_loss") is not None:
      loss = row["predicted_loss"]
      row["predicted_loss"] = loss if transfers and own.possible(loss) else None


def _clear_rows(plan: planner.Plan, units: law_units.LossUnits,
                plan_units: law_units.LossUnits, transfers: bool) -> None:
  """Candidates' and dollar-curve losses: kept where they are the plan's own and possible,
  else moved to ``law_loss`` (in the law's units, when possible there)."""
  own = plan_units if transfers else units
  for row in list(plan.candidates or []) + list(plan.dollar_curve or []):
    loss = row.get("predicted_loss")
    if loss is None or (isinstance(loss, float) and not math.isfinite(loss)):
      continue
    if transfers:
      row["predicted_loss"] = _possible(loss, own)
    else:
      row["law_loss"] = _possible(loss, units)
      row["predicted_loss"] = None


def lines(plan: planner.Plan) -> list[str]:
  """The report's loss lines: the units, then the predicted loss or why there is none."""
  info = plan.loss_units
  if info is None:
    return []
  law_u = law_units.LossUnits.from_dict(info["law"])
  out = [f"  law units      {law_u.describe()}"]
  if plan.predicted_loss is not None:
    bpb = law_units.LossUnits.from_dict(info["plan"]).bits_per_byte(plan.predicted_loss)
    extra = f" ({bpb:.4f} bits/byte)" if bpb is not None and info["transfers"] else ""
    out.append(f"  predicted loss {plan.predicted_loss:.4f} nats/token{extra}")
  elif info["law_loss"] is not None and not info["transfers"]:
    bpb = info.get("law_bits_per_byte")
    extra = f", {bpb:.4f} bits/byte" if bpb is not None else ""
    out.append(f"  law's loss     {info['law_loss']:.4f} {law_u.describe()}{extra}: does not "
               f"transfer to this plan's tokens")
  out.append(f"  loss note      {info['note']}")
  return out


def frontier_text(plan: planner.Plan) -> str:
  """The "frontier loss" clause of the optimum line: only a possible loss, with its units."""
  a, info = plan.allocation, plan.loss_units
  if a.loss is None:
    return ""
  if info is None:
    return f", frontier loss {a.loss:.4f} nats/token"
  law_u = law_units.LossUnits.from_dict(info["law"])
  own = law_units.LossUnits.from_dict(info["plan"]) if info["transfers"] else law_u
  if not own.possible(a.loss):
    return ", frontier loss withheld (above ln of the vocabulary: impossible)"
  where = "nats/token" if info["transfers"] else "in the law's units"
  return f", frontier loss {a.loss:.4f} {where}"


def loss_text(plan: planner.Plan, loss: float) -> str | None:
  """One loss of the law at another (N, D) than the plan's (the data-limit block): the value
  with its units ("nats/token" in the plan's tokens, else "in the law's units"), or None when
  it is above ln of the vocabulary (impossible, withheld)."""
  info = plan.loss_units
  if info is None:
    return f"{loss:.4f} nats/token"
  law_u = law_units.LossUnits.from_dict(info["law"])
  own = law_units.LossUnits.from_dict(info["plan"]) if info["transfers"] else law_u
  if not own.possible(loss):
    return None
  return f"{loss:.4f} {'nats/token' if info['transfers'] else 'in the law' + chr(39) + 's units'}"
