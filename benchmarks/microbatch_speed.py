"""Cost of microbatches and of the chunked loss on this CPU.

    python benchmarks/microbatch_speed.py [--microbatches 4] [--steps 5] [--repeats 7]
        [--vocabs 32768,128256] [--tokens 512] [--chunk 128] [--json OUT]

Part 1, microbatches: at two model shapes, the jitted train step
(``train.build_program``) with ``train.microbatches`` = M (M microbatches of B/M rows,
gradients accumulated in one step) against M = 1 (one batch of B rows), one CPU device,
random tokens. Each figure is the median over ``--repeats`` blocks of ``--steps`` steps,
the two programs' blocks alternated in one process so host noise falls on both alike.

Part 2, the loss: value and gradient of the cross-entropy + z-loss of ``--tokens`` tokens
at d_model 64 for each vocabulary V, from the full float32 logits [tokens, V]
(``loss.row_sums``) against chunks of ``--chunk`` positions (``loss.chunked_row_sums``):
median time (alternated as above) and XLA's temporary memory of each compiled program
(``memory_analysis``), the logits' share of a step's memory.

Prints markdown tables; ``--json`` also writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import jax
import jax.numpy as jnp
import numpy as np

from chinchax import config as config_lib
from chinchax.model import sharding as sharding_lib
import chinchax.model.transformer as model_lib
import chinchax.train.loss as loss_lib
import chinchax.train.spec as spec_lib
import chinchax.train.step as step_lib

# (name, d_model, n_layers, n_heads, d_ff, global_batch_size, seq_len)
SHAPES = (("d128 L4 B32 T128", 128, 4, 4, 352, 32, 128),
          ("d256 L4 B16 T256", 256, 4, 4, 704, 16, 256))


def _program(shape, microbatches: int):
  _, d, L, h, f, b, t = shape
  c = config_lib.get_variant("tiny")
  c.model.update(d_model=d, n_layers=L, n_heads=h, d_ff=f, vocab_size=257)
  c.train.update(global_batch_size=b, seq_len=t, microbatches=microbatches, loss_chunk_size="0")
  c.budget.update(mode="steps", steps=100)
  c.mesh.update(data=1, fsdp=1, tensor=1)
  devices = jax.devices()[:1]
  spec = spec_lib.resolve(c, 1)
  return step_lib.build_program(c, spec, sharding_lib.make_mesh(spec.mesh, devices))


def _alternated(fns: dict, repeats: int) -> dict:
  """Median seconds of each ``fns[k]()`` (one timed block each), blocks alternated."""
  times = {k: [] for k in fns}
  for _ in range(repeats):
    for k, fn in fns.items():
      t0 = time.perf_counter()
      fn()
      times[k].append(time.perf_counter() - t0)
  return {k: statistics.median(v) for k, v in times.items()}


def microbatch_rows(m: int, steps: int, repeats: int) -> list[dict]:
  rows = []
  for shape in SHAPES:
    b, t = shape[5], shape[6]
    programs = {1: _program(shape, 1), m: _program(shape, m)}
    states, blocks = {}, {}
    batch = np.random.default_rng(0).integers(0, 257, (b, t + 1), dtype=np.int32)
    for k, p in programs.items():
      p.lower().compile()
      gb = jax.device_put(batch, p.batch_sharding)
      states[k] = p.init_state()
      states[k], _ = p.step(states[k], gb)  # warm-up

      def block(k=k, p=p, gb=gb):
        for _ in range(steps):
          states[k], metrics = p.step(states[k], gb)
        jax.block_until_ready(metrics["loss"])
      blocks[k] = block
    med = _alternated(blocks, repeats)
    t1, tm = med[1] / steps, med[m] / steps
    rows.append({"shape": shape[0], "tokens_per_step": b * t, "M": m, "ms_M1": 1e3 * t1,
                 "ms_M": 1e3 * tm, "overhead": tm / t1 - 1})
  return rows


def loss_rows(vocabs, tokens: int, chunk: int, repeats: int) -> list[dict]:
  rows = []
  d, b = 64, 1
  for v in vocabs:
    k = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(k[0], (b, tokens, d), jnp.float32)
    head = 0.05 * jax.random.normal(k[1], (d, v), jnp.float32)
    targets = jax.random.randint(k[2], (b, tokens), 0, v)

    def full(x, head):
      ce, z2 = loss_lib.row_sums(model_lib.project(x, head), targets)
      return jnp.sum(ce + 1e-4 * z2)

    def chunked(x, head):
      ce, z2 = loss_lib.chunked_row_sums(x, head, targets, chunk)
      return jnp.sum(ce + 1e-4 * z2)

    fns, temp = {}, {}
    for name, f in (("full", full), ("chunked", chunked)):
      compiled = jax.jit(jax.value_and_grad(f, argnums=(0, 1))).lower(x, head).compile()
      mem = compiled.memory_analysis()
      temp[name] = getattr(mem, "temp_size_in_bytes", float("nan"))
      jax.block_until_ready(compiled(x, head))

      def run(c=compiled):
        for _ in range(3):
          out = c(x, head)
        jax.block_until_ready(out)
      fns[name] = run
    med = _alternated(fns, repeats)
    rows.append({"V": v, "tokens": tokens, "chunk": chunk, "ms_full": 1e3 * med["full"] / 3,
                 "ms_chunked": 1e3 * med["chunked"] / 3, "ratio": med["chunked"] / med["full"],
                 "temp_MiB_full": temp["full"] / 2 ** 20,
                 "temp_MiB_chunked": temp["chunked"] / 2 ** 20})
  return rows


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--microbatches", type=int, default=4)
  ap.add_argument("--steps", type=int, default=5)
  ap.add_argument("--repeats", type=int, default=7)
  ap.add_argument("--vocabs", default="32768,128256")
  ap.add_argument("--tokens", type=int, default=512)
  ap.add_argument("--chunk", type=int, default=128)
  ap.add_argument("--json", default="")
  a = ap.parse_args(argv)
  mb = microbatch_rows(a.microbatches, a.steps, a.repeats)
  print(f"| shape | tokens/step | ms/step M=1 | ms/step M={a.microbatches} | overhead |")
  print("|---|---:|---:|---:|---:|")
  for r in mb:
    print(f"| {r['shape']} | {r['tokens_per_step']:,} | {r['ms_M1']:.1f} | {r['ms_M']:.1f} | "
          f"{100 * r['overhead']:+.1f}% |")
  lr = loss_rows([int(v) for v in a.vocabs.split(",")], a.tokens, a.chunk, a.repeats)
  print()
  print("| V | tokens | chunk | ms full | ms chunked | chunked/full | XLA temp MiB full | "
        "chunked |")
  print("|---:|---:|---:|---:|---:|---:|---:|---:|")
  for r in lr:
    print(f"| {r['V']:,} | {r['tokens']} | {r['chunk']} | {r['ms_full']:.1f} | "
          f"{r['ms_chunked']:.1f} | {r['ratio']:.2f} | {r['temp_MiB_full']:.0f} | "
          f"{r['temp_MiB_chunked']:.0f} |")
  if a.json:
    pathlib.Path(a.json).write_text(json.dumps({"microbatches": mb, "loss": lr}, indent=2))


if __name__ == "__main__":
  main()
