"""Planning with a data limit: ``chinchax plan --flops C --unique-tokens U``.

With only U unique tokens, a run of D > U tokens repeats data (D / U epochs), and repeated
tokens are worth less (:mod:`chinchax.laws.repeat`). The data-constrained optimum is the
(N, D = C / (6N)) of lowest loss under a repetition law at that U
(:class:`chinchax.laws.repeat.DataLimitedLaw`: a grid over N and Brent's method); it is
reported beside the unconstrained Chinchilla answer (the base law's N_opt, D_opt with
unlimited fresh data), with the loss the limit costs.

The repetition law: a fit file's ``repeat`` block (``chinchax fit`` on runs that repeat
data: its better form, with that form's base), else the given law (a published one such as
``chinchilla-approach3``, or a fit without repeated runs) with Muennighoff et al. 2023's
published decay constants R_D* = 15.39 and R_N* = 5.31 (arXiv 2305.16264, Sec. 3; values
from github.com/huggingface/datablations), which the plan says. When U is at least the
unconstrained D_opt, the constrained optimum is the unconstrained one (both forms equal the
base law there).
"""

from __future__ import annotations

import dataclasses
import math

from chinchax.laws import parametric as laws
from chinchax.laws import repeat as lr
from chinchax.planning.errors import PlanError


def parse_unique_tokens(text) -> float:
  """``--unique-tokens`` as a float; PlanError (one line) unless it is a number > 0."""
  try:
    value = float(text)
  except (TypeError, ValueError):
    raise PlanError(f"--unique-tokens must be a number of tokens > 0 (e.g. 2e9), got "
                    f"{text!r}") from None
  if not (math.isfinite(value) and value > 0):
    raise PlanError(f"--unique-tokens must be a finite number of tokens > 0 (e.g. 2e9), got "
                    f"{text!r}")
  return value


def _repeat_block(spec: str) -> dict | None:
  try:
    d = laws.read_law_file(spec)  # local or gs://
  except (OSError, ValueError):
    return None
  if d is None:
    return None
  block = d.get("repeat") if isinstance(d, dict) else None
  return block if isinstance(block, dict) and block.get("status") == "ok" else None


def repeat_law(spec, base: laws.ParametricLaw | None = None) -> tuple[lr.RepeatLaw, str]:
  """The repetition law for ``--law spec`` and a line saying where its terms come from.

  Args:
    spec: a law name or fit-file path (as ``--law``).
    base: the law ``spec`` names, already loaded (None: loaded here).

  Raises:
    PlanError: a law without a loss (Chinchilla Approaches 1 and 2 only allocate).
  """
  base = base if base is not None else laws.get_law(spec)
  block = _repeat_block(spec)
  if not isinstance(base, laws.ParametricLaw) and block is None:
    raise PlanError(f"--unique-tokens needs a law that predicts loss (Approach 3 form), and "
                    f"{getattr(base, 'name', spec)!r} only allocates compute; use e.g. "
                    f"--law chinchilla-approach3 or a fit JSON")
  if block is not None:  # a fit whose top-level law only allocates (--approach 2) still
    form = block["form"]  # holds the repetition law's base in its repeat block
    form_base = None
    for b in (block[form].get("base"), block.get("base")):
      try:
        form_base = laws.ParametricLaw(
            name=base.name, E=float(b["E"]), A=float(b["A"]), B=float(b["B"]),
            alpha=float(b["alpha"]), beta=float(b["beta"]), source=base.source,
            fit_range_flops=base.fit_range_flops, units=base.units)
        break
      except (KeyError, TypeError, ValueError):
        continue
    if form_base is None:
      if not isinstance(base, laws.ParametricLaw):
        raise PlanError(f"--law {spec!r}: its repeat block records no base law (E, A, B, "
                        f"alpha, beta) and its own law only allocates compute")
      form_base = base
    law = lr.law_from_block(block, form_base, form)
    params = ", ".join(f"{k} = {v:.4g}" for k, v in law.params().items() if v is not None)
    loose = [k for k, ok in (block[form].get("identified") or {}).items() if not ok]
    caveat = (f"; the fit did not identify {', '.join(loose)} (its profile reaches its search "
              f"box's end): a rough guide" if loose else "")
    return law, f"repetition terms fitted in {spec} ({form} form: {params}{caveat})"
  law = lr.MuennighoffLaw(base=base, R_D_star=lr.MUENNIGHOFF_R_D_STAR,
                          R_N_star=lr.MUENNIGHOFF_R_N_STAR, name="muennighoff-published")
  return law, (f"no fitted repetition terms in --law {base.name}: uses Muennighoff et al. 2023's "
               f"published R_D* = {lr.MUENNIGHOFF_R_D_STAR:.4g}, R_N* = "
               f"{lr.MUENNIGHOFF_R_N_STAR:.4g} (arXiv 2305.16264, Sec. 3; fitted with their "
               f"own base law, not this one)")


def unidentified(spec) -> dict:
  """{param: [lo, hi]}: the repetition constants of a fit file's better form whose profile
  likelihood stays within its threshold to the search box's edge (``chinchax fit``'s
  ``profile``), with the range it covers; {} for a published law or an identified fit."""
  block = _repeat_block(spec)
  if block is None:
    return {}
  prof = (block.get(block.get("form")) or {}).get("profile") or {}
  return {k: [float(x) for x in p["covered"]] for k, p in prof.items()
          if isinstance(p, dict) and p.get("covered") and p.get("identified") is False}


def profile_spans(C: float, U: float, law: lr.RepeatLaw, loose: dict) -> list[dict]:
  """How far the data-constrained optimum moves across each unidentified constant's range.

  Args:
    C: FLOPs; U: unique tokens.
    law: the fitted repetition law.
    loose: :func:`unidentified`'s {param: [lo, hi]}.

  Returns:
    [{"param", "range" [lo, hi], "N" [at lo, at hi], "epochs" [...], "loss" [...]}], the
    other constants held at their fitted values.
  """
  out = []
  for name, (lo, hi) in loose.items():
    ends = []
    for v in (lo, hi):
      try:
        law_v = dataclasses.replace(law, **{name: v})
      except (TypeError, ValueError):
        break
      dl = lr.DataLimitedLaw(law_v, U)
      n, d = dl.optimal_allocation(C)
      ends.append((n, d / U, float(dl.loss(n, d))))
    if len(ends) == 2:
      out.append({"param": name, "range": [lo, hi], "N": [e[0] for e in ends],
                  "epochs": [e[1] for e in ends], "loss": [e[2] for e in ends]})
  return out


def data_limited(C: float, U: float, law: lr.RepeatLaw, note: str,
                 plain: laws.ParametricLaw | None = None, loose: dict | None = None) -> dict:
  """The data-constrained optimum beside the unconstrained one.

  Args:
    C: FLOPs (> 0).
    U: unique tokens (> 0).
    law: the repetition law; note: where its terms come from.
    plain: the law of the unconstrained answer (what ``--law`` plans without a limit);
      None: ``law``'s base.
    loose: unidentified constants and their profile ranges (:func:`unidentified`): the
      block's ``unidentified`` says how far the plan moves across each.

  Returns:
    {"unique_tokens", "form", "note", "constrained": {N, D, epochs, loss},
    "unconstrained": {N, D, epochs (its D / U), loss (fresh data), loss_with_limit (the
    same N, D trained on U unique tokens)}, "loss_lost": constrained loss − unconstrained
    loss, nats/token (>= 0 when ``plain`` is ``law``'s base).
  """
  dl = lr.DataLimitedLaw(law, U)
  plain = plain or law.base
  n_u, d_u = plain.optimal_allocation(C)
  n_c, d_c = dl.optimal_allocation(C)
  loss_u, loss_c = float(plain.loss(n_u, d_u)), float(dl.loss(n_c, d_c))
  return {"unique_tokens": U, "form": law.form, "note": note,
          "constrained": {"N": n_c, "D": d_c, "epochs": d_c / U, "loss": loss_c},
          "unconstrained": {"N": n_u, "D": d_u, "epochs": d_u / U, "loss": loss_u,
                            "loss_with_limit": float(dl.loss(n_u, d_u))},
          "loss_lost": loss_c - loss_u,
          "unidentified": profile_spans(C, U, law, loose or {})}


def lines(block: dict, loss_text=None) -> list[str]:
  """The plan report's lines of a :func:`data_limited` block.

  Args:
    block: :func:`data_limited`'s dict.
    loss_text: a loss (nats/token) → its text with units, or None where it is withheld
      (above ln of the vocabulary: :func:`chinchax.planning.loss_units.loss_text`); default:
      every loss printed in nats/token.
  """
  c, u = block["constrained"], block["unconstrained"]
  text = loss_text or (lambda x: f"{x:.4f} nats/token")
  withheld = "withheld (above ln of the vocabulary: impossible)"
  loss_c, loss_u, loss_ul = text(c["loss"]), text(u["loss"]), text(u["loss_with_limit"])
  lost = (f"{block['loss_lost']:+.4f} {loss_c.split(' ', 1)[1]}"  # the losses' own units
          if loss_c is not None and loss_u is not None
          else "withheld (a loss above ln of the vocabulary)")
  return [
      f"  data limit     U {block['unique_tokens']:.4g} unique tokens ({block['form']} form; "
      f"{block['note']})",
      f"    constrained  N* {c['N']:.4g} params, D* {c['D']:.4g} tokens = {c['epochs']:.3g} "
      f"epochs, loss {loss_c or withheld}",
      f"    unlimited    N* {u['N']:.4g} params, D* {u['D']:.4g} tokens, loss "
      f"{loss_u or withheld} with fresh data ({u['epochs']:.3g} epochs of U: "
      f"{loss_ul or 'withheld'})",
      f"    lost to it   {lost}",
  ] + [f"    unidentified {s['param']}: not pinned down by the fit's runs (profile within "
       f"its threshold over [{s['range'][0]:.4g}, {s['range'][1]:.4g}]); across that range N* "
       f"{s['N'][0]:.4g} … {s['N'][1]:.4g} params, {s['epochs'][0]:.3g} … {s['epochs'][1]:.3g} "
       f"epochs, predicted loss {s['loss'][0]:.4f} … {s['loss'][1]:.4f}"
       for s in block.get("unidentified", [])]
