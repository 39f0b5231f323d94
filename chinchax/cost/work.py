"""What one train step costs: executed matmul FLOPs, HBM traffic and peak memory per device.

The FLOPs are :func:`chinchax.cost.budget.executed_matmul_flops_per_token`'s; the
traffic and memory follow the activation accounting of Korthikanti et al.
2022 (Sec. 4.1). Step-time models (``chinchax.cost.step_time``) and the
benchmark's memory check read these. Units: FLOPs and bytes per device per
step, data parallel over ``n_devices``.
"""

from __future__ import annotations

import dataclasses

from chinchax.cost import budget
from chinchax import errors


class StepTimeError(errors.UserError):
  """An execution profile, step-time model or step-time file that cannot be used."""


# The splash kernel's key/value blocks are multiples of the TPU's 128 lanes: ``attention=auto``
# runs it on a TPU only at a seq_len that is a multiple of this
# (``chinchax.model.attention.splash_block``).
SPLASH_LANES = 128


@dataclasses.dataclass(frozen=True)
class ExecutionProfile:
  """How a train step executes, as far as FLOPs and bytes go.

  Attributes:
    activation_bytes: bytes per activation element (4 float32, 2 bfloat16).
    materialized_attention: the seq_len × seq_len attention probabilities are
      written to and read back from memory (chinchax's ``xla`` attention).
    causal_skip: the attention kernel skips the masked half (cuDNN flash, splash).
    splash_residuals: the Pallas splash kernel (TPU) keeps, per token and layer, its own
      [B, H, T, K] copies of q, k, v and its output and its float32 logsumexp padded to the
      TPU's 128 lanes (512 bytes per head): calibrated on the v5e-8 pod ladder's programs
      without remat (docs/ladder.md: 10.2 and 14.1 KB per token and layer at d_model 640 and
      896 with 64-wide heads, this 10.2 and 14.3).
    logits_bytes: bytes per logit (position × vocab entry) the loss phase holds: the
      compute dtype's, one buffer (the logits, whose gradient the loss's custom VJP writes
      in their place: ``chinchax.train.loss``); 4 under float32 compute. Calibrated on the
      programs of ``benchmarks/maxtext_compare.py`` (docs/compile-tpu.md).

  The elementwise ops' own residuals (RMSNorm's float32 upcast, SwiGLU's sigmoid) are not
  counted: under a 16-bit compute dtype the model recomputes them from 16-bit tensors it keeps
  anyway (``chinchax.model.transformer``), on GPU as on TPU.
  """

  activation_bytes: int = 2
  materialized_attention: bool = True
  causal_skip: bool = False
  logits_bytes: int = 4
  splash_residuals: bool = False

  @staticmethod
  def for_kind(kind: str, seq_len: int | None = None) -> "ExecutionProfile":
    """What ``model.attention=auto`` runs on a device kind: CPU float32 + xla attention; GPU
    bf16 + cuDNN; TPU bf16 + the splash kernel when ``seq_len`` is a multiple of
    :data:`SPLASH_LANES` (or not given), else xla. Logits in the compute dtype (2 bytes
    under bf16)."""
    if kind == "cpu":
      return ExecutionProfile(4, True, False)
    if kind == "gpu":
      return ExecutionProfile(2, False, True, logits_bytes=2)
    splash = seq_len is None or seq_len % SPLASH_LANES == 0
    return ExecutionProfile(2, not splash, splash, logits_bytes=2, splash_residuals=splash)

  @staticmethod
  def from_names(compute_dtype: str, attention: str) -> "ExecutionProfile":
    """Profile from a config's compute dtype and (resolved) attention implementation names.

    Raises:
      StepTimeError: a compute dtype other than float32 / bfloat16, an attention other
        than xla / cudnn / splash.
    """
    if compute_dtype not in ("float32", "bfloat16"):
      raise StepTimeError(f"compute_dtype={compute_dtype!r} is not 'float32' or 'bfloat16'")
    if attention not in ("xla", "cudnn", "splash"):
      raise StepTimeError(f"attention={attention!r} is not 'xla', 'cudnn' or 'splash'")
    a = 4 if compute_dtype == "float32" else 2
    return ExecutionProfile(a, attention == "xla", attention != "xla", logits_bytes=a,
                            splash_residuals=attention == "splash")


# Bytes per parameter per step with float32 parameters and AdamW state:
# forward reads the weights (4), backward reads them again (4) and writes the
# gradient (4); AdamW reads parameter, gradient, m and v (16) and writes
# parameter, m and v (12).
PARAM_BYTES_PER_STEP = 40
# Bytes per parameter held: float32 parameter, gradient, AdamW m and v.
STATE_BYTES_PER_PARAM = 16


def step_flops(shape: budget.ModelShape, global_batch_size: int, *, n_devices: int = 1,
               profile: ExecutionProfile = ExecutionProfile()) -> float:
  """Executed matmul FLOPs of one train step per device (data parallel over ``n_devices``)."""
  tokens = global_batch_size * shape.seq_len / n_devices
  return tokens * budget.executed_matmul_flops_per_token(shape, causal_skip=profile.causal_skip)


def bytes_per_step(shape: budget.ModelShape, global_batch_size: int, *, n_devices: int = 1,
                   profile: ExecutionProfile = ExecutionProfile(),
                   microbatches: int = 1) -> float:
  """Estimated HBM traffic of one train step per device, bytes.

  Three parts:

  * weights and optimizer: :func:`param_bytes_per_step` bytes per parameter
    (40 for one batch, 16·M + 24 for ``microbatches`` M: the weights are read
    by every microbatch), every device holding a full replica (data parallelism);
  * activations: each tensor the backward pass needs is written in the
    forward and read in the backward. Per layer and token these are the two
    norm inputs and outputs (4·d_model), q, k, v and the attention output
    (4·n_heads·head_dim), the gate, up and gated MLP hiddens (3·d_ff) and,
    when attention is materialised, one row of probabilities per head
    (n_heads·seq_len) — the accounting of Korthikanti et al. 2022 (Sec. 4.1)
    for this block without dropout;
  * logits: float32 logits written, read by the loss, their gradient written
    and read: 16·vocab_size bytes per token.

  Fusion may remove some of this traffic and un-fused elementwise ops add
  more; fitted step-time models absorb the difference.
  """
  tokens = global_batch_size * shape.seq_len / n_devices
  activations = 2 * profile.activation_bytes * shape.n_layers * _saved_per_layer(shape, profile)
  logits = 16 * shape.vocab_size
  return (param_bytes_per_step(microbatches) * budget.param_counts(shape).total
          + tokens * (activations + logits))


def param_bytes_per_step(microbatches: int = 1) -> int:
  """HBM bytes per parameter of a train step split into ``microbatches`` M (gradient
  accumulation): each microbatch reads the float32 weights in its forward (4) and backward (4)
  and adds its float32 gradient into the accumulator (read + write, 8; the first only writes,
  4), then AdamW reads and writes as in :data:`PARAM_BYTES_PER_STEP`: 16·M + 24 bytes, 40 at
  M = 1. FLOPs do not change with M; only this term (and per-microbatch overheads that
  fitted step-time models absorb) does.

  Raises:
    StepTimeError: M < 1.
  """
  if isinstance(microbatches, bool) or int(microbatches) != microbatches or microbatches < 1:
    raise StepTimeError(f"microbatches={microbatches!r} must be an integer >= 1")
  return 16 * int(microbatches) + PARAM_BYTES_PER_STEP - 16


def memory_per_device(shape: budget.ModelShape, global_batch_size: int, *, n_devices: int = 1,
                      profile: ExecutionProfile = ExecutionProfile()) -> float:
  """Rough peak memory per device, bytes: float32 parameters, gradients, AdamW m and v
  (:data:`STATE_BYTES_PER_PARAM`, 16 bytes per parameter, replicated) plus saved
  activations and logits of the device's share of the batch (half the traffic of
  :func:`bytes_per_step`)."""
  tokens = global_batch_size * shape.seq_len / n_devices
  acts = (profile.activation_bytes * shape.n_layers * _saved_per_layer(shape, profile)
          + 8 * shape.vocab_size)
  return STATE_BYTES_PER_PARAM * budget.param_counts(shape).total + tokens * acts


def sharded_memory_per_device(shape: budget.ModelShape, global_batch_size: int, *,
                              n_devices: int = 1,
                              profile: ExecutionProfile = ExecutionProfile()) -> float:
  """:func:`memory_per_device` with parameters and AdamW state sharded over the devices (FSDP):
  each device keeps 1 / n_devices of the 16 bytes per parameter."""
  replicated = memory_per_device(shape, global_batch_size, n_devices=n_devices, profile=profile)
  n = budget.param_counts(shape).total
  return replicated - STATE_BYTES_PER_PARAM * n * (1 - 1 / n_devices)


def _saved_per_layer(shape: budget.ModelShape, profile: ExecutionProfile) -> int:
  """Activation elements per token and layer saved for the backward (see :func:`bytes_per_step`)."""
  per_layer = 4 * shape.d_model + 4 * shape.n_heads * shape.head_dim + 3 * shape.d_ff
  if profile.materialized_attention:
    per_layer += shape.n_heads * shape.seq_len
  return per_layer


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
  """Analytic peak memory of a train step per device, bytes, by part.

  Attributes:
    state: float32 parameters and AdamW m, v (the step's arguments) and the float32
      gradients: 16 bytes per parameter over the devices that shard them (fsdp × tensor).
    gathered_weights: the compute-dtype copy of the weights in use (gathered, with FSDP):
      every layer's without remat, one layer's under remat, beside the embedding and
      head; all of them once per step under one reduction per step with M > 1.
    activations: what the backward keeps of every layer for the device's tokens of
      one microbatch.
    working: the larger of the two phases that do not overlap: the loss (logits in the
      compute dtype of one microbatch's tokens, or of one chunk of its positions, vocab
      over tensor) and one layer's backward (its forward tensors, recomputed under
      remat, with their gradients under float32 or the attention buffer's under a 16-bit
      dtype), for one microbatch.
    accumulation: with microbatches M > 1, the float32 gradient accumulator: 4 bytes
      per parameter over fsdp × tensor (0 for M = 1).
  """

  state: float
  gathered_weights: float
  activations: float
  working: float
  accumulation: float = 0.0

  @property
  def total(self) -> float:
    return (self.state + self.gathered_weights + self.activations + self.working
            + self.accumulation)

  def to_dict(self) -> dict:
    return {"state": self.state, "gathered_weights": self.gathered_weights,
            "activations": self.activations, "working": self.working,
            "accumulation": self.accumulation, "total": self.total}


# train.loss_chunk_size="auto": chunk the loss from this vocabulary size up, this many
# sequence positions per chunk, on accelerators only (the rule of chinchax.train.loss).
AUTO_LOSS_CHUNK_MIN_VOCAB = 32_768
AUTO_LOSS_CHUNK = 512


def resolve_loss_chunk(value, platform: str, seq_len: int, vocab_size: int) -> int:
  """``train.loss_chunk_size`` as sequence positions per loss chunk (0 = unchunked).

  "auto": 0 on CPU, else min(seq_len, 512) when ``vocab_size`` >= 32,768, else 0; an
  integer is capped at ``seq_len``. ``platform``: "cpu", "gpu" or "tpu".
  """
  if value == "auto":
    if platform == "cpu" or vocab_size < AUTO_LOSS_CHUNK_MIN_VOCAB:
      return 0
    return min(seq_len, AUTO_LOSS_CHUNK)
  return min(int(value), seq_len)


def resolve_grad_reduce(value: str, mesh: dict[str, int]) -> str:
  """``train.grad_reduce`` as "step" or "microbatch" (the rule of ``chinchax.train.step``).

  "auto": "step" when the mesh has no fsdp axis (fsdp = 1): there the float32 accumulator is
  a full gradient per device either way, so one reduction per step costs no memory and
  saves M - 1 all-reduces of every gradient. With fsdp > 1 "microbatch": one reduction per
  step holds a full float32 gradient and all the gathered compute-dtype weights on every
  device (10 bytes per parameter over tensor under bfloat16, :func:`mesh_memory_per_device`,
  against 4 / fsdp and one layer's weights), undoing the sharding a user chose fsdp for;
  "step" asks for it where it fits (``chinchax compile`` shows whether it does) and saves
  M - 1 reduce-scatters of the gradient and as many all-gathers of the weights. The same
  under the splash kernel, whose own ``shard_map`` compiles nested in the per-shard one
  (libtpu, v5e-16 over data 16, ``configs/train.py:small`` at seq_len 2,048, M = 2: one
  bf16 reduction of the gradient, 26.0 MB a step).
  """
  if value == "auto":
    return "step" if int(mesh.get("fsdp", 1)) == 1 else "microbatch"
  return value


def mesh_memory_per_device(shape: budget.ModelShape, global_batch_size: int, *,
                           mesh: dict[str, int], remat: str = "none",
                           profile: ExecutionProfile = ExecutionProfile(),
                           microbatches: int = 1, loss_chunk: int = 0,
                           grad_reduce: str = "microbatch") -> MemoryEstimate:
  """Peak memory of a train step per device on a (data, fsdp, tensor) mesh, bytes.

  The accounting of :func:`memory_per_device` (Korthikanti et al. 2022,
  Sec. 4.1, for this block without dropout) with chinchax's sharding rules
  (``chinchax.model.sharding``): the batch splits over data × fsdp, parameters and
  optimizer state over fsdp (their embed axis) and tensor (heads, MLP hidden,
  vocab), activations of heads and MLP hidden over tensor. One layer's forward
  tensors per token are 4·d_model + (4·n_heads·head_dim + 3·d_ff) / tensor
  elements in the compute dtype plus, for materialised attention, n_heads·seq_len
  / tensor probabilities (float32) or exponentials (16-bit) in the compute dtype, plus the
  splash kernel's own residuals (``ExecutionProfile.splash_residuals``). The backward keeps
  (``model.remat``): ``none`` every layer's forward tensors; ``dots`` each layer's input and
  matmul outputs (d_model + (4·n_heads·head_dim + 2·d_ff) / tensor); ``full`` each layer's
  input. Without remat, float32 materialised attention keeps a second float32
  [n_heads, T, T] per layer (the masked scores beside the probabilities: calibrated on
  ``configs/train.py:125m`` on v5e-16 at M = 1, 2, 4, 8). With tensor > 1 each
  layer's input is held twice (as the previous layer's all-reduced output and as
  the next one's saved input): one more d_model per layer and token, calibrated
  on the tensor-parallel rows of ``benchmarks/aot_memory.py``. The loss phase
  (logits in the compute dtype, ``profile.logits_bytes`` per position and vocab entry over
  tensor; with fsdp > 1 twice the compute dtype's bytes, the sharded head's gradient of the
  logits beside them) and a layer's backward do not overlap; the larger counts. The backward
  of a recomputed layer (remat dots or full) holds its forward tensors and their gradients
  under float32 compute; under a 16-bit one, whose attention keeps one 16-bit [n_heads, T, T]
  buffer of exponentials (``chinchax.model.attention``), its forward tensors and that
  buffer's gradient beside it (the other gradients pass through). Without remat the 16-bit
  attention saves that one buffer, float32 autodiff the scores beside the probabilities.
  Under remat the layers' weights are cast (and gathered) one layer at a time: the
  compute-dtype copy held is one layer's and the embedding's and head's.
  Calibrated on the 125M programs of ``benchmarks/maxtext_compare.py`` (jax 0.12, libtpu
  0.0.52: v5e-16 data 16 at M = 1, 4, 8, fsdp 16 at M = 1, 4, 8, seq_len 2,048 with splash;
  h100x8 data 8, cuDNN and xla attention; 1B on v5p-32 and h100x8): 0.87–1.16 of XLA but
  fsdp with one reduction per step (1.40), docs/compile-tpu.md; the splash residuals on the
  v5e-8 pod ladder (:class:`ExecutionProfile`).

  Microbatches (``train.microbatches`` M, gradient accumulation): the
  activations, a layer's backward and the loss phase hold one microbatch's
  tokens, B·T / (data·fsdp·M) per device, so they scale with 1/M; the state,
  the gathered weights and the gradient do not; M > 1 adds the float32
  accumulator, 4 bytes per parameter over fsdp × tensor (``accumulation``). With one
  reduction per step (``grad_reduce="step"``, :func:`resolve_grad_reduce`) the weights are
  cast (and with fsdp > 1 gathered) once per step, before the microbatch scan: all of them in
  the compute dtype, ``a`` bytes per parameter over tensor; with fsdp > 1 each device
  accumulates its own unreduced gradient, a full float32 copy that the scan holds twice (its
  carry in and out: 8 bytes per parameter over tensor; without fsdp the second one is the
  state's gradient). On ``configs/train.py:125m`` (vocab 32,000, tied, remat full) on v5e-16
  over fsdp 16 at M = 4: XLA 2.13 GB, this 1.81 GB (the tied embedding's float32 copies are
  not counted); untied (the compare's program): XLA 1.49 GB, this 2.07 GB.

  Chunked loss (``loss_chunk`` C > 0 positions, ``train.loss_chunk_size``
  resolved by :func:`resolve_loss_chunk`): the loss phase holds the logits of
  one chunk, rows × min(C, T) positions instead of rows × T, at the same bytes
  per logit (the checkpointed chunk's forward and its gradient, as the whole
  logits and their gradient unchunked).

  Checked against XLA's compiled memory in ``benchmarks/aot_memory.py`` (the
  AOT memory table of docs/compile-tpu.md).

  Raises:
    StepTimeError: an unknown remat policy, a mesh axis < 1, M < 1 or a chunk < 0.
  """
  if remat not in ("none", "dots", "full"):
    raise StepTimeError(f"remat={remat!r} is not 'none', 'dots' or 'full'")
  data, fsdp, tensor = (int(mesh.get(a, 1)) for a in ("data", "fsdp", "tensor"))
  if min(data, fsdp, tensor) < 1:
    raise StepTimeError(f"mesh {mesh} has an axis < 1")
  param_bytes_per_step(microbatches)  # checks M
  if loss_chunk < 0:
    raise StepTimeError(f"loss_chunk={loss_chunk!r} must be >= 0 positions (0 = unchunked)")
  n = budget.param_counts(shape).total
  rows = global_batch_size / (data * fsdp * microbatches)  # one microbatch's rows per device
  tokens = rows * shape.seq_len
  a = profile.activation_bytes
  hk = shape.n_heads * shape.head_dim
  # materialised attention: float32 probabilities (plain autodiff), or under a 16-bit compute
  # dtype the one 16-bit buffer of unnormalised exponentials (chinchax.model.attention)
  probs = a * shape.n_heads * shape.seq_len / tensor if profile.materialized_attention else 0
  kernel = ((a * (2 * hk + 2 * shape.kv_heads * shape.head_dim) + 4 * SPLASH_LANES * shape.n_heads)
            / tensor if profile.splash_residuals else 0)
  layer = a * (4 * shape.d_model + (4 * hk + 3 * shape.d_ff) / tensor) + probs + kernel
  # a recomputed layer's backward: its forward tensors and their gradients under float32
  # autodiff; under 16-bit attention's custom gradient the gradient of the exponentials
  # overwrites itself with that of the scores, the rest of the gradients pass through
  recomputed = 2 * layer if a == 4 else layer + probs
  if remat == "none":  # float32 autodiff keeps the masked scores beside the probabilities
    saved, backward = layer + (probs if a == 4 else 0), layer
  elif remat == "dots":
    saved, backward = a * (shape.d_model + (4 * hk + 2 * shape.d_ff) / tensor), recomputed
  else:
    saved, backward = a * shape.d_model, recomputed
  if tensor > 1:
    saved += a * shape.d_model
  layer_weights = budget.layer_matmul_params(shape)
  live_layers = shape.n_layers if remat == "none" else 1
  embed = n - shape.n_layers * layer_weights
  gathered = a * (live_layers * layer_weights + embed) / tensor
  loss_positions = rows * (min(loss_chunk, shape.seq_len) if loss_chunk else shape.seq_len)
  per_logit = profile.logits_bytes
  if fsdp > 1:  # the FSDP-sharded head keeps the logits' compute-dtype gradient beside them
    per_logit = max(per_logit, 2 * a)
  loss = loss_positions * per_logit * shape.vocab_size / tensor
  accumulation = 4 * n / (fsdp * tensor) if microbatches > 1 else 0.0
  if microbatches > 1 and grad_reduce == "step":
    gathered = a * n / tensor  # cast (and gathered) once, before the microbatch scan
    if fsdp > 1:
      accumulation = 8 * n / tensor  # the scan's float32 carry, in and out
  return MemoryEstimate(state=STATE_BYTES_PER_PARAM * n / (fsdp * tensor),
                        gathered_weights=gathered,
                        activations=tokens * shape.n_layers * saved,
                        working=max(loss, tokens * backward),
                        accumulation=accumulation)


def recompute_factor(shape: budget.ModelShape, remat: str = "none", *, causal_skip: bool = False,
                     loss_chunk: int = 0) -> float:
  """Executed over model matmul FLOPs of a train step (per token, so independent of M):
  ``full`` remat runs every layer's forward again in the backward (+1/3 of forward +
  backward, the head's included for simplicity), ``dots`` only the attention score and
  value matmuls (whose batch dims keep them from being saved); a chunked loss
  (``loss_chunk`` > 0) recomputes the output projection's forward (2·d_model·V FLOPs per
  token) in the backward."""
  per_token = budget.executed_matmul_flops_per_token(shape, causal_skip=causal_skip)
  extra = 2.0 * shape.d_model * shape.vocab_size if loss_chunk else 0.0
  if remat == "full":
    extra += per_token / 3.0
  elif remat == "dots":
    extra += 4.0 * shape.n_layers * shape.seq_len * shape.n_heads * shape.head_dim
  return 1.0 + extra / per_token
