"""Programs compiled, memory and seconds per call over many `chinchax sample` calls in one process.

A long-lived process (a notebook, a server) calls the sampling function again and again with
prompts of many lengths. This script makes 80 greedy calls over 36 prompt lengths (each length
at least twice) and prints, per call, the XLA compilations (counted by JAX's own monitoring
events, ``/jax/core/compile/backend_compile_duration``: every program XLA builds in the
process, ours or not), the resident memory (VmRSS) and the process's memory maps, then a
summary: compilations in all, RSS from call 10 to the last (MB, and MB per call by a
least-squares line), and the median seconds per call after the first 10.

  python benchmarks/sample_programs.py                       # a random model in memory
  python benchmarks/sample_programs.py --run runs/default    # chinchax sample on a run (run.sample)

Without ``--run`` it calls ``chinchax.sample.generate.generate`` on a random `small`-shaped
byte model (d_model 256, 6 layers, seq_len 256); with ``--run`` it calls
``chinchax.sample.run.sample`` (the verb's whole path: config, checkpoint, tokenizer, model).
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import jax  # noqa: E402
from flax import nnx  # noqa: E402
from jax import monitoring  # noqa: E402

from chinchax.model import transformer as model_lib  # noqa: E402
from chinchax.sample import generate as generate_lib  # noqa: E402
from chinchax.sample import run as run_lib  # noqa: E402
from chinchax.sample import strategies  # noqa: E402

COMPILES = [0]


def _on_event(name, _secs, **_kw):
  if name == "/jax/core/compile/backend_compile_duration":
    COMPILES[0] += 1


def _status(key: str) -> float:
  for line in pathlib.Path("/proc/self/status").read_text().splitlines():
    if line.startswith(key + ":"):
      return float(line.split()[1]) / 1024  # kB → MB
  return float("nan")


def _maps() -> int:
  return len(pathlib.Path("/proc/self/maps").read_text().splitlines())


def lengths(n_lengths: int, calls: int, longest: int) -> list[int]:
  """``calls`` prompt lengths cycling over ``n_lengths`` distinct ones spread over 1…longest."""
  distinct = sorted(set(np.linspace(1, longest, n_lengths).round().astype(int).tolist()))
  return [distinct[i % len(distinct)] for i in range(calls)]


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--run", default="", help="a run directory: call run.sample on it")
  ap.add_argument("--calls", type=int, default=80)
  ap.add_argument("--lengths", type=int, default=36)
  ap.add_argument("--new", type=int, default=16, help="new tokens per call")
  ap.add_argument("--same-length", type=int, default=0, metavar="P",
                  help="every call with a prompt of P tokens (nothing compiled after the first)")
  args = ap.parse_args(argv)
  monitoring.register_event_duration_secs_listener(_on_event)
  greedy = strategies.Sampling(temperature=0.0)
  text = ("It was the best of times, it was the worst of times, it was the age of wisdom, it "
          "was the age of foolishness, it was the epoch of belief, it was the epoch of ") * 4
  if args.run:
    run = run_lib.export_lib.load_run(args.run)
    seq_len = int(run["config"]["train"]["seq_len"])
    call = lambda P: run_lib.sample(args.run, run_lib.Request(  # noqa: E731
        prompt=text[:P], max_new_tokens=args.new, rule=greedy)).generation
  else:
    seq_len = 256
    cfg = model_lib.ModelConfig(vocab_size=257, d_model=256, n_layers=6, n_heads=4, d_ff=1024,
                                seq_len=seq_len, init_std=0.02)
    model = model_lib.Transformer(cfg, nnx.Rngs(params=0))
    ids = np.frombuffer(text.encode(), np.uint8).astype(np.int32)
    call = lambda P: generate_lib.generate(  # noqa: E731
        model, ids[None, :P], max_new_tokens=args.new, rule=greedy, eos_id=256,
        positions=seq_len)
  plan = ([args.same_length] * args.calls if args.same_length else
          lengths(args.lengths, args.calls, seq_len - args.new))
  start = COMPILES[0]  # programs compiled before the first call (the random model's init)
  rss, secs, ours = [], [], 0
  for k, P in enumerate(plan):
    t0 = time.perf_counter()
    gen = call(P)
    secs.append(time.perf_counter() - t0)
    ours += getattr(gen, "compiled", 0)
    rss.append(_status("VmRSS"))
    print(f"call {k + 1:3d}  P={P:3d}  compiles {COMPILES[0] - start:3d} (ours {ours:2d})  "
          f"{secs[-1]:6.3f} s  RSS {rss[-1]:8.1f} MB  maps {_maps()}", flush=True)
  tail = np.array(rss[9:])
  slope = np.polyfit(np.arange(len(tail)), tail, 1)[0] if len(tail) > 1 else float("nan")
  print(f"\n{args.calls} calls over {len(set(plan))} prompt lengths "
        f"({'run.sample on ' + args.run if args.run else 'generate, random small model'}, "
        f"seq_len {seq_len}, {args.new} new tokens, greedy):")
  buckets = (sorted({generate_lib.bucket(P, seq_len) for P in plan})
             if hasattr(generate_lib, "bucket") else "none")
  print(f"  XLA compilations during the calls: {COMPILES[0] - start} (sampling programs: {ours}; "
        f"prefill buckets {buckets})")
  print(f"  RSS call 10 → {args.calls}: {rss[9]:.1f} → {rss[-1]:.1f} MB "
        f"({rss[-1] - rss[9]:+.1f} MB; {slope:+.3f} MB per call by least squares)")
  print(f"  seconds per call: median {statistics.median(secs[10:]):.3f} after call 10, "
        f"first call {secs[0]:.2f}; peak RSS {_status('VmHWM'):.0f} MB")
  return 0


if __name__ == "__main__":
  sys.exit(main())
