"""How a planned run fits its devices: microbatches M, remat and the loss's chunks.

The batch rule fixes the global batch B (sequences per step); what a device
must hold for it is :func:`chinchax.cost.work.mesh_memory_per_device`'s analytic
estimate. :func:`choose_layout` keeps B and, over the mesh the planner lays
runs out on (:func:`planned_mesh`: parameters and AdamW state sharded over all
accelerator devices, mesh.fsdp), takes for each remat policy (none, dots,
full) the smallest M — B split into M microbatches of B/M rows, gradients
accumulated, one update (``train.microbatches``) — whose estimate leaves
:data:`MEMORY_HEADROOM` of the device's memory free, and of those the fastest
by the step-time model (:func:`predict_step`: M re-reads the weights, remat and
a chunked loss recompute): accumulation costs no FLOPs, so remat is chosen
only when no M fits without it or a step-time model finds it faster. When
nothing fits, :func:`min_devices` names the smallest device count that would.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from chinchax.cost import budget
from chinchax.cost import hardware as hardware_lib
from chinchax.cost import step_time as step_time_lib
from chinchax.cost import work

# Fraction of a device's memory the analytic estimate must leave free: the model is within
# ~15% of XLA on most rows of the AOT memory table (docs/compile-tpu.md), and XLA's own
# reservations, fragmentation and the input pipeline live there too.
MEMORY_HEADROOM = 0.15
REMATS = ("none", "dots", "full")
MAX_DEVICES = 1 << 20  # min_devices gives up above this many


@dataclasses.dataclass(frozen=True)
class Layout:
  """A run laid out on its devices.

  Attributes:
    global_batch_size: B, sequences per step (the batch rule's, unchanged).
    microbatches: M; each microbatch holds B / M sequences.
    remat: ``model.remat`` (none, dots, full).
    loss_chunk: sequence positions per loss chunk (``train.loss_chunk_size``; 0 = whole).
    mesh: {"data", "fsdp", "tensor"} sizes.
    memory: the analytic per-device estimate, bytes by part.
    capacity: the device's memory, bytes.
    step_time_s: predicted seconds per step (None without a step-time model).
  """

  global_batch_size: int
  microbatches: int
  remat: str
  loss_chunk: int
  mesh: dict
  memory: work.MemoryEstimate
  capacity: float
  step_time_s: float | None = None

  @property
  def fits(self) -> bool:
    """The estimate leaves :data:`MEMORY_HEADROOM` of the device free."""
    return self.memory.total <= (1.0 - MEMORY_HEADROOM) * self.capacity

  @property
  def microbatch_size(self) -> int:
    """Sequences per microbatch, B / M."""
    return self.global_batch_size // self.microbatches

  def to_dict(self) -> dict:
    return {"global_batch_size": self.global_batch_size, "microbatches": self.microbatches,
            "microbatch_size": self.microbatch_size, "remat": self.remat,
            "loss_chunk_size": self.loss_chunk, "mesh": dict(self.mesh),
            "memory_per_device": self.memory.to_dict(), "capacity_per_device": self.capacity,
            "fits": self.fits, "headroom_required": MEMORY_HEADROOM,
            "step_time_s": self.step_time_s}


def microbatch_choices(global_batch_size: int, data_parallel: int) -> list[int]:
  """Every M (ascending) that splits B into microbatches whose rows divide over
  ``data_parallel`` = data × fsdp devices (``config_checks.check_microbatches``'s rule)."""
  return [m for m in range(1, global_batch_size + 1)
          if global_batch_size % m == 0 and (global_batch_size // m) % data_parallel == 0]


def planned_mesh(hardware: hardware_lib.Hardware) -> dict:
  """The planner's mesh: FSDP over all accelerator devices (parameters, gradients and AdamW
  state 1/n per device), plain data parallelism on CPU (the config's default)."""
  n = hardware.n_devices
  if hardware.accelerator.kind == "cpu":
    return {"data": n, "fsdp": 1, "tensor": 1}
  return {"data": 1, "fsdp": n, "tensor": 1}


def profile_for(hardware: hardware_lib.Hardware, model: Any = None,
                seq_len: int | None = None) -> work.ExecutionProfile:
  """The step-time model's execution profile, else what ``model.attention=auto`` runs on the
  accelerator kind at ``seq_len`` (splash on a TPU at a multiple of 128;
  ``work.ExecutionProfile.for_kind``)."""
  return getattr(model, "profile", None) or work.ExecutionProfile.for_kind(
      hardware.accelerator.kind, seq_len)


def predict_step(model: Any, shape: budget.ModelShape, global_batch_size: int, *,
                 microbatches: int = 1, remat: str = "none", loss_chunk: int = 0,
                 causal_skip: bool = False) -> float:
  """Seconds per step: the model's prediction for B in M microbatches (the weights' bytes M
  times, ``work.param_bytes_per_step``) × the recompute factor of remat and a chunked loss
  (``work.recompute_factor``; 1 for remat none, unchunked). A model whose ``predict`` takes
  no ``microbatches`` is asked for the unsplit step."""
  if microbatches == 1:
    t = float(model.predict(shape, global_batch_size))
  else:
    t = float(model.predict(shape, global_batch_size, microbatches=microbatches))
  return t * work.recompute_factor(shape, remat, causal_skip=causal_skip, loss_chunk=loss_chunk)


def memory(shape: budget.ModelShape, global_batch_size: int, mesh: dict, *, microbatches: int,
           remat: str, loss_chunk: int, profile: work.ExecutionProfile) -> work.MemoryEstimate:
  """``work.mesh_memory_per_device`` of one layout, its gradients reduced as
  ``train.grad_reduce="auto"`` reduces them there (``work.resolve_grad_reduce``)."""
  return work.mesh_memory_per_device(shape, global_batch_size, mesh=mesh, remat=remat,
                                     profile=profile, microbatches=microbatches,
                                     loss_chunk=loss_chunk,
                                     grad_reduce=work.resolve_grad_reduce("auto", mesh))


def smallest_microbatches(shape: budget.ModelShape, global_batch_size: int, mesh: dict, *,
                          remat: str, loss_chunk: int, profile: work.ExecutionProfile,
                          capacity: float) -> tuple[int, bool]:
  """(the smallest M whose estimate leaves :data:`MEMORY_HEADROOM` of ``capacity`` free,
  True), or (the largest M, False) when none does."""
  choices = microbatch_choices(global_batch_size, mesh["data"] * mesh["fsdp"])
  for m in choices:
    est = memory(shape, global_batch_size, mesh, microbatches=m, remat=remat,
                 loss_chunk=loss_chunk, profile=profile)
    if est.total <= (1.0 - MEMORY_HEADROOM) * capacity:
      return m, True
  return choices[-1], False


def choose_layout(shape: budget.ModelShape, global_batch_size: int,
                  hardware: hardware_lib.Hardware, *, model: Any = None,
                  loss_chunk_size: Any = "auto") -> Layout:
  """The layout of the module doc: per remat policy the smallest fitting M, the fastest of
  those (ties: the lighter remat); when none fits, remat full at the largest M (whose
  ``fits`` is False).

  Args:
    shape: the model shape (its seq_len is the run's).
    global_batch_size: B (a multiple of the data-parallel devices).
    hardware: the devices.
    model: step-time model (default: the hardware's roofline).
    loss_chunk_size: ``train.loss_chunk_size`` ("auto" or positions), resolved for the
      hardware's kind by ``work.resolve_loss_chunk``.
  """
  model = model or step_time_lib.RooflineStepTime(hardware)
  profile = profile_for(hardware, model, shape.seq_len)
  mesh = planned_mesh(hardware)
  chunk = work.resolve_loss_chunk(loss_chunk_size, hardware.accelerator.kind, shape.seq_len,
                                  shape.vocab_size)
  cap = hardware.accelerator.memory_bytes
  found = []
  for remat in REMATS:
    m, fits = smallest_microbatches(shape, global_batch_size, mesh, remat=remat,
                                    loss_chunk=chunk, profile=profile, capacity=cap)
    if fits or remat == REMATS[-1]:
      t = predict_step(model, shape, global_batch_size, microbatches=m, remat=remat,
                       loss_chunk=chunk, causal_skip=profile.causal_skip)
      found.append(Layout(global_batch_size, m, remat, chunk, mesh,
                          memory(shape, global_batch_size, mesh, microbatches=m, remat=remat,
                                 loss_chunk=chunk, profile=profile), cap, t))
  fitting = [lay for lay in found if lay.fits]
  if not fitting:
    return found[-1]
  return min(fitting, key=lambda lay: (lay.step_time_s, REMATS.index(lay.remat)))


def min_devices(shape: budget.ModelShape, global_batch_size: int,
                hardware: hardware_lib.Hardware, *, loss_chunk: int = 0,
                profile: work.ExecutionProfile | None = None) -> int | None:
  """The smallest device count n whose devices fit the run: FSDP over n, remat full and one
  sequence per device per microbatch (with the accumulator when B > n); None when even that
  does not fit below :data:`MAX_DEVICES` (one sequence's activations exceed a device)."""
  profile = profile or profile_for(hardware, seq_len=shape.seq_len)
  cap = (1.0 - MEMORY_HEADROOM) * hardware.accelerator.memory_bytes

  def fits(n: int) -> bool:
    m = 2 if global_batch_size > n else 1
    est = memory(shape, n * m, {"data": 1, "fsdp": n, "tensor": 1}, microbatches=m,
                 remat="full", loss_chunk=loss_chunk, profile=profile)
    return est.total <= cap

  if not fits(MAX_DEVICES):
    return None
  lo, hi = 1, MAX_DEVICES  # memory falls with n: bisect for the first n that fits
  while lo < hi:
    mid = (lo + hi) // 2
    lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
  return lo


def no_fit_warning(layout: Layout, shape: budget.ModelShape,
                   hardware: hardware_lib.Hardware, profile: work.ExecutionProfile) -> str:
  """The warning of a plan that fits in no layout: its memory, and the device count that would."""
  acc, est = hardware.accelerator, layout.memory
  n = min_devices(shape, layout.global_batch_size, hardware, loss_chunk=layout.loss_chunk,
                  profile=profile)
  where = (f"the smallest device count that would fit is {n} {acc.display_name}" if n else
           f"one sequence of {shape.seq_len} tokens does not fit a {acc.display_name} at any "
           f"device count; shorten train.seq_len or use mesh.tensor")
  return (f"nothing fits: even with remat={layout.remat} and M = {layout.microbatches} "
          f"microbatches of {layout.microbatch_size}, the estimate is {est.total / 1e9:.3g} GB "
          f"per device (model states {(est.state + est.accumulation) / 1e9:.3g} GB) against "
          f"{(1 - MEMORY_HEADROOM) * acc.memory_bytes / 1e9:.3g} GB usable of each "
          f"{acc.display_name}'s {acc.memory_bytes / 1e9:.3g} GB ({hardware.n_devices} "
          f"device{'s' if hardware.n_devices > 1 else ''} now); {where}")


def fit_plan(plan: Any, hardware: hardware_lib.Hardware, model: Any = None,
             fit: Layout | None = None) -> Layout:
  """Lays ``plan`` (a ``planner.Plan``) out on ``hardware``: sets ``plan.fit`` (``fit``, else
  :func:`choose_layout` of its shape and batch), its step time to the layout's (unless
  calibration measured it), and a warning naming the device count that would fit when
  nothing does."""
  model = model or step_time_lib.RooflineStepTime(hardware)
  fit = fit or choose_layout(plan.chosen.shape, plan.batch.global_batch_size, hardware,
                             model=model)
  plan.fit = fit
  if plan.calibration is None and fit.step_time_s is not None:
    plan.step_time_s = fit.step_time_s
  if not fit.fits:
    plan.warnings.append(no_fit_warning(fit, plan.chosen.shape, hardware,
                                        profile_for(hardware, model,
                                                    seq_len=plan.chosen.shape.seq_len)))
  return fit
