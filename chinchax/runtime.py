"""Process-wide JAX settings that must be made before JAX's backend starts."""

from __future__ import annotations

import os

import jax


def setup_cpu_devices(n: int) -> None:
  """Exposes ``n`` virtual CPU devices (only before JAX's backend starts; no-op for 0)."""
  if n > 0:
    jax.config.update("jax_num_cpu_devices", n)


def setup_compilation_cache(path: str) -> None:
  """Turns on JAX's persistent compilation cache at ``path`` (no-op for "").

  Restarts, resumed runs and ladder runs of a repeated shape then skip XLA
  compilation, which dominates short runs on CPU.
  """
  if path:
    jax.config.update("jax_compilation_cache_dir", os.path.expanduser(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
