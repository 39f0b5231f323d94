"""CPU step-time sweep → fitted step-time model → `plan --hours` → measured tokens in the budget.

Usage: python benchmarks/plan_step_time_cpu.py OUT_DIR HOURS
"""

import json
import math
import pathlib
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from chinchax import budget
from chinchax import config as config_lib
from chinchax import hardware as hw
from chinchax import sharding as sharding_lib
from chinchax import train as train_lib

SEQ = 128
V = 257


def make_step(d, L, H, F, gbs):
  c = config_lib.base_config()
  c.model.update(vocab_size=V, d_model=d, n_layers=L, n_heads=H, d_ff=F,
                 compute_dtype="float32", attention="xla")
  c.train.update(global_batch_size=gbs, seq_len=SEQ)
  c.budget.update(mode="steps", steps=1000)
  devices = jax.devices()[:1]
  spec = train_lib.resolve(c, 1)
  mesh = sharding_lib.make_mesh(spec.mesh, devices)
  tx, schedule = train_lib.make_optimizer(c, spec)
  graphdef, state, shardings = train_lib.create_state(spec.model, tx, mesh, c.seed)
  step = jax.jit(train_lib.make_train_step(graphdef, tx, schedule, 0.0),
                 in_shardings=(shardings, sharding_lib.batch_sharding(mesh)),
                 out_shardings=(shardings, None), donate_argnums=0)
  rng = np.random.default_rng(0)
  batch = jax.device_put(jnp.asarray(rng.integers(0, V, (gbs, SEQ + 1)), jnp.int32),
                         sharding_lib.batch_sharding(mesh))
  return step, state, batch


def time_steps(d, L, H, F, gbs, n=8, repeats=3):
  step, state, batch = make_step(d, L, H, F, gbs)
  for _ in range(3):
    state, m = step(state, batch)
  jax.block_until_ready(m["loss"])
  per = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    for _ in range(n):
      state, m = step(state, batch)
    jax.block_until_ready(m["loss"])
    per.append((time.perf_counter() - t0) / n)
  return statistics.median(per)


def run_for(d, L, H, F, gbs, seconds):
  """Runs train steps back to back for `seconds` of wall clock (after compile); tokens done."""
  step, state, batch = make_step(d, L, H, F, gbs)
  state, m = step(state, batch)
  jax.block_until_ready(m["loss"])
  steps, t0 = 0, time.perf_counter()
  while True:
    state, m = step(state, batch)
    jax.block_until_ready(m["loss"])
    if time.perf_counter() - t0 > seconds:
      break
    steps += 1
  return steps * gbs * SEQ


SWEEP = [(32, 2, 8), (64, 2, 8), (64, 4, 16), (96, 3, 8), (128, 2, 16), (128, 6, 8),
         (160, 3, 8), (192, 4, 16), (48, 3, 32), (256, 2, 8), (96, 6, 16), (224, 3, 8)]
HELD_OUT = [2, 5, 8, 11]


def main():
  out = pathlib.Path(sys.argv[1])
  hours = float(sys.argv[2])
  out.mkdir(parents=True, exist_ok=True)
  rows = []
  for d, L, gbs in SWEEP:
    s = budget.shape_for(d, L, vocab_size=V, seq_len=SEQ, accelerator=False)
    t = time_steps(s.d_model, s.n_layers, s.n_heads, s.d_ff, gbs)
    rows.append({"d_model": s.d_model, "n_layers": s.n_layers, "n_heads": s.n_heads,
                 "d_ff": s.d_ff, "vocab_size": V, "seq_len": SEQ, "global_batch_size": gbs,
                 "tie_embeddings": True, "step_time_s": t})
    print(json.dumps(rows[-1]), flush=True)
  prof = hw.ExecutionProfile.for_kind("cpu")
  errs = hw.heldout_errors(rows, HELD_OUT, profile=prof)
  print("held-out:", json.dumps(errs, indent=1), flush=True)
  train_rows = [r for i, r in enumerate(rows) if i not in HELD_OUT]
  path = out / "cpu_step_time.json"
  hw.write_step_time_file(path, train_rows, hardware="cpu")
  res = subprocess.run([sys.executable, "-m", "chinchax.plan", "--hours", str(hours),
                        "--hardware", "cpu", "--step-time-model", str(path), "--json",
                        "--candidates", "10"], capture_output=True, text=True, check=True)
  plan = json.loads(res.stdout)
  measured_keys = {(r["d_model"], r["n_layers"], r["global_batch_size"]) for r in train_rows}
  key = (plan["d_model"], plan["n_layers"], plan["global_batch_size"])
  print("plan:", {k: plan[k] for k in ("d_model", "n_layers", "n_heads", "d_ff", "N", "D",
                                        "global_batch_size", "step_time_s", "predicted_loss")},
        "in sweep table:", key in measured_keys, flush=True)
  tokens = run_for(plan["d_model"], plan["n_layers"], plan["n_heads"], plan["d_ff"],
                   plan["global_batch_size"], hours * 3600)
  print(f"measured tokens in {hours} h: {tokens:,} vs predicted {plan['D']:,} "
        f"({tokens / plan['D'] - 1:+.2%})", flush=True)
  (out / "result.json").write_text(json.dumps({"rows": rows, "heldout": errs, "plan": plan,
                                               "measured_tokens": tokens}, indent=1))


if __name__ == "__main__":
  main()
