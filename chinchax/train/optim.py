"""The optimizer of a run: learning-rate schedule, weight-decay mask, the optax chain."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from chinchax.model import transformer as model_lib
from chinchax.train.spec import RunSpec


def one_minus_sqrt_decay(init_value: float, end_value: float,
                         transition_steps: int) -> optax.Schedule:
  """init_value → end_value over ``transition_steps`` steps along 1 - sqrt(t / transition_steps).

  lr(t) = end + (init - end) · (1 - sqrt(min(t, T) / T)): the "(1-sqrt)" cooldown
  of Hägele et al. 2024 ("Scaling Laws and Compute-Optimal Training Beyond Fixed
  Training Durations", Sec. 3), which they find better than a linear one. optax has
  no schedule of this shape (its ``polynomial_schedule`` is (1 - t/T)^p).
  """
  span = float(max(transition_steps, 1))

  def schedule(count):
    frac = jnp.clip(jnp.asarray(count, jnp.float32) / span, 0.0, 1.0)
    return end_value + (init_value - end_value) * (1.0 - jnp.sqrt(frac))

  return schedule


def wsd_schedule(peak_lr: float, end_lr: float, warmup_steps: int, decay_start_step: int,
                 last_step: int, decay_shape: str) -> optax.Schedule:
  """Warmup-stable-decay: linear warmup to ``peak_lr``, constant, then a final decay.

  Step ``s`` (0-based, the update index) gets: s / warmup_steps · peak_lr while
  s < warmup_steps; peak_lr until ``decay_start_step``; then a ``decay_shape``
  ("linear" or "1-sqrt") decay reaching ``end_lr`` at ``last_step`` (the run's
  last update, ``steps - 1``, as for the cosine). With ``decay_start_step >=
  last_step`` there is no decay: the constant-LR trunk of Hägele et al. 2024
  (Sec. 3), whose value at every step before a branch's decay start equals
  the branch's. Built from ``optax.join_schedules``.
  """
  schedules, boundaries = [], []
  if warmup_steps:
    schedules.append(optax.linear_schedule(0.0, peak_lr, warmup_steps))
    boundaries.append(warmup_steps)
  schedules.append(optax.constant_schedule(peak_lr))
  span = last_step - decay_start_step
  if span > 0:
    if decay_shape == "linear":
      schedules.append(optax.linear_schedule(peak_lr, end_lr, span))
    else:
      schedules.append(one_minus_sqrt_decay(peak_lr, end_lr, span))
    boundaries.append(decay_start_step)
  if len(schedules) == 1:
    return schedules[0]
  return optax.join_schedules(schedules, boundaries)


def lr_schedule(config, spec: RunSpec) -> optax.Schedule:
  """The run's LR schedule by ``train.schedule``: cosine (default) or wsd.

  cosine: linear warmup to ``train.peak_lr`` then cosine decay to
  ``min_lr_ratio``·peak. The decay ends exactly at the run's last step (step
  index ``steps - 1``): Chinchilla (Hoffmann et al. 2022, Sec. 3 / App. B)
  finds a cosine cycle matched to the run length, decaying 10×, to be best.

  wsd: :func:`wsd_schedule` with the decay from ``spec.decay_start_step`` to
  ``min_lr_ratio``·peak at the last step, shaped by ``train.decay_shape``.
  """
  t = config.train
  if t.schedule == "wsd":
    return wsd_schedule(t.peak_lr, t.peak_lr * t.min_lr_ratio, spec.warmup_steps,
                        spec.decay_start_step, spec.steps - 1, t.decay_shape)
  decay_steps = max(spec.steps - 1, spec.warmup_steps + 1)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0 if spec.warmup_steps else t.peak_lr, peak_value=t.peak_lr,
      warmup_steps=spec.warmup_steps, decay_steps=decay_steps,
      end_value=t.peak_lr * t.min_lr_ratio)


def weight_decay_mask(params, decay_embeddings: bool):
  """True for parameters that get weight decay, by role (``model.param_role``), not rank:
  projection matrices always, norm scales never (also when ``scan_layers`` stacks them
  to [L, D]), the embedding / output head only if ``decay_embeddings``."""

  def decide(path, _):
    role = model_lib.param_role(path)
    return decay_embeddings if role == "embedding" else role == "matrix"

  return jax.tree_util.tree_map_with_path(decide, params)


def scaled(schedule: optax.Schedule, lr_scale) -> optax.Schedule:
  """``schedule`` times ``lr_scale`` (a float or a traced float32 scalar): a trial's LR.

  For a power-of-two ``lr_scale`` the product equals, bit for bit, the schedule
  built with ``lr_scale``·peak_lr (every schedule here is linear in its peak);
  for another value it may differ from it in the last bit of the LR.
  """
  return lambda count: schedule(count) * lr_scale


def make_optimizer(config, spec: RunSpec, lr_scale=None):
  """optax chain: global-norm clipping (if > 0) then AdamW with the decay mask.

  Args:
    lr_scale: None (the run's own schedule), or a multiplier of it (a float or a
      traced scalar: one trial of ``train.trials``; see :func:`scaled`).
  Returns:
    (tx, schedule): the optax GradientTransformation and its LR schedule.
  """
  t = config.train
  schedule = lr_schedule(config, spec)
  if lr_scale is not None:
    schedule = scaled(schedule, lr_scale)
  parts = []
  if t.grad_clip > 0:
    parts.append(optax.clip_by_global_norm(t.grad_clip))
  parts.append(optax.adamw(schedule, b1=t.b1, b2=t.b2, eps=t.eps, weight_decay=t.weight_decay,
                           mask=lambda p: weight_decay_mask(p, t.decay_embeddings)))
  return optax.chain(*parts), schedule
