"""The one builder of a run's train state and jitted step, used by train, bench and tests.

:func:`build_program` turns a config and its :class:`~chinchax.train.spec.RunSpec`
into a :class:`TrainProgram` on a mesh: the optimizer, the model's graph
definition, the abstract train state and its shardings (from the one rules
table in ``chinchax.model.sharding``), the pure train step jitted with explicit
in/out shardings and the state donated, and the jitted eval step. Nothing is
allocated or compiled until :meth:`TrainProgram.init_state` or the first call.

Shape letters: B batch rows, T sequence length, V vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from chinchax import config as config_lib
from chinchax.model import transformer as model_lib
from chinchax.model import sharding as sharding_lib
import chinchax.train.compiler as compiler
import chinchax.train.loss as loss_lib
import chinchax.train.optim as optim
import chinchax.train.spec as spec_lib
from chinchax.train.loss import loss_terms
from chinchax.train.spec import RunSpec


def split_microbatches(batch_BT1: jax.Array, microbatches: int) -> jax.Array:
  """[B, T+1] → [M, B/M, T+1]: microbatch m holds rows m, M+m, 2M+m, … of the batch.

  Rows are taken with a stride of M so that every device's block of B/(data×fsdp)
  rows splits into M blocks it already holds: each microbatch keeps the batch's
  sharding over data×fsdp (no collective moves a token). ``config.check_microbatches``
  guarantees B/M rows divide over data×fsdp.
  """
  B = batch_BT1.shape[0]
  rows = sharding_lib.constrain(batch_BT1.reshape(B // microbatches, microbatches, -1),
                                ("batch", None, "seq"))  # [B/M, M, T+1]
  return sharding_lib.constrain(jnp.swapaxes(rows, 0, 1), (None, "batch", "seq"))


def make_loss_and_grad(graphdef, z_loss: float, microbatches: int = 1, loss_chunk_size: int = 0,
                       grad_shardings=None, grad_reduce: str = "microbatch") -> Callable:
  """(params, batch int32 [B, T+1]) → (float32 gradients of the step's loss, mean
  cross-entropy, mean (log Z)²), the means over all B·T tokens (nats/token; nats²).

  The loss is the mean cross-entropy plus ``z_loss``·mean (log Z)² (PaLM,
  Chowdhery et al. 2022, Sec. 5). With ``microbatches`` M > 1 the batch is split by
  :func:`split_microbatches` and a ``lax.scan`` runs forward and backward on one
  microbatch [B/M, T+1] at a time; each one's loss is its token sums divided by the
  step's total tokens B·T, so the float32 gradients summed over the microbatches are the
  gradient of the step's mean over all its tokens (a microbatch weighs by its tokens).
  ``loss_chunk_size`` C > 0 computes the logits and loss C positions at a time
  (``loss.chunked_row_sums``). With M = 1 and C = 0 it is ``value_and_grad`` of the plain
  mean loss (no scan). ``grad_shardings`` (the params' shardings) pins the layout of the
  gradient accumulator.

  ``grad_reduce`` (M > 1 on a mesh whose batch axes data × fsdp hold S > 1 devices):
    "microbatch"  the scan sums gradients already reduced over data × fsdp, so the
                  compiler reduces (all-reduce; reduce-scatter for fsdp) every microbatch:
                  M reductions per step; the accumulator is sharded like the parameters.
    "step"        :func:`_step_reduced`: each device scans its own rows under
                  ``jax.shard_map`` over data × fsdp, accumulating its local, unreduced
                  gradient, and the S partial sums are reduced once after the scan: one
                  reduction per step whatever M, in the dtype the unsplit step reduces in
                  (bytes independent of M). On fsdp the weights are gathered once per step
                  in the compute dtype (not per microbatch and layer) and the accumulator is
                  a full float32 gradient per device (held twice by the scan): 8 + 2 bytes
                  per parameter over tensor under bfloat16 beside the sharded state
                  (``chinchax.cost.work.mesh_memory_per_device``).
  Under float32 compute both are the same sums up to float32 round-off (the order of the
  additions); under bfloat16 "step" rounds each shard's float32 sum of its microbatches to
  bfloat16 once before the exchange, as the unsplit step rounds its gradient.
  """

  def merge(params):
    return nnx.merge(graphdef, params)

  def loss_fn(params, batch_BT1):  # M = 1: the step's means over [B, T]
    inputs_BT, targets_BT = batch_BT1[:, :-1], batch_BT1[:, 1:]
    if loss_chunk_size:
      ce_B, z2_B = loss_lib.model_row_sums(merge(params), inputs_BT, targets_BT, loss_chunk_size)
      ce, z2 = jnp.sum(ce_B) / targets_BT.size, jnp.sum(z2_B) / targets_BT.size
    else:
      ce, z2 = loss_terms(merge(params)(inputs_BT), targets_BT)
    return ce + z_loss * z2, (ce, z2)

  def micro_loss_fn(params, mb_BT1, n_tokens):  # a microbatch's sums over the step's tokens
    mb_BT1 = sharding_lib.constrain(mb_BT1, ("batch", "seq"))
    ce_B, z2_B = loss_lib.model_row_sums(merge(params), mb_BT1[:, :-1], mb_BT1[:, 1:],
                                         loss_chunk_size)
    ce, z2 = jnp.sum(ce_B) / n_tokens, jnp.sum(z2_B) / n_tokens
    return ce + z_loss * z2, (ce, z2)

  def accumulate(params, batch_BT1, n_tokens, shardings):
    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    if shardings is not None:
      zeros = jax.tree.map(jax.lax.with_sharding_constraint, zeros, shardings)

    def one(carry, mb_BT1):
      grads, ce, z2 = carry
      (_, (ce_m, z2_m)), g = jax.value_and_grad(micro_loss_fn, has_aux=True)(params, mb_BT1,
                                                                             n_tokens)
      grads = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), grads, g)
      return (grads, ce + ce_m, z2 + z2_m), None

    init = (zeros, jnp.float32(0), jnp.float32(0))
    (grads, ce, z2), _ = jax.lax.scan(one, init, split_microbatches(batch_BT1, microbatches))
    return grads, ce, z2

  def loss_and_grad(params, batch_BT1):
    if microbatches == 1:
      (_, (ce, z2)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch_BT1)
      return grads, ce, z2
    n_tokens = jnp.float32(batch_BT1.shape[0] * (batch_BT1.shape[1] - 1))
    axes = _batch_axes()
    if grad_reduce == "step" and axes:
      return _step_reduced(accumulate, params, batch_BT1, n_tokens, axes, grad_shardings,
                           merge(params).cfg.compute_dtype)
    return accumulate(params, batch_BT1, n_tokens, grad_shardings)

  return loss_and_grad


def _batch_axes() -> tuple[str, ...]:
  """The mesh axes (of the abstract mesh in context) the batch splits over, of size > 1."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return ()
  spec = sharding_lib.logical_to_spec(("batch",), None, mesh)[0]
  return () if spec is None else (spec if isinstance(spec, tuple) else (spec,))


def _step_reduced(accumulate, params, batch_BT1, n_tokens, axes, grad_shardings, compute_dtype):
  """The microbatch scan per batch shard (``jax.shard_map`` over ``axes``, the others left to
  the compiler), then one sum over the S shards' local gradients [S, ...]: one all-reduce (or
  reduce-scatter onto the parameters' fsdp sharding) per step.

  Each shard holds B/S contiguous rows and splits them as :func:`split_microbatches` splits
  the whole batch (local row j to microbatch j mod M; B/(S·M) is whole by
  ``config.check_microbatches``), so microbatch m holds the same rows as unsplit.

  The weights enter the shards already cast to ``compute_dtype`` (:func:`_compute_params`), so
  on fsdp they are gathered once per step in that dtype, and a microbatch's gradient of a
  weight comes in that dtype, as in the unsplit step. A shard sums its microbatches' gradients
  in float32 and casts the sum back to that dtype for the exchange: the reduction runs in
  the dtype the unsplit step reduces in (bfloat16 matrices and embeddings, float32 norm
  scales under bfloat16 compute; all float32 under float32 compute), so its bytes do not
  depend on M; the reduced gradient is float32 again. The sum over shards is the compiler's
  (a ``lax.reduce`` of the sharded leading axis), not a ``psum`` in the shards: XLA:CPU
  aborts on the bfloat16 all-reduce a partially manual ``shard_map`` lowers a ``psum`` to.
  """
  from jax.sharding import PartitionSpec as P

  mesh = jax.sharding.get_abstract_mesh()
  batch_spec = P(axes)
  params_c = _compute_params(params, compute_dtype)
  dtypes = jax.tree.map(lambda p: p.dtype, params_c)

  def local(params_c, rows_bT1):
    grads, ce, z2 = accumulate(params_c, rows_bT1, n_tokens, None)
    grads = jax.tree.map(lambda g, d: g.astype(d)[None], grads, dtypes)
    return grads, ce[None], z2[None]

  grads_S, ce_S, z2_S = jax.shard_map(
      local, mesh=mesh, in_specs=(P(), batch_spec), out_specs=(batch_spec,) * 3,
      axis_names=set(axes), check_vma=False)(params_c, batch_BT1)
  # lax.reduce keeps a bfloat16 sum in bfloat16 (jnp.sum would widen it to float32 first)
  grads = jax.tree.map(lambda g: jax.lax.reduce(g, jnp.zeros((), g.dtype), jax.lax.add, (0,)),
                       grads_S)
  if grad_shardings is not None:
    grads = jax.tree.map(jax.lax.with_sharding_constraint, grads, grad_shardings)
  return jax.tree.map(lambda g: g.astype(jnp.float32), grads), jnp.sum(ce_S), jnp.sum(z2_S)


def _compute_params(params, compute_dtype):
  """The parameters as the model computes with them: matrices and embeddings cast to
  ``compute_dtype`` (the model casts them there itself, so only the place of the cast moves),
  norm scales float32 (RMSNorm computes in float32)."""
  dt = jnp.dtype(compute_dtype)

  def one(path, p):
    return p if model_lib.param_role(path) == "norm" else p.astype(dt)

  return jax.tree_util.tree_map_with_path(one, params)


def make_train_step(graphdef, tx, schedule, z_loss: float, microbatches: int = 1,
                    loss_chunk_size: int = 0, grad_shardings=None,
                    grad_reduce: str = "microbatch") -> Callable:
  """The pure train step: (state, batch int32 [B, T+1]) → (state, metrics).

  The gradient of the step's mean loss over all its tokens (:func:`make_loss_and_grad`:
  ``microbatches`` M accumulated in float32 and reduced over the batch axes once per step or
  once per microbatch (``grad_reduce``), logits in chunks of ``loss_chunk_size``
  positions), then one optimizer update. ``metrics["loss"]`` is the step's mean
  cross-entropy per token, ``metrics["grad_norm"]`` the norm of the (summed) gradient and,
  when ``z_loss`` > 0, ``metrics["z_loss"]`` the term added to the loss.
  """
  loss_and_grad = make_loss_and_grad(graphdef, z_loss, microbatches, loss_chunk_size,
                                     grad_shardings, grad_reduce)

  def train_step(state, batch_BT1):
    grads, ce, z2 = loss_and_grad(state["params"], batch_BT1)
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    metrics = {"loss": ce, "grad_norm": optax.tree.norm(grads), "lr": schedule(state["step"])}
    if z_loss > 0:
      metrics["z_loss"] = z_loss * z2
    return {"step": state["step"] + 1, "params": params, "opt_state": opt_state}, metrics

  return train_step


def make_eval_step(graphdef, loss_chunk_size: int = 0) -> Callable:
  """The pure eval step: (params, batch int32 [B, T+1]) → mean cross-entropy (nats/token);
  with ``loss_chunk_size`` > 0 the logits are computed that many positions at a time."""

  def eval_step(params, batch_BT1):
    model = nnx.merge(graphdef, params)
    if loss_chunk_size:
      ce_B, _ = loss_lib.model_row_sums(model, batch_BT1[:, :-1], batch_BT1[:, 1:],
                                        loss_chunk_size)
      return jnp.sum(ce_B) / (ce_B.shape[0] * (batch_BT1.shape[1] - 1))
    return loss_terms(model(batch_BT1[:, :-1]), batch_BT1[:, 1:])[0]

  return eval_step


def make_eval_rows_step(graphdef, loss_chunk_size: int = 0) -> Callable:
  """The pure per-row eval: (params, batch int32 [B, T+1]) → float32 [B] mean cross-entropy
  (nats/token) of each row, the same terms as :func:`loss_terms` averaged over T only."""

  def eval_rows_step(params, batch_BT1):
    model = nnx.merge(graphdef, params)
    if loss_chunk_size:
      ce_B, _ = loss_lib.model_row_sums(model, batch_BT1[:, :-1], batch_BT1[:, 1:],
                                        loss_chunk_size)
      return ce_B / (batch_BT1.shape[1] - 1)
    logits_BTV = model(batch_BT1[:, :-1]).astype(jnp.float32)
    log_z_BT = jax.nn.logsumexp(logits_BTV, axis=-1)
    target_logit_BT = jnp.take_along_axis(logits_BTV, batch_BT1[:, 1:, None], axis=-1)[..., 0]
    return jnp.mean(log_z_BT - target_logit_BT, axis=-1)

  return eval_rows_step


def jit_eval_rows(program: "TrainProgram") -> Callable:
  """:func:`make_eval_rows_step` jitted on ``program``'s mesh: params and batch as in the
  eval step, the [B] losses replicated so every process can read them all."""
  rows_step = make_eval_rows_step(program.graphdef, program.spec.loss_chunk_size)
  return jax.jit(sharding_lib.under_mesh(rows_step, program.mesh),
                 in_shardings=(program.shardings["params"], program.batch_sharding),
                 out_shardings=NamedSharding(program.mesh, jax.sharding.PartitionSpec()),
                 compiler_options=program.compiler_options)


def global_batch(batch_sh, local_BT1, global_batch_size: int) -> jax.Array:
  """This process's rows int32 [b, T+1] of a batch → the global [global_batch_size, T+1] array."""
  return jax.make_array_from_process_local_data(
      batch_sh, local_BT1, (global_batch_size, local_BT1.shape[1]))


@dataclasses.dataclass(frozen=True)
class TrainProgram:
  """A run's train state structure and jitted functions on one mesh (nothing allocated yet).

  Attributes:
    spec: the run spec it was built for.
    mesh: the device mesh.
    tx, schedule: the optax optimizer and its LR schedule (``train.optim``).
    graphdef: the model's NNX graph definition.
    abstract_state: {"step", "params", "opt_state"} as ShapeDtypeStructs.
    shardings: the state's NamedShardings (same tree).
    batch_sharding: sharding of a global batch int32 [B, T+1] (rows over data×fsdp).
    step: jitted (state, batch [B, T+1]) → (state, metrics), state donated.
    eval_step: jitted (params, batch [B, T+1]) → mean cross-entropy.
    compiler_options: the XLA options every program of the run is compiled with
      (``train.compiler_options`` resolved by ``train.compiler.resolve``).
  """

  spec: RunSpec
  mesh: Mesh
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  graphdef: Any
  abstract_state: Any
  shardings: Any
  batch_sharding: NamedSharding
  step: Callable
  eval_step: Callable
  init: Callable
  compiler_options: dict = dataclasses.field(default_factory=dict)

  def init_state(self):
    """A fresh train state created directly sharded (jit of the init with out_shardings)."""
    return jax.jit(self.init, out_shardings=self.shardings)()

  def global_batch(self, local_BT1) -> jax.Array:
    """This process's rows int32 [b, T+1] → the global batch [B, T+1] on the mesh."""
    return global_batch(self.batch_sharding, local_BT1, self.spec.global_batch_size)

  def lower(self):
    """The train step lowered for abstract inputs that carry their shardings.

    ``lower().compile()`` is the very executable the step's own calls reuse,
    so compiling it ahead of a timed loop does not compile twice.
    """
    state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                         self.abstract_state, self.shardings)
    batch = jax.ShapeDtypeStruct((self.spec.global_batch_size, self.spec.seq_len + 1),
                                 jnp.int32, sharding=self.batch_sharding)
    return self.step.lower(state, batch)


def make_init(spec: RunSpec, tx: optax.GradientTransformation, seed: int) -> Callable:
  """() → a fresh train state {"step": int32 0, "params", "opt_state"} from init ``seed``."""

  def init():
    model = model_lib.Transformer(spec.model, nnx.Rngs(params=seed))
    _, params = nnx.split(model, nnx.Param)
    return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}

  return init


def build_program(config, spec: RunSpec, mesh: Mesh) -> TrainProgram:
  """Builds the optimizer, abstract state, shardings and jitted steps of a run on ``mesh``.

  The state is sized by ``nnx.eval_shape`` (no allocation); its shardings come
  from the logical-axis rules (``sharding.state_shardings``); the step is jitted
  with explicit in/out shardings (state as the shardings, batch over
  (data, fsdp)) and donates the state; it accumulates ``spec.microbatches`` microbatches and
  computes the loss in chunks of ``spec.loss_chunk_size`` positions (:func:`make_loss_and_grad`;
  the eval steps use the chunks too). Every program is compiled with
  ``train.compiler_options`` (``train.compiler.resolve``).

  Args:
    config: the run's ConfigDict (``train.*`` optimizer knobs, ``train.z_loss``, ``seed``).
    spec: ``resolve(config, n_devices)``.
    mesh: the device mesh (``sharding.make_mesh(spec.mesh, devices)``).
  Raises:
    ConfigError: ``train.compiler_options`` that this XLA refuses.
  """
  options = compiler.resolve(config_lib.compiler_options_text(config.train),
                             mesh.devices.flat[0].platform)
  tx, schedule = optim.make_optimizer(config, spec)
  init = make_init(spec, tx, config.seed)
  abs_model = nnx.eval_shape(
      lambda: model_lib.Transformer(spec.model, nnx.Rngs(params=config.seed)))
  graphdef, _ = nnx.split(abs_model, nnx.Param)
  abstract_state = jax.eval_shape(init)
  shardings = sharding_lib.state_shardings(abstract_state, mesh)
  batch_sh = sharding_lib.batch_sharding(mesh)
  step = jax.jit(sharding_lib.under_mesh(
                     make_train_step(graphdef, tx, schedule, config.train.z_loss,
                                     spec.microbatches, spec.loss_chunk_size,
                                     shardings["params"], spec.grad_reduce), mesh),
                 in_shardings=(shardings, batch_sh), out_shardings=(shardings, None),
                 donate_argnums=0, compiler_options=options)
  eval_step = jax.jit(sharding_lib.under_mesh(make_eval_step(graphdef, spec.loss_chunk_size), mesh),
                      in_shardings=(shardings["params"], batch_sh),
                      compiler_options=options)
  return TrainProgram(spec=spec, mesh=mesh, tx=tx, schedule=schedule, graphdef=graphdef,
                      abstract_state=abstract_state, shardings=shardings,
                      batch_sharding=batch_sh, step=step, eval_step=eval_step, init=init,
                      compiler_options=options)


def compiled_train_step_cost(config) -> dict:
  """XLA ``cost_analysis()`` of the compiled train step for ``config`` on the current devices.

  Returns:
    {"flops": FLOPs per step, "bytes accessed": bytes per step, ...} as XLA reports
    them (summed over the program; per device program under SPMD).
  """
  spec = spec_lib.resolve(config, jax.device_count())
  program = build_program(config, spec, sharding_lib.make_mesh(spec.mesh))
  cost = program.lower().compile().cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0]
  return dict(cost)
