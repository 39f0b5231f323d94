"""``chinchax export``: a trained run as HF Llama safetensors (front end of ``chinchax.export``).

Writes model.safetensors, config.json (an HF LlamaForCausalLM), tokenizer.json and
tokenizer_config.json (the run's tokenizer; for a byte-level run one giving the same
ids) into --out, with the user's umask, loadable with
transformers.AutoModelForCausalLM / AutoTokenizer.from_pretrained(OUT). A literal
"<|endoftext|>" inside text is encoded as text, as in training. --overwrite replaces
only an earlier export, never a run or another directory.

Example:
  chinchax export runs/gutenberg --out runs/gutenberg/hf --dtype bfloat16 --verify
"""

from __future__ import annotations

import os
import shutil
import tempfile

from chinchax import console
from chinchax.storage import paths as paths_lib
from chinchax.cli import helptext


def main(argv: list[str]) -> int:
  """Exports the run; returns 0 (also for ``--help``).

  Raises:
    UsageError: a flag that cannot be parsed (one line).
    ExportError, DataError: no run, checkpoint or tokenizer where the flags say,
      an existing ``--out`` without ``--overwrite``, a bad format or dtype.
  """
  parser = helptext.parser("export", __doc__)
  parser.add_argument("workdir", metavar="WORKDIR",
                      help="run directory (holds config.json and checkpoints/)")
  parser.add_argument("--format", default="safetensors", help="output format: safetensors")
  parser.add_argument("--out", default="", metavar="DIR",
                      help="output directory (default: WORKDIR/export)")
  parser.add_argument("--step", type=int, default=None,
                      help="checkpoint step (default: the latest)")
  parser.add_argument("--dtype", default="float32", help="tensor dtype: float32 | bfloat16")
  parser.add_argument("--trial", type=int, default=None,
                      help="of a trials run: the trial to export (default: its best)")
  parser.add_argument("--tokenizer", default="", metavar="PATH",
                      help="the run's tokenizer.json, where export cannot find it (its sha256 "
                           "must be the run's tokenizer_sha256)")
  parser.add_argument("--overwrite", action="store_true",
                      help="replace --out if it is an earlier export (never anything else)")
  parser.add_argument("--verify", action="store_true",
                      help="check a numpy forward of the export against chinchax's logits")
  try:
    args = parser.parse_args(argv)
  except SystemExit as e:  # --help
    return e.code if isinstance(e.code, int) else 0
  global export_lib
  from chinchax.export import writer as export_lib  # here: --help imports no JAX (tests/test_imports.py)
  if paths_lib.is_url(args.out):
    return _export_to_url(args)
  out = export_lib.export(args.workdir, args.out or None, fmt=args.format, step=args.step,
                          trial=args.trial, dtype=args.dtype, tokenizer_path=args.tokenizer,
                          overwrite=args.overwrite, verify=args.verify)
  console.say(f"exported {args.workdir} → {out} (HF LlamaForCausalLM, {args.dtype})")
  return 0


def _export_to_url(args) -> int:
  """``--out gs://…``: exported into a local temporary directory, then uploaded file by file.

  Raises:
    PathError: the URL cannot be written (checked first), or it holds objects already and
      ``--overwrite`` was not given.
  """
  url = args.out.rstrip("/")
  paths_lib.check_writable_dir(url, "--out")
  target = paths_lib.as_path(url)
  if target.exists() and any(True for _ in target.iterdir()) and not args.overwrite:
    raise paths_lib.PathError(f"--out {url} holds objects already; give --overwrite to replace "
                              f"them, or another --out")
  tmp = tempfile.mkdtemp(prefix="chinchax-export-")
  try:
    local = export_lib.export(args.workdir, os.path.join(tmp, "out"), fmt=args.format,
                              step=args.step, trial=args.trial, dtype=args.dtype,
                              tokenizer_path=args.tokenizer, verify=args.verify)
    paths_lib.upload_dir(local, url)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  console.say(f"exported {args.workdir} → {url} (HF LlamaForCausalLM, {args.dtype})")
  return 0
