"""The analytic memory model against XLA: configs of ~125M-8B compiled for TPU slices and GPU hosts.

  python benchmarks/aot_memory.py [OUT.json] [--quick | --microbatches]

For each row (a model shape, a batch, a target, a mesh, a remat policy) it
compiles ``chinchax train``'s step ahead of time (``chinchax.aot``) and prints
the analytic per-device memory (``chinchax.cost.work.mesh_memory_per_device``)
beside XLA's (arguments + outputs − aliased + temporaries + code), their
ratio, XLA's FLOPs per layer over the analytic count, and the collectives'
wire bytes beside what the sharding table predicts (:func:`predicted_collectives`):

* fsdp: all-gather of the compute-dtype weights (forward, and again in the
  backward under remat), reduce-scatter of the gradients;
* data: an all-reduce of the gradients (all parameters).

No accelerator is needed; TPU rows need libtpu, GPU rows the CUDA plugin
(``PYTHONPATH`` may point at a ``pip install --target`` of it). Rows whose
compiler is missing are skipped and said so. ``--quick`` keeps the three
smallest rows. ``--microbatches`` compiles :data:`MICROBATCH_ROWS` instead:
per-device peak against ``train.microbatches`` M (the 125M config of
``configs/train.py`` on v5e-16 without remat, a 1B shape on h100x8 and
v5p-32) and the chunked loss (``train.loss_chunk_size``) at a 128,256-token
vocabulary.
"""

from __future__ import annotations

import json
import sys
import time

from chinchax.cost import budget
from chinchax import config as config_lib
from chinchax.aot import program as program_lib
from chinchax.aot import report as report_lib
from chinchax.aot import topology

# name: (d_model, n_layers, n_heads, d_ff, vocab)
SHAPES = {
    "125m": (768, 12, 12, 2048, 32768),
    "350m": (1024, 24, 16, 2816, 32768),
    "1b": (2048, 16, 16, 5632, 32768),
    "3b": (3072, 26, 24, 8192, 32768),
    "8b": (4096, 32, 32, 14336, 32768),
}
# (shape, target, data, fsdp, tensor, remat, global_batch_size, seq_len)
ROWS = [
    ("125m", "v5e-16", 16, 1, 1, "full", 256, 1024),
    ("125m", "v5e-16", 1, 16, 1, "full", 256, 1024),
    ("350m", "v5e-16", 1, 16, 1, "full", 128, 2048),
    ("1b", "v5e-16", 1, 8, 2, "full", 64, 2048),
    ("1b", "v5p-32", 1, 16, 1, "full", 128, 2048),
    ("1b", "v5p-32", 1, 16, 1, "dots", 64, 2048),
    ("1b", "h100x8", 1, 8, 1, "full", 64, 2048),
    ("3b", "v5p-32", 1, 8, 2, "full", 64, 2048),
    ("8b", "v5p-128", 1, 32, 2, "full", 128, 2048),
    ("8b", "h200x8", 1, 8, 1, "full", 16, 2048),
]


# (shape, target, data, fsdp, tensor, remat, global_batch_size, seq_len, M, loss chunk, vocab)
# "125m-config" is configs/train.py:125m as shipped (byte vocabulary, tied embeddings).
MICROBATCH_ROWS = (
    [("125m-config", "v5e-16", 16, 1, 1, "none", 256, 1024, m, 0, None) for m in (1, 2, 4, 8)]
    + [("1b", "h100x8", 1, 8, 1, "full", 128, 2048, m, 0, None) for m in (1, 2, 4, 8)]
    + [("1b", "v5p-32", 1, 16, 1, "full", 128, 2048, m, 0, None) for m in (1, 2, 4, 8)]
    + [("1b", "v5p-32", 1, 16, 1, "full", 128, 2048, 1, c, 128256) for c in (0, 512)]
    + [("1b", "h100x8", 1, 8, 1, "full", 128, 2048, 1, c, 128256) for c in (0, 512)])


def config_for(shape: str, data: int, fsdp: int, tensor: int, remat: str, gbs: int, seq: int,
               microbatches: int = 1, loss_chunk: int = 0, vocab: int | None = None):
  if shape == "125m-config":
    c = config_lib.get_variant("125m")
    c.model.remat = remat
  else:
    d, L, H, F, V = SHAPES[shape]
    c = config_lib.get_variant("default")
    c.model.update(d_model=d, n_layers=L, n_heads=H, d_ff=F, vocab_size=vocab or V,
                   remat=remat, scan_layers=True, tie_embeddings=False)
  c.train.update(global_batch_size=gbs, seq_len=seq, microbatches=microbatches)
  del c.train["loss_chunk_size"]  # the default "auto" is a string; the rows give positions
  c.train.loss_chunk_size = loss_chunk
  c.mesh.update(data=data, fsdp=fsdp, tensor=tensor)
  c.budget.update(mode="steps", steps=1000)
  return c


def predicted_collectives(rep: dict) -> dict:
  """Wire bytes per device per step that the sharding table implies (module doc): FSDP moves
  the bf16 weights (gathered once, twice under remat) and reduce-scatters the bf16
  gradients; data parallelism all-reduces the gradients; tensor parallelism all-reduces
  each layer's attention and MLP outputs (bf16 [tokens, d_model]) in the forward, again in
  the recomputed forward under remat, and their gradients in the backward (Shoeybi et al.
  2019, Sec. 3); each over (g − 1) / g of a ring."""
  r = rep["run"]
  shape = budget.ModelShape(vocab_size=r["vocab_size"], d_model=r["d_model"],
                            n_layers=r["n_layers"], n_heads=r["n_heads"], d_ff=r["d_ff"],
                            seq_len=r["seq_len"], tie_embeddings=False)
  n = budget.param_counts(shape).total
  m = r["mesh"]
  gathers = 2 if r["remat"] != "none" else 1
  f, d = m["fsdp"], m["data"] * m["fsdp"]
  fsdp = (gathers + 1) * 2 * n / m["tensor"] * (f - 1) / f if f > 1 else 0.0
  dp = 2 * 2 * n / m["tensor"] * (d - 1) / d if m["data"] > 1 and f == 1 else 0.0
  t = m["tensor"]
  tokens = r["global_batch_size"] * r["seq_len"] / d
  passes = 6 if r["remat"] != "none" else 4
  tp = (passes * r["n_layers"] * 2 * tokens * r["d_model"] * 2 * (t - 1) / t) if t > 1 else 0.0
  return {"fsdp": fsdp, "all-reduce": dp + tp}


def measured_collectives(col: dict) -> dict:
  """Wire bytes of the same traffic in the compiled HLO: on TPU, XLA's collective matmuls
  carry FSDP's gathers and reduce-scatters as collective-permutes, so those count too."""
  wire = {k: (col.get(k) or {}).get("wire_bytes", 0.0) for k in
          ("all-gather", "reduce-scatter", "collective-permute", "all-reduce")}
  return {"fsdp": wire["all-gather"] + wire["reduce-scatter"] + wire["collective-permute"],
          "all-reduce": wire["all-reduce"]}


def main(argv: list[str]) -> int:
  quick = "--quick" in argv
  args = [a for a in argv if not a.startswith("--")]
  rows = ROWS[:3] if quick else ROWS
  if "--microbatches" in argv:
    rows = MICROBATCH_ROWS
  results = []
  devices = {}
  for shape, spec, data, fsdp, tensor, remat, gbs, seq, *more in rows:
    m, chunk, vocab = more or (1, 0, None)
    target = topology.parse_target(spec)
    try:
      topology.check_available(target)
    except topology.AotError as e:
      print(f"skip {shape} on {spec}: {e}")
      continue
    if spec not in devices:
      devices[spec] = topology.compile_devices(target)
    c = config_for(shape, data, fsdp, tensor, remat, gbs, seq, m, chunk, vocab)
    t0 = time.perf_counter()
    run = program_lib.compile_run(c, target, eval_step=False, devices=devices[spec])
    rep = report_lib.summarize(run)
    t = rep["train_step"]
    xla = t["memory"].get("total")
    ana = rep["analytic"]["memory"]["total"]
    col = t.get("collectives") or {}
    pred = predicted_collectives(rep)
    row = {"shape": shape, "target": spec, "mesh": f"{data}x{fsdp}x{tensor}", "remat": remat,
           "global_batch_size": gbs, "seq_len": seq, "microbatches": m, "loss_chunk": chunk,
           "run": rep["run"], "N": rep["run"]["N"], "fits": rep["fits"],
           "xla_total": xla, "analytic_total": ana,
           "analytic_over_xla": ana / xla if xla else None,
           "xla_argument": t["memory"].get("argument"), "analytic_state":
               rep["analytic"]["memory"]["state"], "xla_temp": t["memory"].get("temp"),
           "xla_over_analytic_flops_per_layer": rep.get("xla_over_analytic_flops"),
           "collectives": {k: (measured_collectives(col)[k], pred[k]) for k in pred},
           "compile_s": time.perf_counter() - t0, "notes": rep["notes"], "oom": t.get("oom"),
           "xla_memory": t["memory"], "analytic_memory": rep["analytic"]["memory"]}
    results.append(row)
    if args:  # after every row: a long run keeps what it measured
      with open(args[0], "w") as f:
        json.dump(results, f, indent=2, default=float)
    fl = row["xla_over_analytic_flops_per_layer"]
    print(f"{shape:>5} {spec:>8} {row['mesh']:>7} {remat:>5} batch {gbs}x{seq} M {m} chunk "
          f"{chunk} vocab {rep['run']['vocab_size']}: XLA "
          f"{(xla or 0) / 1e9:7.2f} GB ({'fits' if rep['fits'] else 'OOM'}), analytic "
          f"{ana / 1e9:7.2f} GB, ratio {row['analytic_over_xla'] or float('nan'):.3f}; args "
          f"{(row['xla_argument'] or 0) / 1e9:.3f} vs state {row['analytic_state'] / 1e9:.3f} GB;"
          f" FLOPs/layer XLA/analytic {'n/a' if fl is None else f'{fl:.3f}'}; "
          + "; ".join(f"{k} wire {(v[0] or 0) / 1e9:.3f} vs {(v[1] or 0) / 1e9:.3f} GB"
                      for k, v in row["collectives"].items())
          + f"; compile {row['compile_s']:.1f} s", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
