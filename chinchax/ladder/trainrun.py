"""Training one ladder run and building its results row (``done`` or ``failed``)."""

from __future__ import annotations

import pathlib
import time
import traceback

from chinchax.cost import budget
from chinchax.storage import diskfull
from chinchax.runtime import distributed as distributed_lib
from chinchax import errors
from chinchax.storage import paths as paths_lib
from chinchax import train as train_lib
from chinchax.train.metrics import read_lines
import chinchax.ladder.grid as grid
import chinchax.ladder.isoclock as isoclock
import chinchax.ladder.isotime as isotime
import chinchax.ladder.recipe as recipe
import chinchax.ladder.tuning as tuning
from chinchax.ladder.plan import LadderPlan


def _eval_curve(workdir: pathlib.Path, n_params: int, tokens_per_step: int) -> list[list[float]]:
  """[[FLOPs seen (6·N·tokens), eval loss], ...] from a run's metrics.jsonl."""
  curve = []
  for _, row in read_lines(workdir / "metrics.jsonl"):
    if "eval_loss" in row:
      curve.append([6.0 * n_params * row["step"] * tokens_per_step, row["eval_loss"]])
  return curve


def train_run(plan: LadderPlan, r: grid.LadderRun, attempt: int, owner: str) -> dict:
  """Trains (or resumes) one run; returns its row, ``done`` or ``failed`` (never raises for a
  failed run).

  Raises:
    Preempted: a preemption request stopped the run after a checkpoint.
    KeyboardInterrupt: Ctrl-C.
  """
  base = plan.config.train_config
  tp = None
  clocked = r.seconds_budget is not None and plan.config.ladder.time_control == "decay"
  if r.seconds_budget is not None:  # an IsoTime run: planned before it starts
    try:
      tp = (isoclock.clock_plan if clocked else isotime.time_plan)(plan, r)
    except (errors.UserError, OSError) as e:
      return {"run_id": r.run_id, "role": r.role, "C_budget": r.C_budget, "N": r.counts.total,
              "budget_kind": "seconds", "seconds_budget": r.seconds_budget,
              "status": "failed", "error": f"{type(e).__name__}: {e}", "attempts": attempt,
              "worker": owner, "wall_time_s": 0.0}
  cfg = plan.run_config(r, steps=tp and (tp.get("steps") or tp["steps_planned"]))
  if clocked:
    cfg.train.warmup_steps = tp["warmup_steps"]
  cfg.train.progress = r.role == "validation"  # the grid's runs show in the ladder's line
  t0 = time.time()
  hp = r.hparams
  row = {"run_id": r.run_id, "role": r.role, "C_budget": r.C_budget, "N": r.counts.total,
         "N_non_embedding": r.counts.non_embedding,
         "shape": {"d_model": r.shape.d_model, "n_layers": r.shape.n_layers,
                   "n_heads": r.shape.n_heads, "d_ff": r.shape.d_ff, "vocab_size": plan.vocab,
                   "seq_len": base.train.seq_len},
         "hparams": {"rule": hp.rule, "peak_lr": cfg.train.peak_lr,
                     "global_batch_size": cfg.train.global_batch_size, "b2": cfg.train.b2,
                     "warmup_steps": cfg.train.warmup_steps},
         "attempts": attempt, "worker": owner}
  try:
    if clocked:  # stable phase on the run's clock, then its steps are fixed and it decays
      tp, cfg, summary = isoclock.train_clocked(plan, r, tp)
    else:
      summary = train_lib.train(cfg, devices=plan.devices, verbose=False, lease_held=True)
    row.update({
        "status": "done", "D": summary["tokens"], "steps": summary["steps"],
        "C_6nd": budget.flops_6nd(r.counts.total, summary["tokens"]),
        "C_appendix_f": budget.chinchilla_flops_per_token(r.shape) * summary["tokens"],
        "final_train_loss": summary["final_train_loss"],
        "final_eval_loss": summary["final_eval_loss"],
        "final_eval_loss_se": summary.get("final_eval_loss_se"),
        "final_eval_bits_per_byte": summary["final_eval_bits_per_byte"],
        "eval_curve": _eval_curve(paths_lib.as_path(cfg.workdir), r.counts.total,
                                  cfg.train.global_batch_size * cfg.train.seq_len),
        "wall_time_s": time.time() - t0, "tokens_per_s": summary["tokens_per_s"],
        "mfu": summary["mfu"], "resumed": summary.get("resumed", False),
        # how often it read its training tokens (data.unique_tokens; chinchax.data.unique)
        **{k: summary.get(k) for k in ("unique_tokens", "epochs", "repeated_tokens")},
        "unique_tokens_target": cfg.data.unique_tokens,
        "recipe": recipe.row_recipe(plan, r, cfg, summary)})
    if tp is not None:
      row.update(isotime.row_fields(plan, r, tp, summary, cfg))
    if summary.get("trials"):  # ladder.lr_trials / seeds: every trial kept, the point their best
      row.update(tuning.row_fields(summary, paths_lib.as_path(cfg.workdir), r.counts.total,
                                   cfg.train.global_batch_size * cfg.train.seq_len))
      row["final_eval_bits_per_byte"] = (summary["final_eval_bits_per_byte"]
                                         * row["final_eval_loss"] / summary["final_eval_loss"])
  except (KeyboardInterrupt, distributed_lib.Preempted, diskfull.DiskFull):
    raise  # not the run's failure: it resumes once the stop (or the full disk) is over
  except Exception as e:  # one failed run must not stop the ladder
    row.update({"status": "failed", "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc(limit=5), "wall_time_s": time.time() - t0})
  return row
