"""Compiles a run's train and eval steps for a target without its hardware.

:func:`compile_run` builds the very program ``chinchax train`` runs
(``chinchax.train.step.build_program``) over the target's compile-only devices,
lowers it with ShapeDtypeStruct inputs (nothing is allocated) and compiles it,
and collects per device: XLA's memory analysis, its cost analysis, the
collectives of the optimized HLO (``chinchax.aot.hlo``) and the compile time.
A compile that runs out of HBM raises inside XLA; its message's figures
("HLO temporaries (24.10G) exceeds available HBM (15.75G)") are kept instead.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time

import jax
import jax.numpy as jnp

from chinchax import config as config_lib
from chinchax.model import sharding as sharding_lib
from chinchax.cost import work
from chinchax.aot import hlo as hlo_lib
from chinchax.aot import topology as topology_lib
from chinchax.aot.topology import AotError, Target
from chinchax.train import spec as spec_lib
from chinchax.train import step as step_lib

_GB = r"([0-9.]+)\s*([KMGT]?)i?B?"
_OOM = re.compile(rf"memory required for (.+?) \({_GB}\) exceeds available HBM \({_GB}\)", re.I)
_OOM_ANY = re.compile(r"resource_exhausted|ran out of memory|out of memory", re.I)
_UNIT = {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}


@dataclasses.dataclass
class ProgramResult:
  """One compiled program (``train_step`` or ``eval_step``) on one device of the target.

  Attributes:
    name: ``"train_step"`` or ``"eval_step"``.
    compile_s: seconds spent lowering and compiling.
    fits: False when XLA ran out of HBM (then ``memory`` holds what it said).
    memory: bytes per device: argument, output, alias, temp, generated_code and
      total = argument + output − alias + temp + generated_code.
    xla_flops, xla_bytes: XLA's cost analysis per device (None where XLA gives
      none, as on GPU). A ``lax.scan`` body is counted once, not per layer.
    collectives: the optimized HLO's collectives (None when it did not compile).
    oom: {"what", "required", "available"} bytes from XLA's out-of-memory message.
    error: XLA's first line when the compile failed for another reason.
  """

  name: str
  compile_s: float
  fits: bool
  memory: dict
  xla_flops: float | None = None
  xla_bytes: float | None = None
  collectives: hlo_lib.CollectiveSummary | None = None
  oom: dict | None = None
  error: str | None = None

  def to_dict(self) -> dict:
    d = dataclasses.asdict(self)
    d["collectives"] = None if self.collectives is None else self.collectives.to_dict()
    return d


@dataclasses.dataclass
class CompiledRun:
  """A config compiled for a target: its spec, mesh sizes and the two programs.

  ``microbatches`` is the config's ``train.microbatches`` M (the step's batch in M
  microbatches of B/M rows) and ``loss_chunk`` its ``train.loss_chunk_size`` in sequence
  positions (``chinchax.cost.work.resolve_loss_chunk`` for the target; 0 = unchunked).
  """

  target: Target
  spec: spec_lib.RunSpec
  train: ProgramResult
  eval: ProgramResult | None
  compiler_options: dict
  notes: list = dataclasses.field(default_factory=list)
  microbatches: int = 1
  loss_chunk: int = 0


def _bytes(value: str, unit: str) -> float:
  return float(value) * _UNIT[unit.upper()]


def parse_oom(message: str) -> dict | None:
  """{"what", "required", "available"} (bytes) from XLA's out-of-HBM message, or None."""
  m = _OOM.search(message)
  if not m:
    return None
  return {"what": m.group(1).strip(), "required": _bytes(m.group(2), m.group(3)),
          "available": _bytes(m.group(4), m.group(5))}


def _memory(compiled) -> dict:
  ma = compiled.memory_analysis()
  mem = {k: float(getattr(ma, f"{k}_size_in_bytes", 0) or 0)
         for k in ("argument", "output", "alias", "temp", "generated_code")}
  mem["total"] = (mem["argument"] + mem["output"] - mem["alias"] + mem["temp"]
                  + mem["generated_code"])
  return mem


def _cost(compiled) -> tuple[float | None, float | None]:
  try:
    cost = compiled.cost_analysis()
  except Exception:  # some backends raise instead of returning None
    return None, None
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  if not cost:
    return None, None
  flops, nbytes = cost.get("flops"), cost.get("bytes accessed")
  return (None if flops is None or flops < 0 else float(flops),
          None if nbytes is None or nbytes < 0 else float(nbytes))


def compile_lowered(name: str, lower, n_devices: int, slice_of: list[int] | None = None,
                    num_slices: int = 1) -> ProgramResult:
  """Lowers (``lower()``) and compiles one program quietly; an out-of-HBM compile is a result.

  ``slice_of`` (the slice of each mesh device, in mesh order) and ``num_slices`` let the
  collectives count find the traffic between slices (``chinchax.aot.hlo.collectives``).
  """
  start = time.perf_counter()
  try:
    with topology_lib.quiet_stderr():
      compiled = lower().compile()
  except Exception as e:  # XLA's JaxRuntimeError: out of memory or another failure
    text = str(e)
    elapsed = time.perf_counter() - start
    oom = parse_oom(text)
    if oom is not None or _OOM_ANY.search(text):
      return ProgramResult(name, elapsed, False, {"total": (oom or {}).get("required")}, oom=oom)
    return ProgramResult(name, elapsed, False, {}, error=text.strip().splitlines()[0][:500])
  elapsed = time.perf_counter() - start
  flops, nbytes = _cost(compiled)
  return ProgramResult(name, elapsed, True, _memory(compiled), flops, nbytes,
                       hlo_lib.collectives(compiled.as_text(), n_devices, slice_of, num_slices))


def check_config(config, target: Target) -> spec_lib.RunSpec:
  """Validates ``config`` for the target's device count and settles its spec (cheap).

  Raises:
    ConfigError: a mesh whose product differs from the target's devices, a batch
      not divisible by data × fsdp, a ``mesh.dcn_data`` that does not divide the target's
      slices (TPU) or hosts (GPU), or any other invalid value, before compiling.
  """
  n = target.n_devices
  mesh = config.mesh
  sizes = [mesh[a] for a in sharding_lib.MESH_AXES]
  if -1 not in sizes and math.prod(sizes) != n:
    raise config_lib.ConfigError(
        f"mesh data×fsdp×tensor = {'×'.join(map(str, sizes))} = "
        f"{math.prod(sizes)} devices, but {target.spec} has {n}; set one axis "
        f"to -1 to fill, e.g. --config.mesh.data=-1")
  dcn = mesh.get("dcn_data", 1)
  units = target.num_slices if target.platform == "tpu" else int(target.topology.split("x")[1])
  if isinstance(dcn, int) and dcn > 1 and units % dcn:
    what = "slices (--slices)" if target.platform == "tpu" else "hosts of 8 GPUs"
    raise config_lib.ConfigError(
        f"mesh.dcn_data={dcn} does not divide the {units} {what} of {target.describe_short()}; "
        f"use one of {', '.join(str(k) for k in range(1, units + 1) if units % k == 0)}")
  return spec_lib.resolve(config, n, backend=target.platform)


def compile_run(config, target: Target, *, eval_step: bool = True,
                devices: list | None = None) -> CompiledRun:
  """Compiles ``config``'s train step (and eval step) for ``target``.

  Args:
    config: a run ConfigDict (``chinchax.config``), validated here for the target.
    target: from ``chinchax.aot.topology.parse_target``.
    eval_step: also compile the eval step.
    devices: the target's compile-only devices (default: described now).
  Returns:
    A :class:`CompiledRun`; a program that does not fit is a result, not an error.
  Raises:
    AotError / ConfigError: a missing compiler, a bad mesh or batch (before compiling).
  """
  topology_lib.check_available(target)
  spec = check_config(config, target)
  devices = devices if devices is not None else topology_lib.compile_devices(target)
  run = _compile(config, spec, target, devices, eval_step)
  if run.train.error and "cudnn" in run.train.error.lower() and spec.model.attention == "cudnn":
    # The CUDA plugin compiles cuDNN fusions only with the cuDNN library at hand; without
    # it the same run is compiled with XLA's attention, which keeps the probabilities.
    first_error = run.train.error
    fallback = config.copy_and_resolve_references()
    fallback.model.attention = "xla"
    run = _compile(fallback, check_config(fallback, target), target, devices, eval_step)
    run.notes.append(f"compiled with model.attention='xla': cuDNN attention needs the cuDNN "
                     f"library ({first_error}); pip install "
                     f"nvidia-cudnn-cu12 to compile cuDNN's flash attention, which keeps less "
                     f"memory")
  return run


def _compile(config, spec, target: Target, devices: list, eval_step: bool) -> CompiledRun:
  mesh = sharding_lib.make_mesh(spec.mesh, devices)
  with topology_lib.quiet_stderr():
    program = step_lib.build_program(config, spec, mesh)
  slice_of = [sharding_lib.slice_key(d) for d in mesh.devices.flat]
  train = compile_lowered("train_step", program.lower, len(devices), slice_of, target.num_slices)
  ev = None
  if eval_step:
    params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          program.abstract_state["params"], program.shardings["params"])
    batch = jax.ShapeDtypeStruct((spec.global_batch_size, spec.seq_len + 1), jnp.int32,
                                 sharding=program.batch_sharding)
    ev = compile_lowered("eval_step", lambda: program.eval_step.lower(params, batch),
                         len(devices), slice_of, target.num_slices)
  return CompiledRun(target=target, spec=spec, train=train, eval=ev,
                     compiler_options=dict(program.compiler_options),
                     microbatches=int(config.train.microbatches),
                     loss_chunk=work.resolve_loss_chunk(config.train.loss_chunk_size,
                                                        target.platform, spec.seq_len,
                                                        spec.model.vocab_size))


__all__ = ["AotError", "CompiledRun", "ProgramResult", "compile_run", "parse_oom"]
