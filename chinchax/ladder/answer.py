"""The ladder's closing block: what its fit says, in a few lines, read back from ``fit.json``.

    ladder  answer of 25 runs (fit.json; […]: 95% bootstrap interval)
            N_opt ∝ C^a: a = 0.512 [0.47, 0.55] (Approach 3; Approach 1 0.50, 2 0.53)
            D_opt ∝ C^b: b = 0.488 [0.45, 0.53]; 10× compute → 3.25× N, 3.08× D
            at C = 8e+11 (the largest budget): N_opt = 152,000, D_opt = 877,000, D/N = 5.8
            validation VC2.40e+12_N…: predicted 2.1034, measured 2.0857 ± 0.0110 (-0.84%, 1.6 s.e.)
            report runs/ladder/fit/fit.md; figures: isoflop, frontier, … .png beside it
            next: chinchax plan --flops 8e+12 --law runs/ladder/fit/fit.json

Everything comes from the written ``fit.json`` (:mod:`analysis.report`), so a rerun of a
finished ladder prints the same block without fitting again. a and b are the exponents of
Hoffmann et al. 2022, eq. 4 (N_opt ∝ C^a, D_opt ∝ C^b, a + b = 1 under C = 6ND).
"""

from __future__ import annotations

import json
import math
import pathlib

from chinchax.laws import parametric as laws
from chinchax.storage import paths as paths_lib

WIDTH = 100  # no line of the block is longer


def _interval(block: dict, key: str) -> str:
  ci = (block.get("ci") or {}).get(key)
  if not ci or ci[0] is None or ci[1] is None:
    return ""
  return f" [{ci[0]:.3g}, {ci[1]:.3g}]"


def _clip(line: str) -> str:
  return line if len(line) <= WIDTH else line[:WIDTH - 1] + "…"


FORM_NAMES = {"muennighoff": "Muennighoff", "overfit": "additive"}  # analysis.repeat forms


def _repeat_validation(data: dict) -> list[str]:
  """The validation line(s) of a fit with a ``repeat`` block (``analysis.repeat.report``): the
  run's measured loss ± s.e., each repetition law's prediction and miss (the better form, by
  leave-one-unique-size-out error, first), then the single-epoch law's; [] when there is none."""
  rep = data.get("repeat") or {}
  out = []
  for v in rep.get("validation") or []:
    preds = v.get("predictions") or {}
    se = v.get("measured_se") or (data.get("validation") or {}).get("measured_se")
    order = [rep.get("form")] + [f for f in FORM_NAMES if f != rep.get("form")]
    parts = [f"{FORM_NAMES[f]} {preds[f]['predicted_loss']:.4f} "
             f"({100 * preds[f]['rel_error']:+.1f}%)" for f in order if f in preds]
    base = preds.get("base (no repetition)")
    if base:
      parts.append(f"no repetition {base['predicted_loss']:.4f} "
                   f"({100 * base['rel_error']:+.1f}%)")
    out.append(_clip(f"        validation {v['run_id']} ({v.get('epochs', float('nan')):.1f} "
                     f"epochs): measured {v['measured_loss']:.4f}"
                     + (f" ± {se:.4f}" if se else "") + ", predicted by"))
    out.append(_clip("          " + ", ".join(parts)))
  return out


def closing_lines(fit_dir: pathlib.Path, c_max: float | None = None) -> list[str]:
  """The closing block of the fit in ``fit_dir`` (module doc); ``c_max`` is the ladder's largest
  budget (default: the fit's). A line is at most :data:`WIDTH` characters unless it holds a
  path (the report, the next command: never cut).

  Returns [] when ``fit_dir/fit.json`` cannot be read (no fit was written).
  """
  fit_dir = paths_lib.as_path(str(fit_dir)) if isinstance(fit_dir, str) else fit_dir
  try:
    data = json.loads((fit_dir / "fit.json").read_text())
  except (OSError, ValueError):
    return []
  inp = data.get("input") or {}
  key = str(data.get("law_from") or "").replace("approach", "") or None
  sec = data.get(f"approach{key}") or {} if key else {}
  lines = [f"ladder  answer of {inp.get('n_runs', '?')} runs (fit.json; […]: 95% bootstrap "
           f"interval)"]
  a, b = data.get("a", sec.get("a")), data.get("b", sec.get("b"))
  if a is None:  # an IsoTime fit or one with no allocation law
    a_keys = [k for k in ("1", "2", "3") if (data.get(f"approach{k}") or {}).get("a") is not None]
    if a_keys:
      key, sec = a_keys[-1], data[f"approach{a_keys[-1]}"]
      a, b = sec["a"], sec.get("b", 1 - sec["a"])
  if a is not None:
    others = ", ".join(f"{k}: {data[f'approach{k}']['a']:.3f}" for k in ("1", "2", "3")
                       if k != key and (data.get(f"approach{k}") or {}).get("a") is not None)
    lines.append(f"        N_opt ∝ C^a: a = {a:.3f}{_interval(sec, 'a')} (Approach {key}"
                 + (f"; Approach {others}" if others else "") + ")")
    b = 1.0 - a if b is None else b
    lines.append(f"        D_opt ∝ C^b: b = {b:.3f}{_interval(sec, 'b')}; 10× compute → "
                 f"{10 ** a:.2f}× N, {10 ** b:.2f}× D")
  c_top = c_max or (inp.get("budgets") or [None])[-1]
  try:
    law = laws.law_from_dict(data, name="fit")
    if c_top:
      n_opt, d_opt = (float(x) for x in law.optimal_allocation(c_top))
      lines.append(f"        at C = {c_top:.3g} (the largest budget): N_opt = {n_opt:,.0f}, "
                   f"D_opt = {d_opt:,.0f}, D/N = {d_opt / n_opt:.1f}")
  except ValueError:
    pass
  v = data.get("validation")
  repeat_lines = _repeat_validation(data)
  if repeat_lines:  # a data-constrained ladder: its repetition laws predict its validation run
    lines += repeat_lines
  elif v and v.get("predicted_loss") is not None:
    se = v.get("measured_se")
    diff = v["measured_loss"] - v["predicted_loss"]
    sig = (f", {abs(diff) / se:.1f} s.e." if se and se > 0 and math.isfinite(se) else "")
    lines.append(f"        validation {v['run_id']}: predicted {v['predicted_loss']:.4f}, "
                 f"measured {v['measured_loss']:.4f}" + (f" ± {se:.4f}" if se else "")
                 + f" ({100 * v['rel_error']:+.2f}%{sig})")
  elif v:
    lines.append(f"        validation {v['run_id']}: measured {v['measured_loss']:.4f}; "
                 f"{v.get('note', '')}")
  warnings = data.get("warnings") or []
  if warnings:
    w = warnings[0]
    lines.append(_clip(f"        {len(warnings)} warning(s) in fit.md, first: approach "
                       f"{w.get('approach')}: {w.get('message')}"))
  figures = sorted(p.stem for p in fit_dir.glob("*.png"))
  lines.append(f"        report {fit_dir / 'fit.md'}")
  if figures:
    lines.append(f"        figures {', '.join(figures)} (.png, .svg) beside it")
  if c_top:
    u = [v.get("unique_tokens") for v in (data.get("repeat") or {}).get("validation") or []]
    then = f" --unique-tokens {u[0]:.3g}" if u and u[0] else ""
    lines.append(f"        next: chinchax plan --flops {10 * c_top:.0e} --law "
                 f"{fit_dir / 'fit.json'}{then}")
  return lines
