"""Which JAX backends a process starts: never libtpu on a host without TPUs.

With ``libtpu`` installed (the ``test`` and ``tpu`` extras), JAX's automatic
backend choice starts the TPU backend in every process, even a CPU-only train:
libtpu prints "Failed to find host bounds for accelerator type" and "E0000 …
unexpected worker hostname" on a host without TPUs, and holds its
multi-process lockfile (``/tmp/libtpu_lockfile``) for the life of the process,
so a concurrent ``chinchax compile --topology v5e-8`` cannot describe its
slice. :func:`choose` therefore sets ``JAX_PLATFORMS`` before JAX starts, on a
host without TPU devices, to the non-TPU backends there are (``cuda`` when its
plugin is installed and an NVIDIA device is visible, then ``cpu``).

A compile for a TPU slice still works: ``jax.experimental.topologies`` loads
libtpu for the description alone, whatever ``JAX_PLATFORMS`` says. The user's
own ``JAX_PLATFORMS`` (``tpu``, ``cpu``, ``cuda``, …) is always kept; it is the
knob that forces a choice. This module imports no JAX.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys

# Device files of a TPU host: /dev/accel* (TPU v2-v4 VMs), /dev/vfio/<n> (v5e, v5p, v6e VMs and
# GKE TPU pods); GKE and Cloud TPU set TPU_ACCELERATOR_TYPE / TPU_WORKER_ID in the environment.
TPU_DEVICE_GLOBS = ("/dev/accel[0-9]*", "/dev/vfio/[0-9]*")
TPU_ENV = ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_ID")
NVIDIA_DEVICES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg")


def tpu_host() -> bool:
  """True when this host has TPU device files or a Cloud TPU / GKE TPU environment."""
  if any(os.environ.get(k) for k in TPU_ENV):
    return True
  return any(glob.glob(pattern) for pattern in TPU_DEVICE_GLOBS)


def _installed(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:  # no jax_plugins namespace package at all
    return False


def non_tpu_platforms() -> str:
  """The ``JAX_PLATFORMS`` value of a process that uses no TPU: ``"cuda,cpu"`` when JAX's CUDA
  plugin is installed and an NVIDIA device is visible, else ``"cpu"``."""
  cuda = (any(_installed(f"jax_plugins.xla_cuda{v}") for v in (12, 13))
          and any(os.path.exists(d) for d in NVIDIA_DEVICES))
  return "cuda,cpu" if cuda else "cpu"


def choose() -> str | None:
  """Sets ``JAX_PLATFORMS`` so that this process (and its children) never start libtpu on a host
  without TPUs; before JAX's backends start. Returns the value set, or None when it leaves the
  choice to JAX: the user set ``JAX_PLATFORMS``, this is a TPU host, or libtpu is not installed.
  When JAX is already imported its ``jax_platforms`` option is set too (its backends must not
  have started yet; if they have, nothing changes for this process)."""
  if os.environ.get("JAX_PLATFORMS") or tpu_host() or not _installed("libtpu"):
    return None
  value = non_tpu_platforms()
  os.environ["JAX_PLATFORMS"] = value
  jax = sys.modules.get("jax")
  if jax is not None and not getattr(jax.config, "jax_platforms", None):
    jax.config.update("jax_platforms", value)
  return value
