"""Timing a planned shape with ``chinchax train``'s own step on this machine's devices.

The step is :func:`chinchax.bench.measure_point`'s; importing this module loads
JAX, Flax and the train stack, so the planner takes the measure function as an
argument and ``chinchax plan`` imports this module only for ``--calibrate``.
"""

from __future__ import annotations

import jax
import numpy as np

from chinchax import bench as bench_lib
from chinchax.cost import budget
from chinchax import config as config_lib
from chinchax.cost import hardware as hardware_lib
from chinchax.planning import shapes as shapes_lib
from chinchax.planning.errors import PlanError


def local_devices_for(hardware: hardware_lib.Hardware) -> list:
  """The first ``hardware.n_devices`` local JAX devices, if this machine is ``hardware``.

  Raises:
    PlanError: the local devices are another kind, or too few.
  """
  devices = jax.devices()
  backend = jax.default_backend()
  local = hardware_lib.match_accelerator(devices[0].device_kind, backend,
                                         hardware_lib.load_accelerators())
  if local is None or local.name != hardware.accelerator.name:
    raise PlanError(f"--calibrate times candidates on this machine, which has "
                    f"{len(devices)}× {devices[0].device_kind} ({backend}), not "
                    f"{hardware.spec}; plan without --calibrate or run where the hardware is")
  if len(devices) < hardware.n_devices:
    raise PlanError(f"--calibrate needs {hardware.n_devices} local devices for {hardware.spec}, "
                    f"this process has {len(devices)}"
                    + (f" (on CPU: XLA_FLAGS=--xla_force_host_platform_device_count="
                       f"{hardware.n_devices})" if backend == "cpu" else ""))
  return devices[:hardware.n_devices]


def step_config(shape: budget.ModelShape, global_batch_size: int, *, steps: int):
  """The training config whose step a planned ``shape`` runs, ``steps`` long.

  ``chinchax.config.base_config()`` with the shape, batch and seq_len set and
  the budget in steps (calibration and the CPU plan benchmark time it).
  """
  c = config_lib.base_config()
  c.model.update(**shape.arch())
  c.train.update(global_batch_size=int(global_batch_size), seq_len=shape.seq_len)
  c.budget.update(mode="steps", steps=steps)
  return c


def measure_step_time(shape: shapes_lib.ShapeCandidate | budget.ModelShape,
                      global_batch_size: int, hardware: hardware_lib.Hardware, *,
                      warmup_steps: int = 3, timed_steps: int = 20) -> tuple[float, float]:
  """Times ``chinchax train``'s step for a shape on this machine's devices.

  The step is :func:`chinchax.bench.measure_point`'s — the training config
  the planner would write (default compute dtype and attention), random
  tokens — on the first ``hardware.n_devices`` local devices.

  Returns:
    (mean step time over the timed steps, start-up = everything before the
    steady state: state set-up, tracing, compilation, first step), in seconds.
  Raises:
    PlanError: the local devices are not ``hardware`` (kind or count), or the
      step fails to compile or run (the message carries XLA's error).
  """
  shape = getattr(shape, "shape", shape)
  devices = local_devices_for(hardware)
  c = step_config(shape, global_batch_size, steps=warmup_steps + timed_steps + 1)
  row = bench_lib.measure_point(c, warmup_steps=warmup_steps, timed_steps=timed_steps,
                                devices=devices)
  if row.get("status") != "ok":
    raise PlanError(f"--calibrate: the train step of d_model {shape.d_model} × {shape.n_layers} "
                    f"layers, batch {global_batch_size} failed ({row.get('status')}): "
                    f"{row.get('error', '')[:500]}")
  # A budget pays the mean step, slow outliers included (the bench reports the median).
  return float(np.mean(row["step_times_s"])), float(row["startup_s"])
