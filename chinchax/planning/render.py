"""The planner's report: a plan as a readable table (:func:`format_plan`) and as strict JSON."""

from __future__ import annotations

import math

from chinchax.cost import budget
from chinchax.planning import constrained
from chinchax.planning import loss_units
from chinchax.planning import recipe as recipe_lib
from chinchax.planning import layout as layout_lib
from chinchax.planning.planner import Plan


def duration(seconds: float) -> str:
  """A wall time in the unit that reads best: "45.2 s", "12.5 min", "3.2 h", "4.5 days"."""
  if seconds < 120:
    return f"{seconds:.3g} s"
  if seconds < 2 * 3600:
    return f"{seconds / 60:.3g} min"
  if seconds < 2 * 86400:
    return f"{seconds / 3600:.3g} h"
  return f"{seconds / 86400:.3g} days"


def _fmt_int(x: float) -> str:
  return f"{x:,.0f}" if abs(x) < 1e7 else f"{x:.4g}"


def _fit_line(fit) -> str:
  """The memory line: G = M × m, remat, mesh and the analytic memory per device."""
  m = fit.mesh
  chunk = f", loss in chunks of {fit.loss_chunk}" if fit.loss_chunk else ""
  return (f"  memory         global batch G {fit.global_batch_size} = M {fit.microbatches} × "
          f"microbatch m {fit.microbatch_size}; remat {fit.remat}{chunk}; mesh data×fsdp×tensor "
          f"{m['data']}×{m['fsdp']}×{m['tensor']}; {fit.memory.total / 1e9:.3g} GB per device "
          f"of {fit.capacity / 1e9:.3g} GB (analytic, {'fits' if fit.fits else 'DOES NOT FIT'}"
          f" with {100 * layout_lib.MEMORY_HEADROOM:.0f}% kept free)")


def format_plan(plan: Plan) -> str:
  """A readable multi-line report of ``plan``."""
  s, b, a = plan.chosen.shape, plan.batch, plan.allocation
  lines = []
  if plan.mode == "flops":
    head = f"FLOP budget {plan.budget['flops']:.4g} FLOPs"
  elif plan.mode == "hours":
    head = f"time budget {plan.budget['hours']:.4g} hours on {plan.hardware.spec}"
  else:
    head = (f"dollar budget ${plan.budget['dollars']:,.2f} on {plan.hardware.spec} "
            f"= {plan.budget['hours']:.4g} hours")
  lines.append(f"chinchax plan — {head}")
  lines.append(f"  law            {plan.law.name}  ({getattr(plan.law, 'source', '')})")
  loss = loss_units.frontier_text(plan)
  lines.append(f"  optimum        C {a.C:.4g} FLOPs → N* {a.N:.4g} params, D* {a.D:.4g} tokens "
               f"({a.tokens_per_param:.1f} tokens/param){loss}")
  if plan.data_limit:
    lines += constrained.lines(plan.data_limit, lambda x: loss_units.loss_text(plan, x))
  kv = f", n_kv_heads {s.kv_heads}" if s.kv_heads != s.n_heads else ""
  lines.append(f"  shape          d_model {s.d_model}, n_layers {s.n_layers}, n_heads {s.n_heads}{kv} "
               f"(head_dim {s.head_dim}), d_ff {s.d_ff}, vocab_size {s.vocab_size}, "
               f"seq_len {b.seq_len}")
  lines.append(f"                 N {_fmt_int(plan.N)} params (non-embedding "
               f"{_fmt_int(plan.chosen.non_embedding)}), aspect d_model/n_layers "
               f"{plan.chosen.aspect_ratio:.0f}")
  if plan.tokenizer:
    lines.append(f"  vocabulary     a {plan.tokenizer['bpe_vocab_size']:,}-token BPE "
                 f"(data.tokenizer=bpe), an accelerator plan's default; --vocab-size 257 plans "
                 f"bytes")
  lines.append(f"  training       global_batch_size {b.global_batch_size} × seq_len {b.seq_len} = "
               f"{_fmt_int(b.tokens_per_step)} tokens/step, {_fmt_int(b.steps)} steps, "
               f"D {_fmt_int(plan.D)} tokens ({plan.D / plan.N:.1f} tokens/param)")
  lines.append(f"                 peak_lr {b.peak_lr:.3g}, warmup {_fmt_int(b.warmup_steps)} steps,"
               f" {_schedule(plan)}")
  lines += _recipe_lines(plan)
  mfu = budget.matmul_flops_per_token(s) * plan.D
  appf = budget.chinchilla_flops_per_token(s) * plan.D
  lines.append(f"  FLOPs          6ND {plan.C:.4g} | matmul (MFU) {mfu:.4g} | "
               f"Chinchilla App. F {appf:.4g}")
  if plan.loss_units is not None:
    lines += loss_units.lines(plan)
  elif plan.predicted_loss is not None:
    lines.append(f"  predicted loss {plan.predicted_loss:.4f} nats/token")
  if plan.step_time_s is not None:
    lines.append(f"  step time      {plan.step_time_s:.4g} s ({plan.step_time_model})")
  if plan.fit is not None:
    lines.append(_fit_line(plan.fit))
  if plan.step_time_s is not None:
    cost = f", ${plan.dollars:,.2f}" if plan.dollars is not None else ""
    start = (f" = start-up {plan.startup_s:.3g} s + {_fmt_int(plan.batch.steps)} steps"
             if plan.startup_s else "")
    lines.append(f"  wall time      {duration(plan.seconds)}{start}{cost}")
    if plan.dollars:
      lines.append(f"  tokens/dollar  {plan.D / plan.dollars:.4g}")
  if plan.calibration:
    lines.append(f"  calibration    measured on this machine (model → measured s/step, model error);"
                 f" unmeasured shapes × {plan.calibration_factor:.3g}")
    for r in plan.calibration:
      lines.append(f"    d_model {r['d_model']:>5} × {r['n_layers']:>3} layers, batch "
                   f"{r['global_batch_size']:>5}: {r['model_step_time_s']:.4g} → "
                   f"{r['measured_step_time_s']:.4g} s ({r['model_error']:+.1%}), start-up "
                   f"{r['startup_s']:.3g} s")
  if plan.comparison:
    lines.append(f"  vs FLOP-opt    {plan.comparison['summary']}")
  if plan.dollar_curve:
    lines.append("  loss per dollar")
    for p in plan.dollar_curve:
      loss = _row_loss(p)
      lines.append(f"    ${p['dollars']:>12,.2f}  N {p['N']:.3g}  D {p['D']:.3g}  loss {loss}  "
                   f"tokens/$ {p['tokens_per_dollar']:.3g}")
  lines.append("  candidates")
  timed = plan.mode != "flops"
  hdr = "    d_model n_layers n_heads   d_ff            N   ΔN/N* aspect"
  lines.append(hdr + ("        D  step_s     loss" if timed else ""))
  for c in plan.candidates:
    row = (f"    {c['d_model']:>7} {c['n_layers']:>8} {c['n_heads']:>7} {c['d_ff']:>6} "
           f"{c['N']:>12,} {c['N'] / plan.allocation.N - 1:>+7.3f} {c['aspect_ratio']:>6.0f}")
    if timed:
      loss = _row_loss(c)
      mark = "*" if c.get("step_time_source") == "measured" else " "
      row += f" {c['D']:>8.3g} {c['step_time_s']:>7.3g}{mark} {loss:>7}"
    lines.append(row)
  if any(r.get("law_loss") is not None and r.get("predicted_loss") is None
         for r in list(plan.candidates or []) + list(plan.dollar_curve or [])):
    lines.append("  †              the law's loss in its own units: it does not transfer to this "
                 "plan's tokens")
  for w in plan.warnings:
    lines.append(f"  warning        {w}")
  return "\n".join(lines)


def _row_loss(row: dict) -> str:
  """A candidate's or dollar point's loss: its own, or the law's marked † (law's units)."""
  if row.get("predicted_loss") is not None:
    return f"{row['predicted_loss']:.4f}"
  if row.get("law_loss") is not None:
    return f"{row['law_loss']:.4f}†"
  return "-"


def _schedule(plan: Plan) -> str:
  """The schedule the written config trains: the law recipe's, else chinchax's cosine."""
  train = ((plan.recipe or {}).get("settings") or {}).get("train", {})
  kind = train.get("schedule", "cosine")
  floor = train.get("min_lr_ratio", 0.1)
  if kind == "wsd":
    return (f"wsd: {train.get('decay_shape', '1-sqrt')} decay over the last "
            f"{train.get('decay_fraction', 0.2):.0%} to {floor:.0%}")
  return f"cosine decay to {floor:.0%} over the run"


def _recipe_lines(plan: Plan) -> list[str]:
  """The law's recipe as the plan applies it, and every departure from it."""
  rec = plan.recipe
  if not rec or rec.get("law") is None:
    return []
  settings = rec.get("settings") or {}
  model, train, data = (settings.get(k, {}) for k in ("model", "train", "data"))
  fam = (rec["law"].get("shape_family") or {})
  fam_name = fam.get("name", "?") if isinstance(fam, dict) and "disagree" not in fam else "?"
  hp = rec["law"].get("hparams") or {}
  rule = hp.get("rule", "?") if isinstance(hp, dict) and "disagree" not in hp else "?"
  tuned = (hp.get("tuned") or {}).get("median_lr_mult") if isinstance(hp, dict) else None
  out = [f"  recipe         the law's: shape family {fam_name!r}, hparams rule {rule!r}"
         + (f" × tuned {tuned:g}" if tuned else "")
         + f", init {model.get('init', '?')!r}"
         + (f", b2 {train['b2']:g}" if "b2" in train else "")
         + f", weight_decay {train.get('weight_decay', '?')}, data {data.get('source', '?')}/"
           f"{data.get('tokenizer', '?')}"]
  warn = recipe_lib.departure_warning(plan)
  if warn and warn not in plan.warnings:  # else it is printed once, as a warning
    out.append(f"  departures     {warn}")
  return out


def finite(x):
  """``x`` with non-finite floats replaced by None (strict JSON has no Infinity/NaN)."""
  if isinstance(x, dict):
    return {k: finite(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [finite(v) for v in x]
  if isinstance(x, float) and not math.isfinite(x):
    return None
  return x
