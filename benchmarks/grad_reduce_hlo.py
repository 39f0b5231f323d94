"""Gradient collectives per step against train.microbatches M, on TPU programs compiled by libtpu.

  python benchmarks/grad_reduce_hlo.py [--quick]

Compiles the 125M config of ``configs/train.py`` (vocab 32,000, remat full, xla attention,
bf16) for v5e-16 with ``chinchax compile --json`` (each compile in its own process, no TPU
needed) over data 16 and over fsdp 16, at M = 1, 4, 8, with ``train.grad_reduce`` step and
microbatch, and prints per device: XLA's temporaries, its bytes accessed and FLOPs (per step,
the scanned layer scaled), and every collective kind's executions and operand bytes per step,
counted from the optimized HLO (``chinchax.aot.hlo``: a collective inside a loop counts once
per trip). ``--quick``: data 16 only, M = 1 and 4. About 4–15 minutes a compile on 2 busy cores.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parent.parent
BASE = ["--config", str(REPO / "configs/train.py:125m"), "--config.model.vocab_size=32000",
        "--config.model.remat=full", "--config.model.attention=xla", "--topology", "v5e-16"]
MESHES = {"data 16": ["--config.mesh.data=16", "--config.mesh.fsdp=1"],
          "fsdp 16": ["--config.mesh.data=1", "--config.mesh.fsdp=16"]}
KINDS = ("all-reduce", "reduce-scatter", "all-gather", "collective-permute", "all-to-all")


def compile_row(flags: list[str]) -> dict:
  """``chinchax compile --json`` of the base config with ``flags``: its train_step report."""
  with tempfile.TemporaryDirectory() as tmp:
    out = pathlib.Path(tmp) / "report.json"
    subprocess.run([sys.executable, "-m", "chinchax.cli", "compile", "--no-eval", "--no-cache",
                    "--json", "--out", str(out), *BASE, *flags], check=True,
                   stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())["train_step"]


def describe(step: dict) -> str:
  c = step["collectives"]
  parts = [f"{k} {c[k]['count']}x {c[k]['operand_bytes'] / 1e6:.1f} MB" for k in KINDS
           if c[k]["count"]]
  return (f"temp {step['memory']['temp'] / 1e9:.3f} GB | bytes {step['xla_bytes'] / 1e9:.2f} GB"
          f" | FLOPs {step['xla_flops'] / 1e12:.3f} T | " + ", ".join(parts))


def main(argv: list[str]) -> None:
  quick = "--quick" in argv
  meshes = {"data 16": MESHES["data 16"]} if quick else MESHES
  for mesh, mesh_flags in meshes.items():
    for reduce in ("step", "microbatch"):
      for M in ((1, 4) if quick else (1, 4, 8)):
        if M == 1 and reduce == "microbatch":
          continue  # one microbatch: the same program
        flags = [*mesh_flags, f"--config.train.microbatches={M}",
                 f"--config.train.grad_reduce={reduce}"]
        print(f"{mesh:8s} M={M} {reduce:10s} {describe(compile_row(flags))}", flush=True)


if __name__ == "__main__":
  main(sys.argv[1:])
