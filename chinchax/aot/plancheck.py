"""``chinchax plan --aot``: the planned run compiled for its hardware before anything is rented.

:func:`check_plan` builds the config the plan would write
(``chinchax.planning.config_file.planned_config``), compiles its train step
for the plan's ``--hardware`` (``chinchax.aot``), and when it does not fit
searches the run's layouts (``chinchax.aot.search``: remat × mesh split ×
scan_layers × microbatches — never the shape, global batch or steps the plan chose) and moves the
plan to the fastest layout that fits by the roofline, saying so in the plan's
warnings. The chosen layout goes into ``--write-config``'s file. Compile
results are cached (``~/.cache/chinchax/aot``), so planning again is fast.
"""

from __future__ import annotations

from chinchax.aot import search as search_lib
from chinchax.aot import topology as topology_lib
from chinchax.planning import config_file
from chinchax.planning.planner import Plan


def _layout(rep: dict) -> dict:
  r = rep["run"]
  return {"remat": r["remat"], "scan_layers": bool(r["scan_layers"]), "mesh": dict(r["mesh"]),
          "microbatches": int(r.get("microbatches", 1))}


def _short(rep: dict) -> str:
  lay = _layout(rep)
  m = lay["mesh"]
  total = rep["train_step"]["memory"].get("total")
  mem = "n/a" if total is None else f"{total / 1e9:.3g} GB"
  return (f"remat={lay['remat']} mesh={m['data']}×{m['fsdp']}×{m['tensor']} "
          f"scan_layers={lay['scan_layers']} M={lay['microbatches']}: {mem} per device")


def check_plan(plan: Plan, *, workdir: str | None = None, cache_dir=search_lib.CACHE_DIR,
               progress=None) -> dict:
  """Compiles the plan for its hardware; sets ``plan.aot`` (and ``plan.layout`` when it moves).

  Returns:
    ``plan.aot``: {"target", "fits", "given": short line, "chosen": short line,
    "moved": bool, "report": the chosen layout's compile report}.
  Raises:
    AotError / HardwareError: no hardware, a CPU target, or a missing libtpu /
      CUDA plugin — before any compilation.
  """
  if plan.hardware is None:
    raise topology_lib.AotError("--aot compiles the plan for its devices: give --hardware "
                                "(e.g. v5e-16, v5p-128, h100x8)")
  target = topology_lib.parse_target(plan.hardware.spec)
  topology_lib.check_available(target)
  config = config_file.planned_config(plan, workdir or config_file.default_workdir(plan))
  rep, _ = search_lib.compile_cached(config, target, eval_step=False, cache_dir=cache_dir)
  result = {"target": target.spec, "fits": rep["fits"], "given": _short(rep),
            "chosen": _short(rep), "moved": False, "report": rep}
  if not rep["fits"]:
    rows = search_lib.search(config, target, cache_dir=cache_dir, progress=progress)
    best = next((r for r in rows if r["fits"]), None)
    if best is None:
      plan.warnings.append(f"--aot: the planned run does not fit {target.spec} in any layout "
                           f"tried ({len(rows)}; {_short(rep)} as planned); use more devices, "
                           f"a smaller batch or a smaller model")
    else:
      result.update(fits=True, chosen=_short(best["report"]), moved=True,
                    report=best["report"])
      plan.layout = _layout(best["report"])
      plan.warnings.append(f"--aot: as planned ({_short(rep)}) the run does not fit "
                           f"{target.spec}; moved to {_short(best['report'])}, the fastest of "
                           f"{sum(r['fits'] for r in rows)} layouts that fit (roofline)")
  plan.aot = result
  return result


def render_check(result: dict) -> str:
  """Lines for the plan table: what was compiled and where it landed."""
  rep = result["report"]
  ro = rep.get("roofline") or {}
  head = rep.get("headroom_fraction")
  lines = [f"  aot            compiled for {result['target']}: "
           f"{'fits' if result['fits'] else 'DOES NOT FIT'}; {result['chosen']}"
           + ("" if head is None else f", headroom {100 * head:+.1f}%")]
  if ro.get("step_s"):
    lines.append(f"  aot roofline   step ≥ {ro['step_s'] * 1e3:.4g} ms ({ro['bound']}-bound)")
  return "\n".join(lines)
