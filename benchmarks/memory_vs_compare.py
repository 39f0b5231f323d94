"""The analytic memory model beside XLA's on the compiled programs of benchmarks/maxtext_compare.py.

  python benchmarks/memory_vs_compare.py [RESULTS.json]

For each chinchax row of the compare's results (default
benchmarks/figures/maxtext_compare/results.json): the case's shape, mesh, microbatches,
gradient reduction and resolved attention through ``aot.report.profile_of`` and
``work.mesh_memory_per_device``, beside XLA's arguments + outputs - aliased + temporaries +
code per device (GB). No compile: it reads what the compare measured.
"""

from __future__ import annotations

import json
import pathlib
import sys
import types

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import maxtext_compare as mc  # noqa: E402  (the case table)

from chinchax.aot import report  # noqa: E402
from chinchax.cost import budget, work  # noqa: E402


def row(r: dict) -> tuple[float, work.MemoryEstimate]:
  """(XLA's bytes per device, the analytic estimate) of one chinchax result row."""
  name, spec, (data, fsdp), batch, seq_len, attention, micro = mc.CASES[r["case"]]
  m = mc.MODELS[name]
  gpu = spec.startswith("h")
  shape = budget.ModelShape(d_model=m["d_model"], n_layers=m["n_layers"], n_heads=m["n_heads"],
                            d_ff=m["d_ff"], vocab_size=m["vocab"], seq_len=seq_len,
                            tie_embeddings=False, n_kv_heads=m["n_kv_heads"])
  impl = "xla" if attention == "xla" else ("cudnn" if gpu else "splash")
  prof = report.profile_of(types.SimpleNamespace(compute_dtype="bfloat16", attention=impl))
  mesh = {"data": data, "fsdp": fsdp, "tensor": 1}
  reduce = work.resolve_grad_reduce(mc.CHINCHAX_TRAIN.get(r["case"], {}).get("grad_reduce",
                                                                              "auto"), mesh)
  est = work.mesh_memory_per_device(shape, batch, mesh=mesh, remat=mc.REMAT, profile=prof,
                                    microbatches=micro, grad_reduce=reduce)
  x = r["memory"]
  return x["argument"] + x["output"] - x["alias"] + x["temp"] + x["generated_code"], est


def main() -> int:
  path = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/figures/maxtext_compare/results.json"
  print("| case | XLA GB | analytic GB | analytic / XLA |\n|---|---|---|---|")
  for r in json.loads(pathlib.Path(path).read_text()):
    if r["stack"] == "chinchax" and r.get("memory"):
      xla, est = row(r)
      print(f"| {r['case']} | {xla / 1e9:.2f} | {est.total / 1e9:.2f} | {est.total / xla:.2f} |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
