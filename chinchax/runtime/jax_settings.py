"""Process-wide JAX settings that must be made before JAX's backend starts."""

from __future__ import annotations

import os

import jax


# XLA's CPU collectives (the all-reduces between virtual CPU devices, each a thread) abort the
# process (SIGABRT and pages of log) when one device's thread reaches a collective this long after
# the others, and log "stuck" warnings long before; on a loaded 2-core host 8 device threads can
# fall far apart, or stall for good. A stalled step is the run's watchdog's to end, in one line
# that says what to do (train.stall_timeout_s, 15 min by default: chinchax.runtime.watchdog), so
# XLA's own limits sit past it, as a last resort when that watch is off. A value the user set in
# XLA_FLAGS is kept.
CPU_COLLECTIVE_FLAGS = {"xla_cpu_collective_call_terminate_timeout_seconds": 3600,
                        "xla_cpu_collective_call_warn_stuck_timeout_seconds": 3600,
                        "xla_cpu_collective_timeout_seconds": 3600}


def setup_cpu_devices(n: int) -> None:
  """Exposes ``n`` virtual CPU devices (only before JAX's backend starts; no-op for 0), with
  collective timeouts that survive a loaded host (:data:`CPU_COLLECTIVE_FLAGS`)."""
  if n > 0:
    jax.config.update("jax_num_cpu_devices", n)
  if n > 1:
    set_xla_flags(CPU_COLLECTIVE_FLAGS)


def set_xla_flags(flags: dict, environ=None) -> None:
  """Adds ``--name=value`` to ``XLA_FLAGS`` for each flag the variable does not set yet (read
  when the backend starts)."""
  environ = os.environ if environ is None else environ
  current = environ.get("XLA_FLAGS", "")
  extra = [f"--{k}={v}" for k, v in flags.items() if f"--{k}=" not in current]
  if extra:
    environ["XLA_FLAGS"] = " ".join([current, *extra]).strip()


def setup_compilation_cache(path: str) -> None:
  """Turns on JAX's persistent compilation cache at ``path`` (no-op for "").

  Restarts, resumed runs and ladder runs of a repeated shape then skip XLA
  compilation, which dominates short runs on CPU.
  """
  if path:
    jax.config.update("jax_compilation_cache_dir", os.path.expanduser(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
