"""Training: the run spec, the sharded train state, the pure train step, and the loop.

``train(config)`` validates the config, settles the budget (N, D, C, steps),
builds or loads the token store, creates the train state directly sharded over
the mesh (eval_shape → shardings → jitted init with out_shardings), resumes
from the latest checkpoint in the workdir, and runs the jitted train step with
explicit in/out shardings and donation. Metrics go to ``metrics.jsonl``; the
loop fetches step t's metrics only after step t+1 is dispatched.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import pathlib
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from chinchax import attention as attention_lib
from chinchax import budget
from chinchax import checkpoint as checkpoint_lib
from chinchax import config as config_lib
from chinchax import distributed as distributed_lib
from chinchax import model as model_lib
from chinchax import sharding as sharding_lib
from chinchax import tblog
from chinchax.data import builder as builder_lib
from chinchax.data import pipeline as pipeline_lib
from chinchax.data import store as store_lib
from chinchax.data import tokenizers as tokenizers_lib

# Dense bf16 peak FLOP/s per chip by jax device_kind substring (vendor data sheets).
_KNOWN_PEAK_FLOPS = (
    ("H200", 989e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("A100", 312e12),
    ("L40S", 362e12), ("L4", 121e12),
    ("TPU v6", 918e12), ("TPU v5p", 459e12), ("TPU v5 lite", 197e12), ("TPU v5e", 197e12),
    ("TPU v4", 275e12),
)


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """Everything a run settles before touching data or devices.

  Attributes:
    model: the static model config.
    seq_len, global_batch_size: tokens per sequence and sequences per step.
    counts: parameter counts (total / non-embedding / embedding).
    n_params: the N of the budget (``budget.n_kind``).
    target_tokens: D asked for by the budget (tokens).
    steps: training steps = round(D / tokens_per_step), at least 1.
    tokens: actual tokens seen = steps × global_batch_size × seq_len.
    flops_6nd: C = 6·N·tokens (FLOPs).
    warmup_steps: linear warmup steps (≤ 10% of steps).
    mesh: resolved {"data", "fsdp", "tensor"} sizes.
  """

  model: model_lib.ModelConfig
  seq_len: int
  global_batch_size: int
  counts: budget.ParamCounts
  n_kind: str
  n_params: int
  target_tokens: float
  steps: int
  tokens: int
  flops_6nd: float
  warmup_steps: int
  mesh: dict

  @property
  def tokens_per_step(self) -> int:
    return self.global_batch_size * self.seq_len

  @property
  def tokens_per_param(self) -> float:
    return self.tokens / self.n_params

  def shape(self) -> budget.ModelShape:
    return self.model.shape(self.seq_len)


def resolve(config, n_devices: int, backend: str | None = None) -> RunSpec:
  """Validates ``config`` and settles model, budget and mesh (cheap: no data, no devices used).

  Raises:
    ConfigError: any invalid value (see ``chinchax.config.validate``), or a
      budget smaller than one step.
    TokenizerError: (a DataError) data.tokenizer_path is missing or not a tokenizer.json.
  """
  config_lib.validate(config, n_devices)
  backend = backend or jax.default_backend()
  tok = tokenizers_lib.make_tokenizer(config.data)
  m = config.model
  vocab = m.vocab_size or tok.vocab_size
  if not m.vocab_size and backend != "cpu":
    vocab = -(-vocab // 128) * 128  # pad to a multiple of 128 for the accelerators' matmul units
  if vocab < tok.vocab_size:
    raise config_lib.ConfigError(
        f"model.vocab_size={vocab} is smaller than the {config.data.tokenizer!r} tokenizer's "
        f"{tok.vocab_size}; use 0 (follow the tokenizer) or ≥ {tok.vocab_size}")
  dtype = m.compute_dtype
  if dtype == "auto":
    dtype = "float32" if backend == "cpu" else "bfloat16"
  mcfg = model_lib.ModelConfig(
      vocab_size=vocab, d_model=m.d_model, n_layers=m.n_layers, n_heads=m.n_heads, d_ff=m.d_ff,
      tie_embeddings=m.tie_embeddings, rope_theta=m.rope_theta, norm_eps=m.norm_eps,
      init_std=m.init_std, compute_dtype=dtype,
      attention=attention_lib.resolve_impl(m.attention, backend, dtype), remat=m.remat,
      scan_layers=bool(m.scan_layers))
  t, b = config.train, config.budget
  counts = budget.param_counts(mcfg.shape(t.seq_len))
  n = counts.total if b.n_kind == "total" else counts.non_embedding
  per_step = t.global_batch_size * t.seq_len
  if b.mode == "tokens_per_param":
    target = budget.tokens_for_budget(n, tokens_per_param=b.tokens_per_param)
  elif b.mode == "flops":
    target = budget.tokens_for_budget(n, flops=b.flops)
  elif b.mode == "tokens":
    target = float(b.tokens)
  else:
    target = float(b.steps * per_step)
  steps = int(round(target / per_step))
  if steps < 1:
    raise config_lib.ConfigError(
        f"the budget gives D={target:.4g} tokens, less than one step of global_batch_size×seq_len"
        f" = {per_step} tokens; raise the budget or shrink the batch")
  warmup = min(t.warmup_steps, steps // 10)
  return RunSpec(model=mcfg, seq_len=t.seq_len, global_batch_size=t.global_batch_size,
                 counts=counts, n_kind=b.n_kind, n_params=n, target_tokens=target, steps=steps,
                 tokens=steps * per_step, flops_6nd=budget.flops_6nd(n, steps * per_step),
                 warmup_steps=warmup, mesh=config_lib.resolve_mesh_shape(config.mesh, n_devices))


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
  """True for parameters that get weight decay: matrices (ndim ≥ 2), not norms;
  the embedding / output head only if ``decay_embeddings``."""

  def decide(path, x):
    names = {getattr(k, "key", getattr(k, "name", None)) for k in path}
    if x.ndim < 2:
      return False
    if names & {"embed_VD", "head_DV"}:
      return decay_embeddings
    return True

  return jax.tree_util.tree_map_with_path(decide, params)


def make_optimizer(config, spec: RunSpec):
  """optax chain: global-norm clipping (if > 0) then AdamW with the decay mask."""
  t = config.train
  schedule = lr_schedule(config, spec)
  parts = []
  if t.grad_clip > 0:
    parts.append(optax.clip_by_global_norm(t.grad_clip))
  parts.append(optax.adamw(schedule, b1=t.b1, b2=t.b2, eps=t.eps, weight_decay=t.weight_decay,
                           mask=lambda p: weight_decay_mask(p, t.decay_embeddings)))
  return optax.chain(*parts), schedule


def loss_terms(logits_BTV: jax.Array, targets_BT: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Mean cross-entropy (nats/token) and mean (log Z)² over [B, T], in float32."""
  logits_BTV = logits_BTV.astype(jnp.float32)
  log_z_BT = jax.nn.logsumexp(logits_BTV, axis=-1)
  target_logit_BT = jnp.take_along_axis(logits_BTV, targets_BT[..., None], axis=-1)[..., 0]
  return jnp.mean(log_z_BT - target_logit_BT), jnp.mean(log_z_BT ** 2)


def make_train_step(graphdef, tx, schedule, z_loss: float) -> Callable:
  """The pure train step: (state, batch int32 [B, T+1]) → (state, metrics)."""

  def train_step(state, batch_BT1):
    inputs_BT, targets_BT = batch_BT1[:, :-1], batch_BT1[:, 1:]

    def loss_fn(params):
      logits_BTV = nnx.merge(graphdef, params)(inputs_BT)
      ce, z2 = loss_terms(logits_BTV, targets_BT)
      return ce + z_loss * z2, ce

    (_, ce), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    metrics = {"loss": ce, "grad_norm": optax.tree.norm(grads), "lr": schedule(state["step"])}
    return {"step": state["step"] + 1, "params": params, "opt_state": opt_state}, metrics

  return train_step


def jit_train_step(graphdef, tx, schedule, config, shardings, mesh) -> Callable:
  """The jitted train step exactly as :func:`train` runs it (``chinchax bench`` times this one).

  Explicit in/out shardings (state by ``shardings``, batch over (data, fsdp)),
  the state donated.

  Args:
    graphdef: the model's NNX graph definition (from :func:`abstract_state`).
    tx, schedule: from :func:`make_optimizer`.
    config: the run's ConfigDict (``train.z_loss`` is read).
    shardings: the train state's shardings (``sharding.state_shardings``).
    mesh: the device mesh.
  Returns:
    jitted (state, batch int32 [B, T+1]) → (state, metrics).
  """
  return jax.jit(make_train_step(graphdef, tx, schedule, config.train.z_loss),
                 in_shardings=(shardings, sharding_lib.batch_sharding(mesh)),
                 out_shardings=(shardings, None), donate_argnums=0)


def global_batch(batch_sh, local_BT1, global_batch_size: int) -> jax.Array:
  """This process's rows int32 [b, T+1] of a batch → the global [global_batch_size, T+1] array."""
  return jax.make_array_from_process_local_data(
      batch_sh, local_BT1, (global_batch_size, local_BT1.shape[1]))


def make_eval_step(graphdef) -> Callable:
  def eval_step(params, batch_BT1):
    logits_BTV = nnx.merge(graphdef, params)(batch_BT1[:, :-1])
    return loss_terms(logits_BTV, batch_BT1[:, 1:])[0]
  return eval_step


def abstract_state(mcfg: model_lib.ModelConfig, tx, seed: int):
  """(graphdef, abstract train state, init function) without allocating anything."""

  def init():
    model = model_lib.Transformer(mcfg, nnx.Rngs(params=seed))
    _, params = nnx.split(model, nnx.Param)
    return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}

  abs_model = nnx.eval_shape(lambda: model_lib.Transformer(mcfg, nnx.Rngs(params=seed)))
  graphdef, _ = nnx.split(abs_model, nnx.Param)
  return graphdef, jax.eval_shape(init), init


def create_state(mcfg, tx, mesh, seed: int):
  """Creates the train state directly sharded: eval_shape → shardings → jit(init, out_shardings).

  Returns:
    (graphdef, state, state_shardings).
  """
  graphdef, abs_state, init = abstract_state(mcfg, tx, seed)
  shardings = sharding_lib.state_shardings(abs_state, mesh)
  state = jax.jit(init, out_shardings=shardings)()
  return graphdef, state, shardings


def peak_flops(config, n_devices: int) -> tuple[float, str]:
  """Peak FLOP/s of the devices a run uses (the MFU denominator), and its source.

  Order: ``train.peak_flops_per_device`` × devices if set; the dense bf16
  data-sheet peak of a known accelerator × devices; on CPU, where virtual
  devices share the host's cores, a measured float32 matmul throughput of the
  host × processes.
  """
  if config.train.peak_flops_per_device > 0:
    return float(config.train.peak_flops_per_device) * n_devices, "config"
  kind = jax.devices()[0].device_kind
  for key, peak in _KNOWN_PEAK_FLOPS:
    if key.lower() in kind.lower():
      return peak * n_devices, f"data sheet ({kind}, {peak:.3g} FLOP/s per device)"
  if jax.default_backend() == "cpu":
    return calibrate_cpu_flops() * jax.process_count(), "CPU float32 matmul calibration of the host"
  return float("nan"), f"unknown device {kind!r}; set train.peak_flops_per_device"


def calibrate_cpu_flops(n: int = 1024, repeats: int = 5) -> float:
  """Host float32 matmul throughput in FLOP/s: best of ``repeats`` [n,n]@[n,n] on device 0."""
  a = jax.device_put(jnp.ones((n, n), jnp.float32), jax.local_devices()[0])
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    f(a).block_until_ready()
    best = min(best, time.perf_counter() - t0)
  return 2 * n ** 3 / best


def compiled_train_step_cost(config) -> dict:
  """XLA ``cost_analysis()`` of the compiled train step for ``config`` on the current devices.

  Returns:
    {"flops": FLOPs per step, "bytes accessed": bytes per step, ...} as XLA reports
    them (summed over the program; per device program under SPMD).
  """
  n_dev = jax.device_count()
  spec = resolve(config, n_dev)
  mesh = sharding_lib.make_mesh(spec.mesh)
  tx, schedule = make_optimizer(config, spec)
  graphdef, abs_state, _ = abstract_state(spec.model, tx, config.seed)
  shardings = sharding_lib.state_shardings(abs_state, mesh)
  step = jit_train_step(graphdef, tx, schedule, config, shardings, mesh)
  batch = jax.ShapeDtypeStruct((spec.global_batch_size, spec.seq_len + 1), jnp.int32)
  cost = step.lower(abs_state, batch).compile().cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0]
  return dict(cost)


def log_spaced_steps(steps: int, n: int) -> set[int]:
  """Up to ``n`` distinct steps in [1, steps], log-spaced (for loss-vs-FLOPs curves)."""
  if n <= 0:
    return set()
  return {int(s) for s in np.unique(np.round(np.geomspace(1, steps, n)).astype(int))}


class _Metrics:
  """Appends JSONL rows and TensorBoard scalars (``chinchax.tblog``; process 0 only).

  On resume drops JSONL rows past the restored step and purges them in TensorBoard.
  """

  def __init__(self, path: pathlib.Path, resume_step: int, enabled: bool):
    self.path, self.enabled = path, enabled
    self.tb = None
    if enabled and path.exists():
      keep = [l for l in path.read_text().splitlines()
              if l.strip() and json.loads(l).get("step", 0) <= resume_step]
      path.write_text("".join(l + "\n" for l in keep))
    if enabled:
      self.tb = tblog.ScalarWriter(path.parent / tblog.TB_DIR,
                                   purge_step=resume_step + 1 if resume_step else None)

  def write(self, row: dict) -> None:
    if self.enabled:
      with self.path.open("a") as f:
        f.write(json.dumps(row) + "\n")
      self.tb.write(row)

  def close(self) -> None:
    if self.tb is not None:
      self.tb.close()


def _say(msg: str) -> None:
  if jax.process_index() == 0:
    print(msg, flush=True)


def describe(spec: RunSpec, config, n_devices: int) -> str:
  """The run's budget printout: shape, N three ways, D, C, tokens/param, steps, mesh."""
  c = spec.counts
  m = spec.model
  return "\n".join([
      f"model   d_model={m.d_model} n_layers={m.n_layers} n_heads={m.n_heads} d_ff={m.d_ff} "
      f"vocab_size={m.vocab_size} seq_len={spec.seq_len} tied={m.tie_embeddings} "
      f"compute={m.compute_dtype} attention={m.attention} remat={m.remat}"
      f"{' scan_layers' if m.scan_layers else ''}",
      f"params  total={c.total:,} non_embedding={c.non_embedding:,} embedding={c.embedding:,}"
      f"  (N for the budget: {spec.n_kind} = {spec.n_params:,})",
      f"budget  mode={config.budget.mode} target D={spec.target_tokens:,.0f} tokens -> "
      f"steps={spec.steps:,} x {spec.tokens_per_step:,} tokens/step = D={spec.tokens:,} tokens",
      f"        C = 6·N·D = {spec.flops_6nd:.4g} FLOPs; tokens per parameter D/N = "
      f"{spec.tokens_per_param:.2f}",
      f"mesh    {spec.mesh} on {n_devices} {jax.default_backend()} device(s), "
      f"{jax.process_count()} process(es)",
  ])


def prepare_data(config, spec: RunSpec, rows: tuple[int, int] | None = None):
  """Builds/loads the store and the train/eval pipelines; raises DataError before any compile.

  In a multi-process run process 0 builds the token store first while the others
  wait, then they load it (or, on a host without the shared filesystem, build
  their own copy).

  Args:
    rows: the rows [r0, r1) of every global train and eval batch this process
      reads (default: an equal contiguous share by process index).
  """
  with distributed_lib.process_zero_first("chinchax:token-store"):
    directory = builder_lib.prepare(
        config.data, progress=config.train.progress and jax.process_index() == 0)
  train_split = store_lib.TokenSplit(directory, "train")
  val_split = store_lib.TokenSplit(directory, "val")
  if rows is None:
    P_, p = jax.process_count(), jax.process_index()
    per_proc = spec.global_batch_size // P_
    rows = (p * per_proc, (p + 1) * per_proc)
  batches = pipeline_lib.TrainBatches(
      train_split, spec.seq_len, spec.global_batch_size, spec.steps, config.seed,
      allow_repeat=config.data.allow_repeat, rows=rows)
  evals = pipeline_lib.eval_batches(val_split, spec.seq_len, spec.global_batch_size,
                                    config.train.eval_batches, rows=rows)
  return directory, train_split, val_split, batches, evals


def train(config, devices=None, verbose: bool = True) -> dict:
  """Runs (or resumes) one training run; returns the summary also written to summary.json.

  Args:
    config: the run's ConfigDict (see ``chinchax.config``).
    devices: devices to build the mesh from (default: all ``jax.devices()``).
    verbose: print the budget, data and result lines (process 0 only).

  Raises:
    ConfigError: invalid config (before any data is read).
    DataError: missing/empty/too-small corpus, or repetition not allowed (before compiling).
    CheckpointError: the workdir's checkpoint does not match the config's model.
    Preempted: a preemption request (SIGTERM) stopped the run at a step
      boundary after a checkpoint was saved (see ``chinchax.distributed``).
  """
  t_start = time.time()
  say = _say if verbose else (lambda msg: None)
  devices = list(jax.devices() if devices is None else devices)
  n_devices = len(devices)
  spec = resolve(config, n_devices)
  workdir = pathlib.Path(os.path.expanduser(config.workdir)).resolve()
  checkpoint_lib.check_compatible(workdir, config, vocab_size=spec.model.vocab_size)
  say(describe(spec, config, n_devices))
  mesh = sharding_lib.make_mesh(spec.mesh, devices)
  batch_sh = sharding_lib.batch_sharding(mesh)
  batch_rows = distributed_lib.process_row_range(batch_sh, spec.global_batch_size)
  directory, train_split, val_split, batches, evals = prepare_data(config, spec, batch_rows)
  manifest = train_split.manifest
  say(f"data    store {directory}: train {train_split.n_tokens:,} tokens, val "
       f"{val_split.n_tokens:,} tokens; run reads {batches.plan.epochs:.3f} epochs")
  unigram = store_lib.unigram_entropy_nats(val_split.all_tokens(), spec.model.vocab_size)
  eval_tokens = len(evals) * spec.global_batch_size * spec.seq_len
  # Bits per byte of text, comparable across tokenizers: each split's tokens/bytes ratio.
  train_bpb = lambda nats: store_lib.bits_per_byte(nats, train_split.n_tokens, train_split.n_bytes)
  bpb = lambda nats: store_lib.bits_per_byte(nats, val_split.n_tokens, val_split.n_bytes)

  workdir.mkdir(parents=True, exist_ok=True)
  tx, schedule = make_optimizer(config, spec)
  ckpt = checkpoint_lib.Checkpointer(workdir / "checkpoints", config.train.checkpoint_every,
                                     config.train.keep_checkpoints)
  graphdef, abs_state, init = abstract_state(spec.model, tx, config.seed)
  shardings = sharding_lib.state_shardings(abs_state, mesh)
  state = ckpt.restore_latest(abs_state, shardings)
  resumed = state is not None
  if state is None:
    state = jax.jit(init, out_shardings=shardings)()
  start_step = int(jax.device_get(state["step"]))
  if jax.process_index() == 0:
    checkpoint_lib.write_run_config(workdir, config, spec)
  if resumed:
    say(f"resumed from checkpoint at step {start_step} in {workdir}")

  step_fn = jit_train_step(graphdef, tx, schedule, config, shardings, mesh)
  eval_fn = jax.jit(make_eval_step(graphdef), in_shardings=(shardings["params"], batch_sh))

  def to_global(local_BT1):
    return global_batch(batch_sh, local_BT1, spec.global_batch_size)

  def evaluate(params):
    losses = [eval_fn(params, to_global(b)) for b in evals]
    return float(np.mean(jax.device_get(losses)))

  peak_total, peak_src = peak_flops(config, n_devices)
  flops_per_step = budget.matmul_flops_per_token(spec.shape()) * spec.tokens_per_step
  metrics_log = _Metrics(workdir / "metrics.jsonl", start_step, jax.process_index() == 0)
  progress = None
  if config.train.progress and jax.process_index() == 0 and start_step < spec.steps:
    from tqdm.auto import tqdm
    progress = tqdm(total=spec.steps, initial=start_step, unit="step", dynamic_ncols=True,
                    file=sys.stdout)

  eval_at = log_spaced_steps(spec.steps, config.train.eval_points)
  last_train_loss, eval_loss = float("nan"), float("nan")
  timed_steps, timed_seconds = 0, 0.0
  pending = None  # (step, metrics, tokens/s window) fetched after the next dispatch
  window_t0, window_steps = time.perf_counter(), 0
  compile_s = None

  def flush(p):
    nonlocal last_train_loss
    step_no, m, extra = p
    m = jax.device_get(m)
    last_train_loss = float(m["loss"])
    row = {"step": step_no, "loss": last_train_loss,
           "bits_per_byte": train_bpb(last_train_loss), "grad_norm": float(m["grad_norm"]),
           "lr": float(m["lr"]), "tokens": step_no * spec.tokens_per_step, **extra}
    metrics_log.write(row)
    if progress is not None:
      progress.set_postfix(loss=f"{last_train_loss:.3f}", eval=f"{eval_loss:.3f}", refresh=False)

  for step, local_batch in batches.iterator(start_step, num_threads=config.data.read_threads):
    t_step = time.perf_counter()
    state, metrics = step_fn(state, to_global(local_batch))
    if compile_s is None:
      jax.block_until_ready(state["step"])
      compile_s = time.perf_counter() - t_step
      window_t0, window_steps = time.perf_counter(), 0
    else:
      window_steps += 1
    if pending is not None:
      flush(pending)
      pending = None
    done = step + 1
    if progress is not None:
      progress.update(1)
    is_last = done == spec.steps
    is_eval = done % config.train.eval_every == 0 or is_last or done in eval_at
    if done % config.train.log_every == 0 or is_eval:
      jax.block_until_ready(metrics["loss"])
      extra = {}
      if window_steps:
        dt = time.perf_counter() - window_t0
        timed_steps += window_steps
        timed_seconds += dt
        step_time = dt / window_steps
        tps = spec.tokens_per_step / step_time
        extra = {"step_time_s": step_time, "tokens_per_s": tps,
                 "mfu": flops_per_step / step_time / peak_total}
      if is_eval:
        eval_loss = evaluate(state["params"])
        extra["eval_loss"] = eval_loss
        extra["eval_bits_per_byte"] = bpb(eval_loss)
      pending = (done, metrics, extra)
      if is_last or done % config.train.checkpoint_every == 0:
        ckpt.save(done, state, force=is_last)
      window_t0, window_steps = time.perf_counter(), 0
    elif done % config.train.checkpoint_every == 0:
      ckpt.save(done, state)
    if not is_last and distributed_lib.reached_preemption(done):
      if pending is not None:
        flush(pending)
        pending = None
      if ckpt.latest_step() != done:
        ckpt.save(done, state, force=True)
      ckpt.wait_and_close()
      metrics_log.close()
      if progress is not None:
        progress.close()
      say(f"preempted at step {done}: checkpoint saved in {workdir / 'checkpoints'}")
      raise distributed_lib.Preempted(done, str(workdir))
  if pending is not None:
    flush(pending)
  ckpt.wait_and_close()
  metrics_log.close()
  if progress is not None:
    progress.close()

  final_step = int(jax.device_get(state["step"]))
  if math.isnan(eval_loss):
    eval_loss = evaluate(state["params"])
  if math.isnan(last_train_loss) and (workdir / "metrics.jsonl").exists():
    rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines() if l]
    last_train_loss = next((r["loss"] for r in reversed(rows) if "loss" in r), float("nan"))
  step_time = timed_seconds / timed_steps if timed_steps else float("nan")
  tps = spec.tokens_per_step / step_time if timed_steps else float("nan")
  mfu = flops_per_step / step_time / peak_total if timed_steps else float("nan")
  summary = {
      "workdir": str(workdir), "steps": final_step, "tokens": final_step * spec.tokens_per_step,
      "planned_tokens": spec.tokens, "target_tokens": spec.target_tokens,
      "N": spec.n_params, "n_kind": spec.n_kind, "params_total": spec.counts.total,
      "params_non_embedding": spec.counts.non_embedding, "params_embedding": spec.counts.embedding,
      "C_6nd": spec.flops_6nd, "tokens_per_param": spec.tokens_per_param,
      "final_train_loss": last_train_loss, "final_eval_loss": eval_loss,
      "final_train_bits_per_byte": train_bpb(last_train_loss),
      "tokenizer": manifest["tokenizer"]["name"], "val_bytes": val_split.n_bytes,
      "eval_tokens": eval_tokens,
      "final_eval_bits_per_byte": bpb(eval_loss),
      "val_unigram_entropy_nats": unigram, "val_unigram_entropy_bits_per_byte": bpb(unigram),
      "eval_below_unigram": 1.0 - eval_loss / unigram,
      "step_time_s": step_time, "tokens_per_s": tps, "mfu": mfu,
      "peak_flops": peak_total, "peak_flops_source": peak_src,
      "compile_s": compile_s, "wall_s": time.time() - t_start, "resumed": resumed,
      "store": str(directory), "store_fingerprint": manifest["fingerprint"],
  }
  if jax.process_index() == 0:
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
  say(f"done    step {final_step}/{spec.steps}, tokens {summary['tokens']:,} "
       f"(planned D {spec.tokens:,})")
  say(f"loss    final train {last_train_loss:.4f} nats/token; final eval {eval_loss:.4f} nats/token"
       f" = {summary['final_eval_bits_per_byte']:.3f} bits/byte")
  say(f"        val unigram entropy {unigram:.4f} nats/token = "
       f"{summary['val_unigram_entropy_bits_per_byte']:.3f} bits/byte; eval loss is "
       f"{100 * abs(summary['eval_below_unigram']):.1f}% "
       f"{'below' if summary['eval_below_unigram'] >= 0 else 'above'} it")
  say(f"speed   {tps:,.0f} tokens/s, {step_time * 1e3:.1f} ms/step, MFU {100 * mfu:.2f}% "
       f"(peak {peak_total:.3g} FLOP/s: {peak_src}); wall {summary['wall_s']:.1f}s")
  return summary
