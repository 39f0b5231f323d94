"""The named bench variants (``configs/bench.py:VARIANT``): small edits of the default sweep.

Kept beside :mod:`chinchax.config.defaults`, whose :func:`base_bench_config` holds every
bench knob with its comment.
"""

from __future__ import annotations

import ml_collections

from chinchax.config.checks import ConfigError
from chinchax.config.defaults import base_bench_config, bench_model, bench_sweep


def get_bench_variant(name: str) -> ml_collections.ConfigDict:
  """Named bench variants: default (CPU, 8 virtual devices), h200 (one GPU), tiny (for tests).

  Raises:
    ConfigError: for an unknown name.
  """
  c = base_bench_config()
  if name == "default":
    return c
  if name == "h200":
    c.workdir = "runs/bench-h200"
    c.bench.update(warmup_steps=3, timed_steps=10, fit_sweep="", point_timeout_s=240)
    c.models = m = ml_collections.ConfigDict()
    m.m125 = bench_model(768, 12, 12, 2048)    # 110M parameters with a 32768 vocab
    m.m350 = bench_model(1024, 24, 16, 2816)   # 342M parameters with a 32768 vocab
    c.sweeps = s = ml_collections.ConfigDict()
    # Sweeps run in name order: "big" first, cuDNN before XLA, so a stopped run keeps those.
    s.big = bench_sweep("m350", global_batch_size="16,8", seq_len="1024",
                        attention="cudnn,xla", compute_dtype="bfloat16")
    s.small = bench_sweep("m125", global_batch_size="32,16", seq_len="1024",
                          attention="cudnn,xla", compute_dtype="bfloat16")
    c.train_config.model.update(vocab_size=32768, scan_layers=True)  # compile once per shape, not per layer
    c.train_config.mesh.num_cpu_devices = 0
    return c
  if name == "tiny":
    c.workdir = "runs/bench-tiny"
    c.bench.update(warmup_steps=1, timed_steps=2, isolate=False, fit_sweep="", plots=True)
    c.models = m = ml_collections.ConfigDict()
    m.t1 = bench_model(32, 1, 2, 64)
    c.sweeps = s = ml_collections.ConfigDict()
    s.batch = bench_sweep("t1", global_batch_size="8,16", seq_len="32")
    s.limits = bench_sweep("t1", global_batch_size="8", seq_len="32", mesh="3x1x1")
    return c
  raise ConfigError(f"unknown bench variant {name!r}; known: default, h200, tiny")
