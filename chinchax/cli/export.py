"""``chinchax export``: a trained run as HF Llama safetensors (front end of ``chinchax.export``)."""

from __future__ import annotations

import argparse

from chinchax import console
from chinchax import export as export_lib


def main(argv: list[str]) -> int:
  """Exports the run; returns 0 (argparse's own usage errors exit 2).

  Raises:
    ExportError, DataError: no run, checkpoint or tokenizer where the flags say,
      an existing ``--out`` without ``--overwrite``, a bad format or dtype.
  """
  parser = argparse.ArgumentParser(prog="chinchax export",
                                   description="Export a trained run as HF Llama safetensors.")
  parser.add_argument("workdir", help="run directory (holds config.json and checkpoints/)")
  parser.add_argument("--format", default="safetensors", help="output format: safetensors")
  parser.add_argument("--out", default="", help="output directory (default WORKDIR/export)")
  parser.add_argument("--step", type=int, default=None, help="checkpoint step (default latest)")
  parser.add_argument("--dtype", default="float32", help="float32 | bfloat16")
  parser.add_argument("--tokenizer", default="", help="tokenizer.json to include")
  parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
  parser.add_argument("--verify", action="store_true",
                      help="check a numpy forward of the export against chinchax's logits")
  try:
    args = parser.parse_args(argv)
  except SystemExit as e:  # --help, or argparse's own usage error (exit 2)
    return e.code if isinstance(e.code, int) else 0
  out = export_lib.export(args.workdir, args.out or None, fmt=args.format, step=args.step,
                          dtype=args.dtype, tokenizer_path=args.tokenizer,
                          overwrite=args.overwrite, verify=args.verify)
  console.say(f"exported {args.workdir} → {out} (HF LlamaForCausalLM, {args.dtype})")
  return 0
