"""Tuned ladders: each grid point trains K learning-rate trials (and/or seeds) in one program.

``ladder.lr_trials`` = K > 1 gives every run of a FLOP ladder K trials whose peak
LRs are the rule's (``ladder.hparams``) times ``ladder.lr_trial_center`` ·
``ladder.lr_trial_factor``^u, u = −(K−1)/2 … (K−1)/2 (×0.5, ×1, ×2 for K = 3, factor 2
and centre 1);
``ladder.seeds`` = S > 1 repeats each LR with S init seeds (``seed``, ``seed``+1, …),
all on one batch stream. They run as one ``chinchax train`` of K·S trials
(``train.lr_multipliers`` × ``train.trial_seeds``; :mod:`chinchax.train.trials`).

A run's row keeps every trial (:func:`row_fields`); the grid point the fit sees
is the LR whose mean final eval loss over its seeds is lowest: ``final_eval_loss``
that mean, ``eval_curve`` the seeds' mean curve at that LR,
``final_eval_loss_se`` the seeds' standard error (S ≥ 2; else the best trial's
window s.e.), ``best_lr_mult`` and ``best_peak_lr`` the LR chosen, ``seed_sd``
the seeds' sample standard deviation of the final eval loss at that LR.

Picking the lowest of K noisy losses biases a point downwards by about the
eval's noise (the s.e. of each loss, ~1e-3 nats on the ladder's 131k-token eval);
the fit's report says the points are best-of-K.
"""

from __future__ import annotations

import math
import pathlib

import numpy as np

from chinchax import config as config_lib
from chinchax.train.metrics import read_lines


def multipliers(lc) -> tuple[float, ...]:
  """The LR multipliers of ``ladder.lr_trials``, ``lr_trial_factor`` and ``lr_trial_center``
  (the centre alone for one trial)."""
  k, f, c = lc.lr_trials, lc.lr_trial_factor, lc.lr_trial_center
  return tuple(float(c * f ** (i - (k - 1) / 2.0)) for i in range(k))


def tuned(lc) -> bool:
  """Whether the ladder's runs carry trials: more than one LR or seed, or an LR off the rule's."""
  return lc.lr_trials * lc.seeds > 1 or lc.lr_trial_center != 1


def validate_tuning(lc) -> None:
  """Checks ``ladder.lr_trials``, ``lr_trial_factor`` and ``seeds`` and what they combine with.

  Raises:
    ConfigError: a count that is not a positive integer, a factor not > 1, or trials
      on a wsd ladder (its cooldowns start from a trunk's checkpoint) or an IsoTime
      ladder (K trials take K× a single run's step time: the budgets would mean other
      things).
  """
  E = config_lib.ConfigError
  for key in ("lr_trials", "seeds"):
    v = lc[key]
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
      raise E(f"ladder.{key}={v!r} must be a positive integer (1: no {key.replace('_', ' ')})")
  f = lc.lr_trial_factor
  if not isinstance(f, (int, float)) or not math.isfinite(f) or f <= 1:
    raise E(f"ladder.lr_trial_factor={f!r} must be a number > 1 (the ratio of neighbouring "
            f"trials' learning rates, e.g. 2)")
  c = lc.lr_trial_center
  if not isinstance(c, (int, float)) or not math.isfinite(c) or c <= 0:
    raise E(f"ladder.lr_trial_center={c!r} must be a positive number (the middle trial's "
            f"multiplier of the rule's LR, e.g. 1 or 2)")
  if not tuned(lc):
    return
  if lc.schedule == "wsd":
    raise E(f"ladder.lr_trials={lc.lr_trials} / ladder.seeds={lc.seeds} with ladder.schedule="
            f"'wsd': a cooldown starts from its trunk's checkpoint, which trials cannot; use "
            f"schedule='cosine' or one trial")
  if lc.budget_kind == "seconds":
    raise E(f"ladder.lr_trials={lc.lr_trials} / ladder.seeds={lc.seeds} with ladder.budget_kind="
            f"'seconds': K trials take about K× a run's step time, so a time budget would not "
            f"mean the same run; use budget_kind='flops' or one trial")


def check_train_config(config) -> None:
  """A ladder's trials come from its own knobs, not from ``train_config``.

  Raises:
    ConfigError: ``train_config.train.lr_multipliers`` or ``trial_seeds`` is set.
  """
  t = config.train_config.train
  for key in ("lr_multipliers", "trial_seeds"):
    if str(t[key]).strip():
      raise config_lib.ConfigError(
          f"train_config.train.{key}={t[key]!r} in a ladder: give a ladder its trials with "
          f"ladder.lr_trials, ladder.lr_trial_factor, ladder.lr_trial_center and ladder.seeds "
          f"(their rows and tuning report follow from those), and leave {key} ''")


def apply(cfg, lc) -> None:
  """Sets ``cfg.train.lr_multipliers`` and ``train.trial_seeds`` from the ladder's tuning knobs
  (nothing for one trial at the rule's LR: the run is a plain single run)."""
  if not tuned(lc):
    return
  cfg.train.lr_multipliers = ",".join(f"{m:.17g}" for m in multipliers(lc))
  cfg.train.trial_seeds = ",".join(str(cfg.seed + i) for i in range(lc.seeds))


def trial_curves(workdir: pathlib.Path, n_params: int, tokens_per_step: int, k: int):
  """Each trial's eval curve [[FLOPs seen (6·N·tokens), eval loss], ...] (NaN: diverged), read
  from the ``trial_eval_loss`` lists of a trials run's metrics.jsonl."""
  curves = [[] for _ in range(k)]
  for _, row in read_lines(workdir / "metrics.jsonl"):
    for i, loss in enumerate(row.get("trial_eval_loss") or ()):
      curves[i].append([6.0 * n_params * row["step"] * tokens_per_step,
                        math.nan if loss is None else loss])
  return curves


def row_fields(summary: dict, workdir: pathlib.Path, n_params: int,
               tokens_per_step: int) -> dict:
  """The row fields of a trials run (module docstring); {} for a single run.

  Returns:
    ``trials`` (each trial's lr_mult, seed, peak_lr, final losses, diverged_step and
    eval curve), ``best_lr_mult``, ``best_peak_lr``, ``n_seeds``, ``seed_sd`` and the
    point the fit reads: ``final_eval_loss``, ``final_eval_loss_se``, ``eval_curve``.
    With every trial diverged the loss is NaN (the row is then not fitted).
  """
  records = summary.get("trials")
  if not records:
    return {}
  curves = trial_curves(workdir, n_params, tokens_per_step, len(records))
  trials = [{**r, "eval_curve": c} for r, c in zip(records, curves)]
  by_mult: dict[float, list[dict]] = {}
  for t in trials:
    by_mult.setdefault(t["lr_mult"], []).append(t)

  def mean_loss(group):
    losses = [t["final_eval_loss"] for t in group]
    return math.nan if any(x is None for x in losses) else float(np.mean(losses))

  finite = {m: mean_loss(g) for m, g in by_mult.items() if math.isfinite(mean_loss(g))}
  out = {"trials": trials, "lr_trials": len(by_mult), "n_seeds": max(map(len, by_mult.values()))}
  if not finite:
    return {**out, "final_eval_loss": math.nan, "final_eval_loss_se": None, "eval_curve": [],
            "best_lr_mult": None, "best_peak_lr": None, "seed_sd": None}
  best = min(finite, key=finite.get)
  group = by_mult[best]
  losses = np.array([t["final_eval_loss"] for t in group])
  sd = float(np.std(losses, ddof=1)) if len(group) > 1 else None
  se = (sd / math.sqrt(len(group)) if sd is not None
        else group[0].get("final_eval_loss_se"))
  curve = np.mean([np.asarray(t["eval_curve"], dtype=float) for t in group], axis=0)
  return {**out, "final_eval_loss": finite[best], "final_eval_loss_se": se,
          "eval_curve": curve.tolist(), "best_lr_mult": best,
          "best_peak_lr": group[0]["peak_lr"], "seed_sd": sd,
          **({"final_train_loss": float(np.mean(train))} if (train := [
              t["final_train_loss"] for t in group if t["final_train_loss"] is not None]) else {})}
