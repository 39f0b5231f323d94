"""IsoFLOP runs generated from a known law, for testing the fitters and for benchmarks."""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from chinchax.laws import parametric as laws
from analysis.runs import Runs, runs_from_arrays, tokens_6nd


def synthetic_runs(law: laws.ParametricLaw, budgets: Sequence[float], *, n_sizes: int = 7,
                   span: float = 8.0, noise: float = 0.0, seed: int = 0,
                   curve_points: int = 0, curve_noise: float = 0.0) -> Runs:
  """IsoFLOP runs whose losses come from a known law, for testing the fitters.

  For each budget C, ``n_sizes`` model sizes log-spaced over
  [N_opt(C) / span, N_opt(C) · span] get D = C / (6N) tokens and final loss
  L(N, D) · exp(noise · z), z ~ N(0, 1) per run (so ``noise`` is the standard
  deviation of ln L).

  Args:
    law: the true law.
    budgets: IsoFLOP budgets, FLOPs.
    n_sizes: sizes per budget.
    span: factor between the optimum and the smallest/largest size.
    noise: standard deviation of the per-run noise on ln L.
    seed: seed of the noise.
    curve_points: if > 0, each run also gets an eval curve of that many
      points log-spaced from C/100 to C: L(N, flops / (6N)) times the run's
      noise factor times exp(curve_noise · z) per point; its last point is the
      final loss (for Approach 1).
    curve_noise: standard deviation of the extra per-point noise on ln L.

  Returns:
    :class:`Runs` with one budget per entry of ``budgets``.
  """
  rng = np.random.default_rng(seed)
  N, D, loss, budget, curves = [], [], [], [], []
  for C in budgets:
    n_opt, _ = law.optimal_allocation(float(C))
    for n in n_opt * np.geomspace(1.0 / span, span, n_sizes):
      d = tokens_6nd(C, n)
      run_factor = math.exp(noise * rng.standard_normal())
      if curve_points > 0:
        flops = np.geomspace(C / 100.0, C, curve_points)
        curve_loss = law.loss(n, tokens_6nd(flops, n)) * run_factor * np.exp(
            curve_noise * rng.standard_normal(curve_points))
        curves.append(np.stack([flops, curve_loss], axis=1))
        final = float(curve_loss[-1])
      else:
        final = float(law.loss(n, d) * run_factor)
      N.append(n)
      D.append(d)
      loss.append(final)
      budget.append(float(C))
  return runs_from_arrays(N, D, loss, budget=budget, curves=curves if curve_points > 0 else None,
                          source=f"synthetic:{law.name}")


def synthetic_repeat_runs(law, budgets: Sequence[float], unique_sizes: Sequence[float],
                          epochs: Sequence[float], sizes: Sequence[float], *, n_sizes: int = 7,
                          span: float = 8.0, upper_span: float | None = None,
                          noise: float = 0.0, seed: int = 0,
                          own_unique: bool = False) -> Runs:
  """A data-constrained table drawn from a known repetition law (``chinchax.laws.repeat``).

  Single-epoch rows: for each budget C, ``n_sizes`` sizes log-spaced over
  [N_opt(C) / span, N_opt(C) · upper_span] of the base law (``upper_span`` None: ``span``),
  D = C / (6N), U = inf (fresh data), or U = D with ``own_unique`` (each run read its own
  unique set once). Repeated rows: every (U, N, epochs) of ``unique_sizes`` × ``sizes`` ×
  ``epochs`` with D = epochs · U. Every loss is the law's times exp(noise · z), z ~ N(0, 1)
  per run (``noise``: the s.d. of ln L).

  Args:
    law: the true law (``loss(N, D, U)`` and ``base``).
    budgets: the single-epoch rows' IsoFLOP budgets, FLOPs.
    unique_sizes: U of the repeated rows, tokens.
    epochs: D / U of the repeated rows (> 1 repeats).
    sizes: N of the repeated rows, parameters.
    n_sizes, span, upper_span: the single-epoch grid per budget.
    noise: s.d. of the per-run noise on ln L.
    seed: seed of the noise.
    own_unique: single-epoch rows carry U = D instead of no U.

  Returns:
    :class:`Runs` with ``unique_tokens`` (inf for fresh data); budget C = 6ND per row.
  """
  rng = np.random.default_rng(seed)
  N, D, U = [], [], []
  hi = span if upper_span is None else upper_span
  for C in budgets:
    n_opt, _ = law.base.optimal_allocation(float(C))
    for n in n_opt * np.geomspace(1.0 / span, hi, n_sizes):
      N.append(float(n))
      D.append(tokens_6nd(C, n))
      U.append(D[-1] if own_unique else math.inf)
  for u in unique_sizes:
    for n in sizes:
      for ep in epochs:
        N.append(float(n))
        D.append(float(ep) * float(u))
        U.append(float(u))
  N, D, U = np.array(N), np.array(D), np.array(U)
  loss = np.asarray(law.loss(N, D, U)) * np.exp(noise * rng.standard_normal(len(N)))
  runs = runs_from_arrays(N, D, loss, budget=6.0 * N * D, source=f"synthetic-repeat:{law.name}")
  return dataclasses.replace(runs, unique_tokens=U)


def synthetic_runs_at(law: laws.ParametricLaw, N: Sequence[float], D: Sequence[float],
                      budget: Sequence[float], *, noise: float = 0.0, seed: int = 0) -> Runs:
  """Runs at given (N, D) points of a planned grid, with final losses L(N, D)·exp(noise·z),
  z ~ N(0, 1) per run (``noise``: the standard deviation of ln L); ``budget`` groups them
  into IsoFLOP profiles (FLOPs)."""
  rng = np.random.default_rng(seed)
  N, D = np.asarray(N, float), np.asarray(D, float)
  loss = law.loss(N, D) * np.exp(noise * rng.standard_normal(len(N)))
  return runs_from_arrays(N, D, loss, budget=[float(c) for c in budget],
                          source=f"synthetic:{law.name}")
