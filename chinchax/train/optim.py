"""The optimizer of a run: learning-rate schedule, weight-decay mask, the optax chain."""

from __future__ import annotations

import jax
import optax

from chinchax import model as model_lib
from chinchax.train.spec import RunSpec


def lr_schedule(config, spec: RunSpec) -> optax.Schedule:
  """Linear warmup to ``train.peak_lr`` then cosine decay to ``min_lr_ratio``·peak.

  The decay ends exactly at the run's last step (step index ``steps - 1``):
  Chinchilla (Hoffmann et al. 2022, Sec. 3 / App. B) finds a cosine cycle
  matched to the run length, decaying 10×, to be best.
  """
  t = config.train
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


def make_optimizer(config, spec: RunSpec):
  """optax chain: global-norm clipping (if > 0) then AdamW with the decay mask.

  Returns:
    (tx, schedule): the optax GradientTransformation and its LR schedule.
  """
  t = config.train
  schedule = lr_schedule(config, spec)
  parts = []
  if t.grad_clip > 0:
    parts.append(optax.clip_by_global_norm(t.grad_clip))
  parts.append(optax.adamw(schedule, b1=t.b1, b2=t.b2, eps=t.eps, weight_decay=t.weight_decay,
                           mask=lambda p: weight_decay_mask(p, t.decay_embeddings)))
  return optax.chain(*parts), schedule
