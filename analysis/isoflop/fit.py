"""Fitting Chinchilla's three approaches to a table of runs, each with a bootstrap.

References are to Hoffmann et al. 2022, "Training Compute-Optimal Large
Language Models" (arXiv 2203.15556, "Chinchilla") and Besiroglu et al. 2024,
"Chinchilla Scaling: A replication attempt" (arXiv 2404.10102, "Epoch").

* Approach 1 (Chinchilla Sec. 3.1, :mod:`analysis.isoflop.approach1`): the lower
  envelope of eval loss vs FLOPs over all runs' curves.
* Approach 2 (Sec. 3.2, Fig. 3, :mod:`analysis.isoflop.approach2`): per IsoFLOP budget
  a parabola in ln N; its vertex is N_opt for that budget.
* Approach 3 (Sec. 3.3 and App. D.2, :mod:`analysis.isoflop.approach3`):
  L(N, D) = E + A/N^alpha + B/D^beta by summed Huber loss and L-BFGS from a
  grid of 4500 starts (more when every loss lies above e: :func:`analysis.isoflop.approach3.default_grid`).
* Intervals: :mod:`analysis.isoflop.bootstrap`.

Units: N parameters, D tokens, C FLOPs (C = 6ND), loss nats/token.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import numpy as np

from analysis.isoflop.approaches import (APPROACHES, ApproachResult, FitOptions, check_approach,
                                 fit_approach, support_reason)
from analysis.isoflop.bootstrap import (DEFAULT_METHOD, BootstrapResult, bootstrap, check_method,
                                residual_pool)
from analysis.isoflop.diagnostics import approach_warnings
from analysis.errors import ApproachUnsupported, FitError
from analysis.runs import Runs


@dataclasses.dataclass
class FitReport:
  """Everything ``chinchax fit`` computes.

  Attributes:
    runs: the runs fitted.
    results: approach ("1", "2", "3") -> its result.
    bootstraps: approach -> :class:`~analysis.isoflop.bootstrap.BootstrapResult`
      (absent when not run).
    skipped: approach -> the reason it was skipped.
    requested: approaches asked for.
    frontier_C: FLOPs of the frontier table and figure, shape (P,).
    options: the :class:`~analysis.isoflop.approaches.FitOptions` used.
    warnings: approach -> warnings on its fit (:mod:`analysis.isoflop.diagnostics`).
    profiles: approach -> its profile-likelihood intervals (Approach 3's a and b:
      :func:`analysis.isoflop.profile.profile_a`).
    repeat: runs that repeat data: the repetition fits
      (:class:`analysis.repeat.report.RepeatReport`), or {"status": "skipped", "reason"};
      None for a table without repeated runs.
  """

  runs: Runs
  results: dict[str, ApproachResult]
  bootstraps: dict[str, BootstrapResult]
  skipped: dict[str, str]
  requested: tuple[str, ...]
  frontier_C: np.ndarray
  options: FitOptions = dataclasses.field(default_factory=FitOptions)
  warnings: dict[str, list[str]] = dataclasses.field(default_factory=dict)
  repeat: Any = None
  profiles: dict = dataclasses.field(default_factory=dict)


def frontier_flops(runs: Runs, extra_decades: float = 2.0, n: int = 60) -> np.ndarray:
  """Log-spaced FLOPs from the data's smallest C to ``extra_decades`` past its largest."""
  lo, hi = runs.C.min(), runs.C.max() * 10 ** extra_decades
  return np.geomspace(lo, hi, n)


def fit_all(runs: Runs, approaches: Sequence[str] = APPROACHES, *, n_bootstrap: int = 200,
            seed: int = 0, strict: bool = False, n_jobs: int = 1,
            log: Callable[[str], None] | None = None,
            options: FitOptions | None = None,
            bootstrap_method: str = DEFAULT_METHOD) -> FitReport:
  """Fits the requested approaches, each with a bootstrap.

  Args:
    runs: finished runs.
    approaches: any of "1", "2", "3".
    n_bootstrap: bootstrap replicates per approach (0 = none).
    seed: bootstrap seed.
    strict: raise :class:`ApproachUnsupported` when an approach cannot run
      (an explicit request) instead of recording it as skipped.
    n_jobs: processes for Approach 3's L-BFGS starts.
    log: optional progress printer.
    options: :class:`~analysis.isoflop.approaches.FitOptions` for the fits and their
      bootstraps; None: Chinchilla's choices.
    bootstrap_method: "residuals" (resample the noise, keep the design) or
      "runs" (resample runs); :func:`analysis.isoflop.bootstrap.bootstrap`.

  Returns:
    A :class:`FitReport`.

  Raises:
    ApproachUnsupported: with ``strict``, an approach the table cannot support.
    ValueError: an approach not in :data:`~analysis.isoflop.approaches.APPROACHES`.
    FitOptionError: an unknown ``bootstrap_method``.
  """
  say = log or (lambda msg: None)
  options = options or FitOptions()
  check_method(bootstrap_method)
  for a in approaches:
    check_approach(a)
  fC = frontier_flops(runs)
  pool = residual_pool(runs)     # the runs' scatter about per-budget quadratics, for warnings
  scatter_sd = pool.sd if pool.dof > 0 else None
  results, boots, skipped, warnings = {}, {}, {}, {}
  for a in approaches:
    reason = support_reason(runs, a, options)
    if reason is None:
      try:
        t0 = time.perf_counter()
        res = fit_approach(runs, a, n_jobs=n_jobs, options=options)
        say(f"approach {a}: fitted in {time.perf_counter() - t0:.1f} s")
      except FitError as e:
        reason = str(e)
    if reason is not None:
      if strict:
        raise ApproachUnsupported(reason)
      skipped[a] = reason
      say(f"approach {a}: skipped: {reason}")
      continue
    results[a] = res
    if n_bootstrap > 0:
      boots[a] = bootstrap(runs, a, res, n_resamples=n_bootstrap, seed=seed, frontier_C=fC,
                           options=options, method=bootstrap_method)
      say(f"approach {a}: {n_bootstrap} bootstrap replicates ({boots[a].resampling}) in "
          f"{boots[a].wall_time_s:.1f} s")
    warnings[a] = approach_warnings(a, res, boots.get(a), scatter_sd=scatter_sd)
  return FitReport(runs=runs, results=results, bootstraps=boots, skipped=skipped,
                   requested=tuple(approaches), frontier_C=fC, options=options,
                   warnings=warnings)
