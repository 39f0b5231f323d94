"""Bench step time vs `chinchax train` step time for the same config (issue 5, acceptance 2).

Alternates, in one process on 8 virtual CPU devices: a short `chinchax train` run (its
summary.json's step_time_s: mean seconds per step over the logged windows, input pipeline
included) and `chinchax bench`'s measurement of the same training config (median over steady-
state steps, each timed from the previous step's completion to its own with the next one queued;
random tokens). Both run the step built by `train.build_program`.

Usage: python benchmarks/bench_vs_train.py [OUT_DIR] [ROUNDS (default 6)]
"""

import json
import os
import pathlib
import statistics
import sys
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

from chinchax import bench  # noqa: E402
from chinchax import config as config_lib  # noqa: E402
from chinchax import train as train_lib  # noqa: E402


def make_config(workdir: str):
  """s2 of the default bench sweep (d_model 64, 2 layers) at batch 32×128, pure DP on 8 devices."""
  c = config_lib.base_config()
  c.workdir = workdir
  c.compile_cache_dir = ""
  c.model.update(d_model=64, n_layers=2, n_heads=4, d_ff=192, compute_dtype="float32",
                 attention="xla", remat="none")
  c.train.update(global_batch_size=32, seq_len=128, log_every=5, eval_every=10_000,
                 eval_batches=1, checkpoint_every=10_000, progress=False)
  c.budget.update(mode="steps", steps=41)
  c.mesh.update(data=-1, fsdp=1, tensor=1, num_cpu_devices=0)
  return c


def main() -> int:
  out = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else None
  rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 6
  peak_total, _ = train_lib.peak_flops(make_config("unused"), jax.device_count())
  train_times, bench_times, bench_means, ratios = [], [], [], []
  with tempfile.TemporaryDirectory() as tmp:
    # Rounds after the first load both programs from this cache instead of compiling again,
    # so train and bench run close together in time (this host's load drifts by minutes).
    jax.config.update("jax_compilation_cache_dir", f"{tmp}/jax-cache")
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    for r in range(rounds):
      c = make_config(f"{tmp}/run{r}")
      c.train.peak_flops_per_device = peak_total / jax.device_count()
      s = train_lib.train(c, verbose=False)
      train_times.append(s["step_time_s"])
      row = bench.measure_point(c, warmup_steps=2, timed_steps=20)
      assert row["status"] == "ok", row
      bench_times.append(row["step_time_s"])
      bench_means.append(statistics.mean(row["step_times_s"]))
      ratios.append(bench_times[-1] / train_times[-1])
      print(f"round {r}: train {1e3 * train_times[-1]:.2f} ms/step (mean of {s['steps'] - 1} "
            f"steps), bench {1e3 * bench_times[-1]:.2f} ms/step median "
            f"({1e3 * bench_means[-1]:.2f} mean) of 20; bench/train {ratios[-1]:.3f}",
            flush=True)
  res = {"train_step_time_s": train_times, "bench_step_time_s": bench_times,
         "bench_mean_step_time_s": bench_means, "round_ratios": ratios,
         "ratio_of_medians": statistics.median(bench_times) / statistics.median(train_times),
         "median_round_ratio": statistics.median(ratios),
         "median_round_ratio_of_means": statistics.median(
             b / t for b, t in zip(bench_means, train_times))}
  print(f"median: train {1e3 * statistics.median(train_times):.2f} ms/step, bench "
        f"{1e3 * statistics.median(bench_times):.2f} ms/step; bench/train = "
        f"{res['ratio_of_medians']:.3f}, median of per-round ratios "
        f"{res['median_round_ratio']:.3f}; bench mean/train mean, median over rounds "
        f"{res['median_round_ratio_of_means']:.3f} (target within 0.90-1.10)")
  if out:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_vs_train.json").write_text(json.dumps(res, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
