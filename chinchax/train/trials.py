"""Trials in one program: K runs of one shape stacked on a leading axis, stepped by one jit.

A run with ``train.lr_multipliers`` and/or ``train.trial_seeds`` carries K =
len(multipliers) × len(seeds) trials. Trial k trains with peak LR
``train.peak_lr``·m_k from init seed s_k; all K read one batch stream (the data
order of ``data.shuffle_seed``, else ``seed``). Their params and optimizer states
are stacked on a leading trial axis (the letter K; replicated over the mesh, the
other axes sharded as a single run's), and one jitted program updates all K
(``train.trial_batching``): ``vmap`` of the single run's train step over
(params, opt_state, m_k), so each kernel does K× the work of one launch, or
``loop``, the K single steps traced one after another into the one program.
``auto`` takes loop on CPU and vmap on accelerators: on the ladder's CPU shapes
(d_model 8…68, one core) neither beats K separate steps, loop is as fast as vmap
or faster and bitwise equal to the single runs (``benchmarks/trials_throughput.py``,
docs/tuning.md); vmap is for backends where the small kernels' launch
cost, not their arithmetic, sets the step time.

A trial whose loss, grad norm or updated parameters turn NaN/Inf stops alone: from that step on
its params and optimizer state are frozen (``alive`` False, ``diverged_step``
set, both in the checkpointed state) and its losses are recorded as NaN; the
others go on. The run's ``loss`` is the mean over live trials, so it turns
non-finite (and ``train.stop_on_nonfinite`` stops the run) only when every
trial has diverged.

Trial k equals the single run of :func:`trial_config` (peak_lr·m_k, seed s_k,
the shared data order): bit for bit on fp32 CPU with ``loop`` (``tests/test_trials.py``;
for a multiplier other than a power of two the LR may differ from peak_lr·m_k's in
its last bit, ``optim.scaled``), and within 1e-5 in every parameter after 8 steps with
``vmap``, whose batched kernels may order sums otherwise (measured 1.2e-7).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from chinchax import config as config_lib
from chinchax.model import sharding as sharding_lib
import chinchax.train.optim as optim
import chinchax.train.step as step_lib
from chinchax.train.evaluate import Evaluator
from chinchax.train.spec import RunSpec


@dataclasses.dataclass(frozen=True)
class Trial:
  """One trial of a trials run: index k, LR multiplier, init seed and its peak LR."""

  index: int
  lr_mult: float
  seed: int
  peak_lr: float

  def to_json(self) -> dict:
    return {"trial": self.index, "lr_mult": self.lr_mult, "seed": self.seed,
            "peak_lr": self.peak_lr}


def parse_trials(config) -> tuple[Trial, ...]:
  """The run's trials (multipliers outer, seeds inner); () for a plain single run.

  Raises:
    ConfigError: a malformed ``train.lr_multipliers`` or ``train.trial_seeds``.
  """
  mults = config_lib.parse_lr_multipliers(config.train.lr_multipliers)
  seeds = config_lib.parse_trial_seeds(config.train.trial_seeds)
  if not mults and not seeds:
    return ()
  mults, seeds = mults or (1.0,), seeds or (config.seed,)
  return tuple(Trial(k, m, s, config.train.peak_lr * m)
               for k, (m, s) in enumerate(itertools.product(mults, seeds)))


def trial_config(config, trial: Trial):
  """The single-run config trial ``trial`` equals: peak_lr·m, seed s, the shared data order."""
  c = config.copy_and_resolve_references()
  with c.unlocked():
    c.data.shuffle_seed = config_lib.data_shuffle_seed(config)
    c.seed = trial.seed
    c.train.peak_lr = trial.peak_lr
    c.train.lr_multipliers = ""
    c.train.trial_seeds = ""
  return c


def check_supported(config, trials: tuple[Trial, ...]) -> None:
  """Raises ConfigError for what a trials run does not do (before any expensive work)."""
  if trials and config.train.init_from.strip():
    raise config_lib.ConfigError(
        f"train.init_from={config.train.init_from!r} cannot start {len(trials)} trials "
        f"(train.lr_multipliers / train.trial_seeds); start them from scratch or run one trial")


def _stacked(tree, k: int):
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct((k,) + tuple(a.shape), a.dtype), tree)


def _stacked_sharding(sharding: NamedSharding) -> NamedSharding:
  return NamedSharding(sharding.mesh, P(None, *sharding.spec))


def resolve_batching(batching: str, platform: str) -> str:
  """``train.trial_batching`` for a backend: "auto" is "loop" on CPU (as fast as or faster than vmap
  at the ladder's shapes, ``benchmarks/trials_throughput.py``, and bitwise equal to single
  runs) and "vmap" on accelerators (batched kernels, K× the work per kernel launch)."""
  if batching != "auto":
    return batching
  return "loop" if platform == "cpu" else "vmap"


def make_trials_step(single_step_for, lr_mults: jax.Array, batching: str = "vmap"):
  """The pure trials step: (state, batch int32 [B, T+1]) → (state, metrics).

  ``single_step_for(m)`` is the single run's train step with its LR schedule
  scaled by ``m``. ``batching`` "vmap": it is vmapped over (params, opt_state, m)
  with the batch and step shared (batched kernels: K× the work per op); "loop":
  the K single steps are traced one after another into the one program (each
  trial's ops exactly the single run's: bitwise, but no batched kernels). A trial is
  frozen (``alive`` False) at the first step whose loss, grad norm or updated
  parameters are not all finite. Metrics: ``trial_loss``, ``trial_grad_norm``,
  ``trial_lr`` float32 [K] (NaN for a diverged trial), ``alive`` bool [K]; ``loss`` the
  mean over live trials and ``grad_norm`` their largest (NaN when none is live), ``lr``
  the first live trial's (trial 0's when none is).
  """
  k = lr_mults.shape[0]

  def one(params, opt_state, m, step, batch_BT1):
    new, metrics = single_step_for(m)({"step": step, "params": params, "opt_state": opt_state},
                                      batch_BT1)
    return new["params"], new["opt_state"], metrics

  def stepped(params, opt_state, step, batch_BT1):
    if batching == "vmap":
      return jax.vmap(one, in_axes=(0, 0, 0, None, None))(params, opt_state, lr_mults, step,
                                                          batch_BT1)
    outs = [one(jax.tree.map(lambda x: x[i], params), jax.tree.map(lambda x: x[i], opt_state),
                lr_mults[i], step, batch_BT1) for i in range(k)]
    return jax.tree.map(lambda *xs: jnp.stack(xs), *outs)

  def finite_K(tree):  # bool [K]: every entry of trial k's arrays is finite
    leaves = [jnp.all(jnp.isfinite(x), axis=tuple(range(1, x.ndim)))
              for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(leaves), axis=0)

  def trials_step(state, batch_BT1):
    params, opt_state, m = stepped(state["params"], state["opt_state"], state["step"], batch_BT1)
    ok_K = (state["alive"] & jnp.isfinite(m["loss"]) & jnp.isfinite(m["grad_norm"])
            & finite_K(params))

    def keep(new, old):
      return jnp.where(ok_K.reshape((k,) + (1,) * (new.ndim - 1)), new, old)

    n_live = jnp.sum(ok_K)
    nan = jnp.float32(jnp.nan)
    loss_K = jnp.where(ok_K, m["loss"], nan)
    grad_K = jnp.where(ok_K, m["grad_norm"], nan)
    metrics = {
        "loss": jnp.where(n_live > 0, jnp.sum(jnp.where(ok_K, m["loss"], 0.0)) / n_live, nan),
        "grad_norm": jnp.where(n_live > 0, jnp.max(jnp.where(ok_K, m["grad_norm"], -1.0)), nan),
        "lr": m["lr"][jnp.argmax(ok_K)], "trial_loss": loss_K, "trial_grad_norm": grad_K,
        "trial_lr": m["lr"], "alive": ok_K}
    if "z_loss" in m:
      metrics["z_loss"] = jnp.where(n_live > 0, jnp.sum(jnp.where(ok_K, m["z_loss"], 0.0))
                                    / n_live, nan)
    return {"step": state["step"] + 1,
            "params": jax.tree.map(keep, params, state["params"]),
            "opt_state": jax.tree.map(keep, opt_state, state["opt_state"]),
            "alive": ok_K,
            "diverged_step": jnp.where(state["alive"] & ~ok_K, state["step"] + 1,
                                       state["diverged_step"])}, metrics

  return trials_step


def build_trials_program(config, spec: RunSpec, mesh: Mesh,
                         trials: tuple[Trial, ...]) -> tuple[step_lib.TrainProgram,
                                                             step_lib.TrainProgram]:
  """(trials program, single program): the K-trial state and step, and the one-trial
  program whose eval step and shardings each trial is evaluated with.

  The trials state is {"step": int32, "params", "opt_state": stacked [K, ...],
  "alive": bool [K], "diverged_step": int32 [K] (0 while alive)}; its shardings put
  None (replicated) on the trial axis and the single run's sharding on the rest.
  """
  single = step_lib.build_program(config, spec, mesh)
  k = len(trials)
  lr_mults = np.asarray([t.lr_mult for t in trials], np.float32)
  z_loss = config.train.z_loss

  def single_step_for(m):
    tx, schedule = optim.make_optimizer(config, spec, lr_scale=m)
    return step_lib.make_train_step(single.graphdef, tx, schedule, z_loss, spec.microbatches,
                                    spec.loss_chunk_size, single.shardings["params"])

  inits = [step_lib.make_init(spec, single.tx, t.seed) for t in trials]

  def init():
    states = [f() for f in inits]
    return {"step": jnp.zeros((), jnp.int32),
            "params": jax.tree.map(lambda *xs: jnp.stack(xs), *[s["params"] for s in states]),
            "opt_state": jax.tree.map(lambda *xs: jnp.stack(xs),
                                      *[s["opt_state"] for s in states]),
            "alive": jnp.ones((k,), bool), "diverged_step": jnp.zeros((k,), jnp.int32)}

  a = single.abstract_state
  abstract_state = {"step": a["step"], "params": _stacked(a["params"], k),
                    "opt_state": _stacked(a["opt_state"], k),
                    "alive": jax.ShapeDtypeStruct((k,), jnp.bool_),
                    "diverged_step": jax.ShapeDtypeStruct((k,), jnp.int32)}
  replicated = NamedSharding(mesh, P())
  sh = single.shardings
  shardings = {"step": sh["step"], "params": jax.tree.map(_stacked_sharding, sh["params"]),
               "opt_state": jax.tree.map(_stacked_sharding, sh["opt_state"]),
               "alive": replicated, "diverged_step": replicated}
  trials_step = make_trials_step(single_step_for, jnp.asarray(lr_mults),
                                 resolve_batching(config.train.trial_batching,
                                                  mesh.devices.flat[0].platform))
  step = jax.jit(sharding_lib.under_mesh(trials_step, mesh),
                 in_shardings=(shardings, single.batch_sharding), out_shardings=(shardings, None),
                 donate_argnums=0, compiler_options=single.compiler_options)
  program = dataclasses.replace(single, abstract_state=abstract_state, shardings=shardings,
                                step=step, init=init)
  return program, single


class TrialsEvaluator:
  """Each live trial evaluated by the single run's :class:`Evaluator` (bitwise its eval).

  :meth:`evaluate_state` returns the best live trial's (loss, se) and keeps every
  trial's in :attr:`per_trial` (NaN for a diverged trial).
  """

  def __init__(self, single: step_lib.TrainProgram, data, curve_windows: int, k: int):
    self.inner = Evaluator(single, data, curve_windows)
    self.k = k
    self.per_trial: list[tuple[float, float | None]] = []
    self._take = jax.jit(lambda params, i: jax.tree.map(lambda x: x[i], params),
                         out_shardings=single.shardings["params"])

  def evaluate_state(self, state, final: bool = True) -> tuple[float, float | None]:
    alive = np.asarray(jax.device_get(state["alive"]))
    out = []
    for i in range(self.k):
      out.append(self.inner(self._take(state["params"], i), final) if alive[i]
                 else (math.nan, None))
    self.per_trial = out
    live = [i for i in range(self.k) if math.isfinite(out[i][0])]
    return out[min(live, key=lambda i: out[i][0])] if live else (math.nan, None)

  def best(self) -> int | None:
    """Index of the trial with the lowest last eval loss (None when none is finite)."""
    live = [i for i, (loss, _) in enumerate(self.per_trial) if math.isfinite(loss)]
    return min(live, key=lambda i: self.per_trial[i][0]) if live else None

  def row_fields(self) -> dict:
    """``trial_eval_loss``: the last eval's loss of each trial, nats/token (None: diverged)."""
    return {"trial_eval_loss": [loss if math.isfinite(loss) else None
                                for loss, _ in self.per_trial]}


def describe(trials: tuple[Trial, ...]) -> str:
  """The run's one-line trial listing (LR multipliers, seeds, peak LRs)."""
  return (f"trials  {len(trials)} in one program: " + ", ".join(
      f"#{t.index} lr×{t.lr_mult:g} (peak {t.peak_lr:.3g}) seed {t.seed}" for t in trials))


def summarize_trials(summary: dict, trials: tuple[Trial, ...], evaluate: TrialsEvaluator,
                     last_train_loss, diverged_step, bits_per_byte=None) -> dict:
  """The summary of a trials run: ``trials`` (one record per trial) and ``best_trial``.

  Each record: the trial's hyperparameters (:meth:`Trial.to_json`), its
  ``final_eval_loss`` and ``final_eval_loss_se`` (nats/token; None once
  diverged), ``final_train_loss`` (its last logged train loss) and
  ``diverged_step`` (the first step whose loss or grad norm was NaN/Inf; None
  while it trained to the end). The run's own ``final_eval_loss`` (and its SE) is the best
  trial's, its ``final_train_loss`` (and ``final_train_bits_per_byte``, through
  ``bits_per_byte``: nats/token → bits/byte of the training split) that trial's train
  loss, ``best_trial`` its index (None when every trial diverged).
  """
  best = evaluate.best()
  train = list(last_train_loss or [None] * len(trials))
  records = []
  for t, (loss, se), tl, ds in zip(trials, evaluate.per_trial, train, diverged_step):
    finite = math.isfinite(loss)
    records.append({**t.to_json(), "final_eval_loss": loss if finite else None,
                    "final_eval_loss_se": se if finite and se is not None else None,
                    "final_train_loss": tl if tl is not None and math.isfinite(tl) else None,
                    "diverged_step": int(ds) if int(ds) > 0 else None})
  out = {**summary, "trials": records, "best_trial": best}
  if best is not None and records[best]["final_train_loss"] is not None:
    out["final_train_loss"] = records[best]["final_train_loss"]
    if bits_per_byte is not None:
      out["final_train_bits_per_byte"] = bits_per_byte(out["final_train_loss"])
  return out


def report(summary: dict, say) -> None:
  """One result line per trial (eval loss or the step it diverged at); the best is starred."""
  for r in summary["trials"]:
    star = "*" if r["trial"] == summary["best_trial"] else " "
    what = (f"eval {r['final_eval_loss']:.4f} nats/token" if r["final_eval_loss"] is not None
            else f"diverged at step {r['diverged_step']}")
    say(f"trial {star}#{r['trial']} lr×{r['lr_mult']:g} (peak {r['peak_lr']:.3g}) "
        f"seed {r['seed']}: {what}")
