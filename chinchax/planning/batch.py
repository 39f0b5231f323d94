"""Batch size, steps, peak learning rate and warmup for a planned run.

Units: tokens, sequences (global batch), FLOPs (C = 6·N·D), steps.
"""

from __future__ import annotations

import dataclasses
import math

from chinchax.cost import budget
from chinchax.cost import hparams as hparams_lib

# Batch size and peak learning rate follow DeepSeek LLM's compute scaling fits
# (Bi et al. 2024, arXiv 2401.02954, Sec. 3.1, eq. 1):
#   B_opt = 0.2920 · C^0.3271 tokens,   eta_opt = 0.3118 · C^-0.1250,
# fitted on 1e17–2e19 FLOPs (their C counts non-embedding FLOPs per token; we
# use 6·N·D). Outside that range they are extrapolations, so the batch is
# capped at 4M tokens (Llama 2's batch; Chinchilla used 1.5M→3M) and the peak
# LR at 3e-3 (chinchax's default for tiny CPU models), floored at 1e-4.
# Warmup lasts about N tokens (Porian et al. 2024, Sec. 3), at most 10% of the
# run (chinchax.train caps it there too).

BATCH_TOKENS_CAP = 4 * 1024 * 1024
PEAK_LR_RANGE = (1e-4, 3e-3)
MIN_STEPS = 100


def batch_size_tokens(C: float) -> float:
  """Tokens per step B = 0.2920·C^0.3271 (DeepSeek LLM, Bi et al. 2024, eq. 1), ≤ 4M tokens."""
  return min(hparams_lib.DEEPSEEK_BATCH_COEF * float(C) ** hparams_lib.DEEPSEEK_BATCH_EXPONENT,
             float(BATCH_TOKENS_CAP))


def peak_learning_rate(C: float) -> float:
  """Peak LR eta = 0.3118·C^-0.1250 (DeepSeek LLM, Bi et al. 2024, eq. 1) in [1e-4, 3e-3]."""
  lo, hi = PEAK_LR_RANGE
  return min(hi, max(lo, hparams_lib.DEEPSEEK_LR_COEF * float(C) ** hparams_lib.DEEPSEEK_LR_EXPONENT))


@dataclasses.dataclass(frozen=True)
class BatchPlan:
  """How D tokens are cut into steps.

  Attributes:
    global_batch_size: sequences per step (all devices).
    seq_len: tokens per sequence.
    steps: round(D_target / tokens_per_step), at least 1.
    tokens: tokens actually seen = steps × global_batch_size × seq_len.
    peak_lr: AdamW peak learning rate.
    warmup_steps: linear warmup steps.
  """

  global_batch_size: int
  seq_len: int
  steps: int
  tokens: int
  peak_lr: float
  warmup_steps: int

  @property
  def tokens_per_step(self) -> int:
    return self.global_batch_size * self.seq_len


def plan_batch(D: float, *, N: float, seq_len: int, C: float | None = None,
               batch_multiple: int = 1, min_steps: int = MIN_STEPS) -> BatchPlan:
  """Batch, steps, peak LR and warmup for training N parameters on D tokens.

  The batch of :func:`batch_size_tokens` in sequences is rounded to
  ``batch_multiple`` × a power of two, then shrunk (by powers of two, not
  below ``batch_multiple``) until the run has at least ``min_steps`` steps.
  steps = round(D / tokens_per_step) (at least 1); the tokens seen are
  steps × tokens_per_step. Warmup is ceil(N / tokens_per_step) steps, capped
  at 10% of the steps.

  Args:
    D: target tokens (> 0).
    N: parameters (for warmup).
    seq_len: tokens per sequence.
    C: the FLOP budget the batch and LR rules read; defaults to 6·N·D.
    batch_multiple: the batch must divide over this many data-parallel devices.
    min_steps: shrink the batch so the run has at least this many steps.
  Raises:
    ValueError: a non-positive D, N, seq_len or batch_multiple.
  """
  if not (math.isfinite(D) and D > 0):
    raise ValueError(f"D must be a positive finite number of tokens, got {D!r}")
  if not (math.isfinite(N) and N > 0):
    raise ValueError(f"N must be a positive finite number, got {N!r}")
  budget.check_positive_int(seq_len, "seq_len")
  budget.check_positive_int(batch_multiple, "batch_multiple")
  C = budget.flops_6nd(N, D) if C is None else float(C)
  per_device_seqs = batch_size_tokens(C) / seq_len / batch_multiple
  power = max(0, round(math.log2(per_device_seqs))) if per_device_seqs > 1 else 0
  gbs = batch_multiple * 2 ** power
  while gbs > batch_multiple and D / (gbs * seq_len) < min_steps:
    gbs = max(batch_multiple, gbs // 2)
  tps = gbs * seq_len
  steps = max(1, budget.steps_for_tokens(D, tps))
  warmup = warmup_steps(N, tps, steps)
  return BatchPlan(global_batch_size=gbs, seq_len=seq_len, steps=steps, tokens=steps * tps,
                   peak_lr=peak_learning_rate(C), warmup_steps=warmup)


def warmup_steps(N: float, tokens_per_step: int, steps: int) -> int:
  """Warmup of about N tokens (Porian et al. 2024, Sec. 3): ceil(N / tokens_per_step) steps,
  capped at 10% of ``steps`` (:func:`chinchax.cost.budget.max_warmup_steps`)."""
  return hparams_lib.warmup_steps_for_tokens(N, tokens_per_step, steps)
