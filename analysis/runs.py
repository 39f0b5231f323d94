"""Finished runs as arrays (:class:`Runs`), and the C = 6ND relation between them.

Units: N parameters, D tokens, C FLOPs, loss nats/token. The training compute
of a run is C = 6·N·D (Hoffmann et al. 2022, "Training Compute-Optimal Large
Language Models", arXiv 2203.15556, Sec. 3); :func:`flops_6nd` and
:func:`tokens_6nd` are its one copy in this package.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from analysis.errors import ResultsError

# Relative tolerance for grouping runs into IsoFLOP budgets when a table has no
# C_budget column: runs whose C lie within this factor form one budget.
BUDGET_GROUP_RTOL = 0.02



def flops_6nd(N, D):
  """Training FLOPs C = 6·N·D (Chinchilla Sec. 3); N parameters, D tokens; scalars or arrays."""
  return 6.0 * N * D


def tokens_6nd(C, N):
  """Tokens D = C / (6·N) that spend C FLOPs on N parameters (Chinchilla Sec. 3)."""
  return C / (6.0 * N)


@dataclasses.dataclass(frozen=True)
class Runs:
  """Finished runs of a results table, as arrays of shape (R,).

  Attributes:
    N: parameters per run, shape (R,).
    D: training tokens per run, shape (R,).
    loss: final eval loss per run, nats/token, shape (R,).
    budget: IsoFLOP budget each run belongs to, FLOPs, shape (R,). From the
      table's C_budget, else C = 6ND grouped within ``BUDGET_GROUP_RTOL``.
    run_id: identifiers, length R.
    curves: per-run eval curves, each an array (F, 2) of (FLOPs seen, eval
      loss) sorted by FLOPs; None when the table has none (CSV input).
    n_failed: rows with status "failed" (not fitted).
    source: the file the runs came from ("" when built in memory).
    has_budget_column: whether budgets came from the table (True) or were
      grouped from C (False).
    weight: per-run weight in the fits (Approach 2's parabolas, Approach 3's
      summed loss), shape (R,), >= 0; None: every run counts once.
    loss_se: standard error of each run's final eval loss over its eval
      windows (the table's ``final_eval_loss_se``), nats/token, shape (R,),
      NaN where a row has none; None: no row has one.
    eval_windows: eval windows behind each run's loss (the table's
      ``eval_windows``), shape (R,), 0 where a row does not say; None: no row says.
    held_out: finished rows with ``"role": "validation"`` (the ladder's
      validation run): read, never fitted (:mod:`analysis.validation`).
    unique_tokens: unique tokens U each run drew its D tokens from (the table's
      ``unique_tokens``; D / U epochs), shape (R,), inf where a row does not say
      (fresh data); None: no row says (:mod:`analysis.repeat.fit`).
  """

  N: np.ndarray
  D: np.ndarray
  loss: np.ndarray
  budget: np.ndarray
  run_id: tuple[str, ...]
  curves: tuple[np.ndarray, ...] | None = None
  n_failed: int = 0
  source: str = ""
  has_budget_column: bool = False
  weight: np.ndarray | None = None
  loss_se: np.ndarray | None = None
  eval_windows: np.ndarray | None = None
  held_out: tuple[dict, ...] = ()
  unique_tokens: np.ndarray | None = None

  @property
  def C(self) -> np.ndarray:
    """Training FLOPs per run by C = 6·N·D (Chinchilla Sec. 3), shape (R,)."""
    return flops_6nd(self.N, self.D)

  def __len__(self) -> int:
    return int(self.N.shape[0])

  def budgets(self) -> np.ndarray:
    """Sorted distinct IsoFLOP budgets, FLOPs, shape (K,)."""
    return np.unique(self.budget)

  def subset(self, idx) -> "Runs":
    """The runs at integer indices ``idx`` (repeats allowed, as in a bootstrap)."""
    idx = np.asarray(idx, dtype=np.int64)
    curves = None if self.curves is None else tuple(self.curves[i] for i in idx)
    return dataclasses.replace(
        self, N=self.N[idx], D=self.D[idx], loss=self.loss[idx], budget=self.budget[idx],
        run_id=tuple(self.run_id[i] for i in idx), curves=curves,
        weight=None if self.weight is None else self.weight[idx],
        loss_se=None if self.loss_se is None else self.loss_se[idx],
        eval_windows=None if self.eval_windows is None else self.eval_windows[idx],
        unique_tokens=None if self.unique_tokens is None else self.unique_tokens[idx])

  def eval_noise(self) -> "EvalNoise | None":
    """The eval noise floor of the table (:class:`EvalNoise`); None without any SE."""
    if self.loss_se is None or not np.any(np.isfinite(self.loss_se)):
      return None
    se = self.loss_se[np.isfinite(self.loss_se)]
    windows = None
    if self.eval_windows is not None and np.any(self.eval_windows > 0):
      windows = int(np.median(self.eval_windows[self.eval_windows > 0]))
    return EvalNoise(median_se=float(np.median(se)), min_se=float(se.min()),
                     max_se=float(se.max()), n_runs=int(se.size), eval_windows=windows)

  def drop_highest_loss(self, k: int) -> "Runs":
    """The runs without the ``k`` highest losses (Besiroglu et al. 2024 drop 5)."""
    if k <= 0:
      return self
    if k >= len(self):
      raise ResultsError(f"cannot drop the {k} highest losses of {self.source or 'the table'}: "
                         f"it has only {len(self)} runs")
    keep = np.sort(np.argsort(self.loss, kind="stable")[: len(self) - k])
    return self.subset(keep)


@dataclasses.dataclass(frozen=True)
class EvalNoise:
  """The eval noise floor: how precisely each run's final eval loss is measured.

  Attributes:
    median_se: median over runs of the standard error of the final eval loss
      over its eval windows, nats/token.
    min_se, max_se: its range over runs, nats/token.
    n_runs: runs with an SE.
    eval_windows: eval windows per run (median over runs that say), or None.
  """

  median_se: float
  min_se: float
  max_se: float
  n_runs: int
  eval_windows: int | None

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def group_budgets(C: np.ndarray, rtol: float = BUDGET_GROUP_RTOL) -> np.ndarray:
  """Groups FLOP counts into IsoFLOP budgets.

  Sorted C values join the current group while within a factor (1 + rtol) of
  the group's smallest member; each group is labelled by its geometric mean.

  Args:
    C: FLOPs per run, shape (R,).
    rtol: relative width of a group.

  Returns:
    Budget label per run, FLOPs, shape (R,).
  """
  C = np.asarray(C, dtype=np.float64)
  order = np.argsort(C, kind="stable")
  labels = np.empty_like(C)
  start = 0
  while start < len(order):
    stop = start + 1
    while stop < len(order) and C[order[stop]] <= C[order[start]] * (1.0 + rtol):
      stop += 1
    members = order[start:stop]
    labels[members] = math.exp(float(np.mean(np.log(C[members]))))
    start = stop
  return labels


def runs_from_arrays(N, D, loss, budget=None, curves=None, run_id=None,
                     source: str = "", n_failed: int = 0, weight=None, loss_se=None,
                     eval_windows=None) -> Runs:
  """Builds :class:`Runs` from arrays, validating them.

  Args:
    N: parameters, shape (R,).
    D: tokens, shape (R,).
    loss: nats/token, shape (R,).
    budget: IsoFLOP budget per run, FLOPs, shape (R,); None groups C = 6ND.
    curves: optional sequence of R arrays (F, 2) of (FLOPs seen, eval loss).
    run_id: optional R identifiers; default "run{i}".
    source: name used in error messages.
    n_failed: failed runs to record.
    weight: optional weight per run, shape (R,), finite and >= 0, not all 0.
    loss_se: optional SE of each loss, nats/token, shape (R,), >= 0 or NaN (unknown).
    eval_windows: optional eval windows per run, shape (R,), >= 0 (0: unknown).

  Raises:
    ResultsError: empty input, mismatched lengths, a NaN/non-positive value,
      a bad weight, a negative or infinite SE, or a negative window count.
  """
  where = source or "input"
  arrays = {}
  for name, x in (("N", N), ("D", D), ("loss", loss)):
    arr = np.asarray(x, dtype=np.float64).reshape(-1)
    arrays[name] = arr
  R = arrays["N"].shape[0]
  if R == 0:
    raise ResultsError(f"{where}: no runs to fit (empty table)")
  for name, arr in arrays.items():
    if arr.shape[0] != R:
      raise ResultsError(f"{where}: column {name} has {arr.shape[0]} values, N has {R}")
    bad = np.flatnonzero(~np.isfinite(arr) | (arr <= 0))
    if bad.size:
      raise ResultsError(f"{where}: column {name} must be finite and > 0; run {int(bad[0])} "
                         f"has {arr[bad[0]]!r}")
  has_budget = budget is not None
  if budget is None:
    budget_arr = group_budgets(flops_6nd(arrays["N"], arrays["D"]))
  else:
    budget_arr = np.asarray(budget, dtype=np.float64).reshape(-1)
    if budget_arr.shape[0] != R or np.any(~np.isfinite(budget_arr) | (budget_arr <= 0)):
      raise ResultsError(f"{where}: C_budget must have one finite positive value per run")
  ids = tuple(f"run{i}" for i in range(R)) if run_id is None else tuple(str(r) for r in run_id)
  if len(ids) != R:
    raise ResultsError(f"{where}: {len(ids)} run ids for {R} runs")
  curve_tuple = None
  if curves is not None:
    curve_tuple = tuple(check_curve(c, where, ids[i]) for i, c in enumerate(curves))
    if len(curve_tuple) != R:
      raise ResultsError(f"{where}: {len(curve_tuple)} eval curves for {R} runs")
  weight_arr = None
  if weight is not None:
    weight_arr = np.asarray(weight, dtype=np.float64).reshape(-1)
    if (weight_arr.shape[0] != R or np.any(~np.isfinite(weight_arr) | (weight_arr < 0))
        or not np.any(weight_arr > 0)):
      raise ResultsError(f"{where}: weight must have one finite value >= 0 per run, not all 0")
  se_arr = None
  if loss_se is not None:
    se_arr = np.asarray(loss_se, dtype=np.float64).reshape(-1)
    if se_arr.shape[0] != R or np.any(np.isinf(se_arr) | (se_arr < 0)):
      raise ResultsError(f"{where}: final_eval_loss_se must have one value >= 0 (or NaN: "
                         f"unknown) per run")
  windows_arr = None
  if eval_windows is not None:
    windows_arr = np.asarray(eval_windows, dtype=np.int64).reshape(-1)
    if windows_arr.shape[0] != R or np.any(windows_arr < 0):
      raise ResultsError(f"{where}: eval_windows must have one value >= 0 per run")
  return Runs(N=arrays["N"], D=arrays["D"], loss=arrays["loss"], budget=budget_arr, run_id=ids,
              curves=curve_tuple, n_failed=n_failed, source=source,
              has_budget_column=has_budget, weight=weight_arr, loss_se=se_arr,
              eval_windows=windows_arr)


def check_curve(curve, where: str, rid: str) -> np.ndarray:
  """Validates one eval curve; points at 0 FLOPs (an eval before the first step) are dropped."""
  arr = np.asarray(curve, dtype=np.float64)
  if arr.ndim != 2 or arr.shape[1] != 2 or arr.shape[0] == 0:
    raise ResultsError(f"{where}: run {rid!r} eval_curve must be a non-empty list of "
                       f"[flops_seen, eval_loss] pairs")
  if np.any(~np.isfinite(arr)) or np.any(arr[:, 0] < 0) or np.any(arr[:, 1] <= 0):
    raise ResultsError(f"{where}: run {rid!r} eval_curve has a NaN, negative FLOPs or "
                       f"non-positive loss value")
  arr = arr[arr[:, 0] > 0]
  if arr.shape[0] == 0:
    raise ResultsError(f"{where}: run {rid!r} eval_curve has no point after 0 FLOPs")
  return arr[np.argsort(arr[:, 0], kind="stable")]
