"""The run spec: everything a run settles from its config before touching data or devices."""

from __future__ import annotations

import dataclasses

import jax

from chinchax.model import attention as attention_lib
from chinchax.cost import budget
from chinchax.cost import work
from chinchax import config as config_lib
from chinchax.model import transformer as model_lib
from chinchax.data import tokenizers as tokenizers_lib
import chinchax.train.loss as loss_lib


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """Everything a run settles before touching data or devices.

  Attributes:
    model: the static model config.
    seq_len, global_batch_size: tokens per sequence and sequences per step.
    counts: parameter counts (total / non-embedding / embedding).
    n_kind: which N the budget counts (``"total"`` or ``"non_embedding"``).
    n_params: the N of the budget (``budget.n_kind``).
    target_tokens: D asked for by the budget (tokens).
    steps: training steps = round(D / tokens_per_step), at least 1.
    tokens: actual tokens seen = steps × global_batch_size × seq_len.
    flops_6nd: C = 6·N·tokens (FLOPs).
    warmup_steps: linear warmup steps (≤ 10% of steps).
    mesh: resolved {"data", "fsdp", "tensor"} sizes, and "dcn_data" (the part of data split
      across slices, ``mesh.dcn_data``) when it is above 1.
    decay_start_step: for ``train.schedule="wsd"``, the step where the final decay
      begins (see :func:`wsd_decay_start`; ``>= steps - 1`` means no decay); 0 for cosine.
    microbatches: M, the microbatches each step's global batch is split into
      (``train.microbatches``; gradients accumulated inside the one step).
    grad_reduce: "step" (one gradient reduction per step) or "microbatch", from
      ``train.grad_reduce`` (``cost.work.resolve_grad_reduce``; matters only with M > 1).
    loss_chunk_size: sequence positions per chunk of the logits and loss, resolved from
      ``train.loss_chunk_size`` for the backend (``train.loss.resolve_chunk_size``); 0 = unchunked.
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
  decay_start_step: int = 0
  microbatches: int = 1
  loss_chunk_size: int = 0
  grad_reduce: str = "microbatch"

  @property
  def tokens_per_step(self) -> int:
    return self.global_batch_size * self.seq_len

  @property
  def tokens_per_param(self) -> float:
    return self.tokens / self.n_params

  def shape(self) -> budget.ModelShape:
    return self.model.shape(self.seq_len)


def wsd_decay_start(steps: int, decay_fraction: float, decay_start_step: int = 0) -> int:
  """The step where a warmup-stable-decay schedule's decay begins.

  ``decay_start_step`` when given (> 0), else round(steps · (1 - decay_fraction)):
  the decay spans the last ``decay_fraction`` of the run (Hägele et al. 2024,
  "Scaling Laws and Compute-Optimal Training Beyond Fixed Training Durations",
  Sec. 3). The start depends only on the step count, so a long constant-LR run
  (a trunk) and a shorter run branching off it agree up to the branch step.
  """
  if decay_start_step:
    return int(decay_start_step)
  return int(round(steps * (1.0 - decay_fraction)))


def resolve(config, n_devices: int, backend: str | None = None) -> RunSpec:
  """Validates ``config`` and settles model, budget and mesh (cheap: no data, no devices used).

  Raises:
    ConfigError: any invalid value (see ``chinchax.config.validate``), or a
      budget smaller than one step, or a wsd decay that would start inside the warmup.
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
  t, b = config.train, config.budget
  shape = budget.ModelShape.from_config(m, seq_len=t.seq_len, vocab_size=vocab)
  mcfg = model_lib.ModelConfig(
      **dataclasses.asdict(shape), rope_theta=m.rope_theta, norm_eps=m.norm_eps,
      init_std=model_lib.init_std(m.init, m.init_std, m.d_model), compute_dtype=dtype,
      attention=attention_lib.resolve_impl(m.attention, backend, dtype, m.document_mask,
                                           seq_len=t.seq_len),
      remat=m.remat, scan_layers=bool(m.scan_layers), document_mask=m.document_mask,
      eos_id=tok.eos_id)
  counts = budget.param_counts(shape)
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
  steps = budget.steps_for_tokens(target, per_step)
  if steps < 1:
    raise config_lib.ConfigError(
        f"the budget gives D={target:.4g} tokens, less than one step of global_batch_size×seq_len"
        f" = {per_step} tokens; raise the budget or shrink the batch")
  warmup = min(t.warmup_steps, budget.max_warmup_steps(steps))
  decay_start = 0
  if t.schedule == "wsd":
    decay_start = wsd_decay_start(steps, t.decay_fraction, t.decay_start_step)
    if decay_start < warmup:
      raise config_lib.ConfigError(
          f"train.decay_start_step={t.decay_start_step} is inside the {warmup}-step warmup; "
          f"use 0 (the last train.decay_fraction of the steps) or a step >= {warmup}")
  mesh = config_lib.resolve_mesh_shape(config.mesh, n_devices)
  if config.mesh.get("dcn_data", 1) > 1:
    mesh["dcn_data"] = int(config.mesh.dcn_data)
  return RunSpec(model=mcfg, seq_len=t.seq_len, global_batch_size=t.global_batch_size,
                 counts=counts, n_kind=b.n_kind, n_params=n, target_tokens=target, steps=steps,
                 tokens=steps * per_step, flops_6nd=budget.flops_6nd(n, steps * per_step),
                 warmup_steps=warmup, mesh=mesh,
                 decay_start_step=decay_start, microbatches=int(t.microbatches),
                 loss_chunk_size=loss_lib.resolve_chunk_size(t.loss_chunk_size, backend,
                                                             t.seq_len, vocab),
                 grad_reduce=work.resolve_grad_reduce(t.get("grad_reduce", "auto"), mesh))


def describe(spec: RunSpec, config, n_devices: int) -> str:
  """The run's budget printout: shape, N three ways, D, C, tokens/param, steps, mesh, and the
  warmup cap (10% of the steps) when it shortens ``train.warmup_steps``."""
  c = spec.counts
  m = spec.model
  return "\n".join([
      f"model   d_model={m.d_model} n_layers={m.n_layers} n_heads={m.n_heads} "
      f"{f'n_kv_heads={m.kv_heads} ' if m.kv_heads != m.n_heads else ''}d_ff={m.d_ff} "
      f"vocab_size={m.vocab_size} seq_len={spec.seq_len} tied={m.tie_embeddings} "
      f"compute={m.compute_dtype} attention={m.attention} remat={m.remat}"
      f"{' scan_layers' if m.scan_layers else ''}{' document_mask' if m.document_mask else ''}",
      f"params  total={c.total:,} non_embedding={c.non_embedding:,} embedding={c.embedding:,}"
      f"  (N for the budget: {spec.n_kind} = {spec.n_params:,})",
      f"budget  mode={config.budget.mode} target D={spec.target_tokens:,.0f} tokens -> "
      f"steps={spec.steps:,} x {spec.tokens_per_step:,} tokens/step = D={spec.tokens:,} tokens",
      f"        C = 6·N·D = {spec.flops_6nd:.4g} FLOPs; tokens per parameter D/N = "
      f"{spec.tokens_per_param:.2f}",
      f"mesh    {spec.mesh} on {n_devices} {jax.default_backend()} device(s), "
      f"{jax.process_count()} process(es)",
      f"batch   global_batch_size={spec.global_batch_size} = {spec.microbatches} microbatch(es) "
      f"x {spec.global_batch_size // spec.microbatches} rows (train.microbatches); loss "
      + (f"in chunks of {spec.loss_chunk_size} positions" if spec.loss_chunk_size
         else "unchunked") + " (train.loss_chunk_size)",
  ] + ([f"warmup  train.warmup_steps={config.train.warmup_steps} capped at 10% of the run's "
        f"{spec.steps:,} steps: {spec.warmup_steps} warmup step(s)"]
       if spec.warmup_steps < config.train.warmup_steps else []))
