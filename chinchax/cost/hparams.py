"""Per-size training hyperparameters for the runs of an IsoFLOP ladder.

Porian et al. 2024 ("Resolving Discrepancies in Compute-Optimal Scaling of
Language Models", arXiv 2406.19146, abstract) name the warmup duration and
optimizer settings that are not tuned per scale among the three causes that
move the fitted exponent a of N_opt ∝ C^a away from Chinchilla's ≈ 0.5. A ladder whose runs all share one
peak_lr, one batch and one warmup inherits that bias. This module gives each
run its own settings by a named rule, a pure function of

* ``N``: the run's parameters (chinchax's ladder counts every parameter,
  ``budget.n_kind="total"``),
* ``C``: its FLOP budget C = 6·N·D (FLOPs),
* ``seq_len``: tokens per sequence,
* the base training settings (:class:`Base`, read from ``train_config.train``),

and returns a frozen :class:`HParams` (peak_lr, global_batch_size in
sequences, AdamW b2, warmup in steps) with the source of every value.

Rules (:data:`RULES`):

* ``"fixed"`` — the base config's values unchanged (the ladder's behaviour
  before per-size rules).
* ``"deepseek"`` — DeepSeek LLM (Bi et al. 2024, arXiv 2401.02954, Sec. 3.1,
  eq. 1): η_opt = 0.3118·C^−0.1250 and B_opt = 0.2920·C^0.3271 (B in tokens,
  C in FLOPs), fitted on budgets 1e17–2e19 FLOPs. Their C is M·D with M the
  non-embedding FLOPs per token (attention included, the vocabulary's
  matmuls left out); chinchax passes its own C = 6·N·D with N the total
  parameter count, i.e. M ≈ 6N with the (tied) embedding counted and the
  attention term 6·n_layers·d_model·seq_len left out. For the ladder's byte
  models (vocab 257) the embedding is a large share of N, so chinchax's C is
  larger than DeepSeek's M·D would be; at the ladder's 1e10–1e13 FLOPs both
  formulas are extrapolated 5–9 decades below the fitted range anyway, and
  the values say so in their sources. b2 and warmup stay the base's.
* ``"porian"`` — the form of Porian et al. 2024's settings: peak_lr and batch
  as power laws of N (:class:`PowerLawFit`, fitted by the paper on its
  hyperparameter sweep), AdamW β2 chosen by the batch size (larger β2 for
  smaller batches, abstract; the authors' released sweep,
  github.com/formll/resolving-scaling-law-discrepancies, tries β2 ∈
  {0.95, 0.99, 0.999}) and a warmup of about N tokens. The paper's fitted LR and batch constants are not part of
  chinchax (:data:`PORIAN_FIT` is ``None``); without them the rule keeps the
  base peak_lr and batch and changes only β2 (when the batch differs from the
  base's) and the warmup. See :func:`porian`.

Every rule except ``"fixed"`` rounds its batch to whole sequences, clips it
to [1, ``max_global_batch_size``] and then shrinks it, if needed, so that the
run has at least ``min_steps`` steps (:func:`batch_for_tokens`); if even one
sequence per step gives fewer than ``min_steps`` steps, :attr:`HParams.short`
is True and :func:`apply_to_config` raises ConfigError. Warmups are capped at
10% of the run's steps, the cap :func:`chinchax.train.spec.resolve` applies
(:func:`chinchax.cost.budget.max_warmup_steps`).

Units: N parameters, C FLOPs, tokens, sequences, steps.
"""

from __future__ import annotations

import dataclasses
import math

from chinchax.cost import budget
from chinchax import config as config_lib

# The largest global batch (sequences) a rule may ask for: the ladder's models
# train on one CPU device or one accelerator, and 1024 sequences of 64-128
# tokens is far above any per-size optimum these rules give at 1e10-1e13 FLOPs.
MAX_GLOBAL_BATCH_SIZE = 1024

# DeepSeek LLM, Bi et al. 2024, arXiv 2401.02954, Sec. 3.1, eq. 1.
DEEPSEEK_LR_COEF, DEEPSEEK_LR_EXPONENT = 0.3118, -0.1250
DEEPSEEK_BATCH_COEF, DEEPSEEK_BATCH_EXPONENT = 0.2920, 0.3271
DEEPSEEK_FIT_RANGE = (1e17, 2e19)  # FLOPs of the budgets the paper fitted eq. 1 on (Sec. 3.1)

# The largest AdamW β2 of Porian et al. 2024's released sweep (β2 ∈ {0.95, 0.99, 0.999}).
B2_MAX = 0.999


@dataclasses.dataclass(frozen=True)
class PowerLawFit:
  """Porian et al. 2024-style fits of the optimal settings against N: value = coef · N^exponent.

  Attributes:
    lr_coef, lr_exponent: peak_lr = lr_coef · N^lr_exponent.
    batch_coef, batch_exponent: global batch = batch_coef · N^batch_exponent, in tokens.
  """

  lr_coef: float
  lr_exponent: float
  batch_coef: float
  batch_exponent: float


# Porian et al. 2024 fit the optimal peak_lr and batch against N on their
# hyperparameter sweep; those constants are not carried here (no copy of the
# paper's fitted values could be checked), so the "porian" rule uses the base
# peak_lr and batch unless a PowerLawFit is passed to it.
PORIAN_FIT: PowerLawFit | None = None


@dataclasses.dataclass(frozen=True)
class Base:
  """The base training settings a rule starts from (``train_config.train``'s values).

  Attributes:
    peak_lr: AdamW peak learning rate.
    global_batch_size: sequences per step.
    b2: AdamW β2.
    warmup_steps: linear warmup steps (before the 10% cap).
  """

  peak_lr: float
  global_batch_size: int
  b2: float
  warmup_steps: int

  @classmethod
  def from_config(cls, train) -> "Base":
    """The settings of a config's ``train`` section."""
    return cls(peak_lr=float(train.peak_lr), global_batch_size=int(train.global_batch_size),
               b2=float(train.b2), warmup_steps=int(train.warmup_steps))


@dataclasses.dataclass(frozen=True)
class HParams:
  """One run's settings as a rule gives them.

  Attributes:
    rule: the rule's name.
    peak_lr: AdamW peak learning rate.
    global_batch_size: sequences per step (an int >= 1).
    b2: AdamW β2.
    warmup_steps: linear warmup steps, already capped at 10% of ``steps``
      (``"fixed"`` keeps the base value; ``chinchax.train`` caps it the same way).
    steps: the run's steps with this batch, round(D / (global_batch_size·seq_len)), D = C/(6N).
    min_steps: the fewest steps the ladder allows (``ladder.min_steps``).
    batch_tokens: the rule's batch before rounding and clipping (tokens).
    batch_clamp: how the batch was clamped: ``""`` (not at all), ``"max"``
      (to ``max_global_batch_size``), ``"min"`` (up to one sequence) or
      ``"min_steps"`` (shrunk so the run has ``min_steps`` steps).
    sources: for each of peak_lr, global_batch_size, b2, warmup_steps, where the value comes from.
  """

  rule: str
  peak_lr: float
  global_batch_size: int
  b2: float
  warmup_steps: int
  steps: int
  min_steps: int
  batch_tokens: float
  batch_clamp: str
  sources: dict

  @property
  def short(self) -> bool:
    """The run has fewer than ``min_steps`` steps even after the batch was shrunk."""
    return self.steps < self.min_steps


def check_rule(rule, name: str = "ladder.hparams") -> None:
  """Raises ConfigError unless ``rule`` is one of :data:`RULES`; the message lists them."""
  if rule not in RULES:
    raise config_lib.ConfigError(
        f"{name}={rule!r} is not a known hyperparameter rule; known: {', '.join(RULES)}")


def batch_for_tokens(batch_tokens: float, *, tokens: float, seq_len: int, min_steps: int,
                     max_global_batch_size: int = MAX_GLOBAL_BATCH_SIZE) -> tuple[int, str]:
  """Sequences per step for a batch of ``batch_tokens`` tokens, and how it was clamped.

  round(batch_tokens / seq_len), clipped to [1, max_global_batch_size]
  (clamp ``"min"`` / ``"max"``); then, if the run of ``tokens`` tokens would
  have fewer than ``min_steps`` steps (round(tokens / (batch·seq_len)),
  :func:`chinchax.cost.budget.steps_for_tokens`), the largest batch that gives it
  ``min_steps`` steps, floor(tokens / (min_steps·seq_len)), at least 1
  (clamp ``"min_steps"``). A run too short for ``min_steps`` steps of one
  sequence comes back with one sequence; the caller sees it in the steps.

  Raises:
    ValueError: a non-positive or non-finite batch_tokens or tokens, or a
      seq_len, min_steps or max_global_batch_size that is not a positive integer.
  """
  for v, k in ((batch_tokens, "batch_tokens"), (tokens, "tokens")):
    if not (math.isfinite(v) and v > 0):
      raise ValueError(f"{k} must be a positive finite number, got {v!r}")
  budget.check_positive_int(seq_len, "seq_len")
  budget.check_positive_int(min_steps, "min_steps")
  budget.check_positive_int(max_global_batch_size, "max_global_batch_size")
  gbs, clamp = int(round(batch_tokens / seq_len)), ""
  if gbs < 1:
    gbs, clamp = 1, "min"
  elif gbs > max_global_batch_size:
    gbs, clamp = max_global_batch_size, "max"
  if budget.steps_for_tokens(tokens, gbs * seq_len) < min_steps:
    fit = max(1, int(tokens // (min_steps * seq_len)))
    if fit < gbs:
      gbs, clamp = fit, "min_steps"
  return gbs, clamp


def warmup_steps_for_tokens(warmup_tokens: float, tokens_per_step: int, steps: int) -> int:
  """ceil(warmup_tokens / tokens_per_step) steps, capped at 10% of ``steps``
  (:func:`chinchax.cost.budget.max_warmup_steps`, the cap of ``chinchax.train.spec.resolve``)."""
  return min(int(math.ceil(warmup_tokens / tokens_per_step)), budget.max_warmup_steps(steps))


def b2_for_batch(batch_tokens: float, base_batch_tokens: float, base_b2: float) -> float:
  """AdamW β2 for a batch of ``batch_tokens`` tokens: larger for smaller batches.

  Keeps the horizon of Adam's second-moment average, 1/(1 − β2) steps of
  ``batch_tokens`` tokens, at the base's horizon in tokens:
  1 − β2 = (1 − base_b2) · batch_tokens / base_batch_tokens, then clipped to
  [base_b2, :data:`B2_MAX`] (so a batch at or above the base's keeps
  base_b2; 0.999 is the largest β2 of Porian et al. 2024's sweep). The
  direction (a larger β2 for a smaller batch) is Porian et al. 2024's finding
  (abstract); the proportionality is this module's rule, not a fitted law.
  """
  b2 = 1.0 - (1.0 - base_b2) * batch_tokens / base_batch_tokens
  return min(B2_MAX, max(base_b2, b2))


def _tokens(N: float, C: float) -> float:
  """D = C / (6N) tokens (chinchax's C = 6·N·D)."""
  return float(C) / (6.0 * float(N))


def fixed(N: float, C: float, seq_len: int, base: Base, *, min_steps: int = 1,
          max_global_batch_size: int = MAX_GLOBAL_BATCH_SIZE) -> HParams:
  """The base config's values, unchanged (no clamping; ``steps`` tells whether the run is short).

  ``max_global_batch_size`` is accepted for a uniform signature and not used.
  """
  del max_global_batch_size
  D = _tokens(N, C)
  src = "base config (train_config.train)"
  return HParams(
      rule="fixed", peak_lr=base.peak_lr, global_batch_size=base.global_batch_size, b2=base.b2,
      warmup_steps=base.warmup_steps,
      steps=budget.steps_for_tokens(D, base.global_batch_size * seq_len), min_steps=min_steps,
      batch_tokens=float(base.global_batch_size * seq_len), batch_clamp="",
      sources=dict(peak_lr=src, global_batch_size=src, b2=src,
                   warmup_steps=src + "; chinchax.train caps it at 10% of the steps"))


def deepseek(N: float, C: float, seq_len: int, base: Base, *, min_steps: int = 1,
             max_global_batch_size: int = MAX_GLOBAL_BATCH_SIZE) -> HParams:
  """DeepSeek LLM's compute laws: η = 0.3118·C^−0.1250, B = 0.2920·C^0.3271 tokens.

  Bi et al. 2024, arXiv 2401.02954, Sec. 3.1, eq. 1 (fitted on 1e17–2e19
  FLOPs; C here is chinchax's 6·N·D, see the module docstring for how it
  stands in for the paper's M·D). The batch goes through
  :func:`batch_for_tokens`; b2 stays the base's; warmup is the base's
  warmup_steps capped at 10% of the run's steps. The peak_lr is the formula's,
  not clipped (at 3e10 FLOPs it is ≈ 0.015).

  Raises:
    ValueError: a non-positive N, C or seq_len.
  """
  D = _tokens(N, C)
  lr = DEEPSEEK_LR_COEF * float(C) ** DEEPSEEK_LR_EXPONENT
  b_tok = DEEPSEEK_BATCH_COEF * float(C) ** DEEPSEEK_BATCH_EXPONENT
  gbs, clamp = batch_for_tokens(b_tok, tokens=D, seq_len=seq_len, min_steps=min_steps,
                                max_global_batch_size=max_global_batch_size)
  steps = budget.steps_for_tokens(D, gbs * seq_len)
  lo, hi = DEEPSEEK_FIT_RANGE
  where = "" if lo <= C <= hi else f", extrapolated from the fitted {lo:.0e}–{hi:.0e} FLOPs"
  eq = "DeepSeek LLM (arXiv 2401.02954) Sec. 3.1 eq. 1"
  return HParams(
      rule="deepseek", peak_lr=lr, global_batch_size=gbs, b2=base.b2,
      warmup_steps=min(base.warmup_steps, budget.max_warmup_steps(steps)), steps=steps,
      min_steps=min_steps, batch_tokens=b_tok, batch_clamp=clamp,
      sources=dict(peak_lr=f"{eq}: 0.3118·C^-0.1250 at C={C:.3g}{where}",
                   global_batch_size=f"{eq}: 0.2920·C^0.3271 tokens at C={C:.3g}{where}"
                                     + (f", clamped ({clamp})" if clamp else ""),
                   b2="base config", warmup_steps="base config, capped at 10% of the steps"))


def porian(N: float, C: float, seq_len: int, base: Base, *, min_steps: int = 1,
           max_global_batch_size: int = MAX_GLOBAL_BATCH_SIZE,
           fit: PowerLawFit | None = None) -> HParams:
  """Porian et al. 2024's form: LR and batch as power laws of N, β2 by batch, warmup ≈ N tokens.

  * peak_lr = fit.lr_coef·N^fit.lr_exponent and batch = fit.batch_coef·
    N^fit.batch_exponent tokens when ``fit`` (default :data:`PORIAN_FIT`) is
    given; otherwise the base's peak_lr and batch (the paper's fitted
    constants are not in chinchax).
  * the batch goes through :func:`batch_for_tokens` (whole sequences, clipped,
    shrunk to give ``min_steps`` steps);
  * b2 = :func:`b2_for_batch` of the final batch against the base batch;
  * warmup = N tokens, ceil(N / tokens_per_step) steps, capped at 10% of the
    steps (:func:`warmup_steps_for_tokens`). Porian et al. count N as the
    linear layers' weights with the head and without the input embedding
    (their Table 2 and App. B); for chinchax's tied models that is the total
    N less the norm scales, so the total N is passed as it is.

  Raises:
    ValueError: a non-positive N, C or seq_len.
  """
  fit = PORIAN_FIT if fit is None else fit
  D = _tokens(N, C)
  base_tok = float(base.global_batch_size * seq_len)
  if fit is None:
    lr, b_tok = base.peak_lr, base_tok
    lr_src = batch_src = "base config (Porian et al. 2024's fitted constants not in chinchax)"
  else:
    lr = fit.lr_coef * float(N) ** fit.lr_exponent
    b_tok = fit.batch_coef * float(N) ** fit.batch_exponent
    lr_src = f"power law in N: {fit.lr_coef:g}·N^{fit.lr_exponent:g} at N={N:.4g}"
    batch_src = f"power law in N: {fit.batch_coef:g}·N^{fit.batch_exponent:g} tokens at N={N:.4g}"
  gbs, clamp = batch_for_tokens(b_tok, tokens=D, seq_len=seq_len, min_steps=min_steps,
                                max_global_batch_size=max_global_batch_size)
  tps = gbs * seq_len
  steps = budget.steps_for_tokens(D, tps)
  return HParams(
      rule="porian", peak_lr=lr, global_batch_size=gbs, b2=b2_for_batch(tps, base_tok, base.b2),
      warmup_steps=warmup_steps_for_tokens(float(N), tps, steps), steps=steps,
      min_steps=min_steps, batch_tokens=b_tok, batch_clamp=clamp,
      sources=dict(peak_lr=lr_src,
                   global_batch_size=batch_src + (f", clamped ({clamp})" if clamp else ""),
                   b2="1-b2 ∝ batch tokens from the base's b2, in [base b2, 0.999] "
                      "(chinchax.cost.hparams.b2_for_batch)",
                   warmup_steps="N tokens (Porian et al. 2024), capped at 10% of the steps"))


# The named rules, in the order the error message lists them.
RULES = {"fixed": fixed, "deepseek": deepseek, "porian": porian}


def hparams_for_run(rule: str, N: float, C: float, seq_len: int, base: Base, *,
                    min_steps: int = 1,
                    max_global_batch_size: int = MAX_GLOBAL_BATCH_SIZE) -> HParams:
  """The settings ``rule`` gives a run of N parameters and budget C (see :data:`RULES`).

  Raises:
    ConfigError: an unknown ``rule`` (the message lists the known ones).
    ValueError: a non-positive N, C or seq_len.
  """
  check_rule(rule)
  if not (math.isfinite(N) and N > 0):
    raise ValueError(f"N must be a positive finite number of parameters, got {N!r}")
  if not (math.isfinite(C) and C > 0):
    raise ValueError(f"C must be a positive finite number of FLOPs, got {C!r}")
  budget.check_positive_int(seq_len, "seq_len")
  return RULES[rule](N, C, seq_len, base, min_steps=min_steps,
                     max_global_batch_size=max_global_batch_size)


def apply_to_config(rule: str, train_config, N: float, C: float, *, min_steps: int = 1,
                    max_global_batch_size: int = MAX_GLOBAL_BATCH_SIZE):
  """A copy of ``train_config`` with ``rule``'s peak_lr, global_batch_size, b2 and warmup_steps.

  ``train_config`` is a run's training config (``chinchax.config.base_config``
  layout); its ``train`` section is the base the rule starts from. ``"fixed"``
  returns an unchanged copy.

  Returns:
    (config, hparams): the new config and the :class:`HParams` behind it.
  Raises:
    ConfigError: an unknown ``rule``, or a run with fewer than ``min_steps``
      steps even at one sequence per step (the message names N, C and the steps).
  """
  t = train_config.train
  hp = hparams_for_run(rule, N, C, int(t.seq_len), Base.from_config(t), min_steps=min_steps,
                       max_global_batch_size=max_global_batch_size)
  if hp.short:
    raise config_lib.ConfigError(
        f"hyperparameter rule {rule!r} gives the run of N={N:,.0f}, C={C:.3g} only {hp.steps} "
        f"step(s) of {hp.global_batch_size}×{t.seq_len} tokens (ladder.min_steps={min_steps}); "
        f"raise ladder.c_min or shorten train_config.train.seq_len")
  c = train_config.copy_and_resolve_references()
  if rule != "fixed":
    c.train.update(peak_lr=hp.peak_lr, global_batch_size=hp.global_batch_size, b2=hp.b2,
                   warmup_steps=hp.warmup_steps)
  return c, hp
