"""``chinchax export``: a trained run as HF Llama safetensors (front end of ``chinchax.export``).

Writes model.safetensors, config.json (an HF LlamaForCausalLM), tokenizer.json and
tokenizer_config.json (the run's tokenizer; for a byte-level run one giving the same
ids) into --out, with the user's umask, loadable with
transformers.AutoModelForCausalLM / AutoTokenizer.from_pretrained(OUT). A literal
"<|endoftext|>" inside text is encoded as text, as in training. --overwrite replaces
only an earlier export, never a run or another directory.

--from-hf DIR (no WORKDIR) imports an HF Llama directory as train.init_from=hf:DIR reads it
and exports it again into --out: each tensor bitwise DIR's (checked), the tokenizer and
generation config as an export writes them.

Examples:
  chinchax export runs/gutenberg --out runs/gutenberg/hf --dtype bfloat16 --verify
  chinchax export --from-hf ~/models/llama-hf --out ~/models/llama-chinchax
"""

from __future__ import annotations

from chinchax import console
from chinchax.export.error import ExportError
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
  parser.add_argument("workdir", metavar="WORKDIR", nargs="?", default="",
                      help="run directory (holds config.json and checkpoints/)")
  parser.add_argument("--from-hf", default="", metavar="DIR",
                      help="instead of a run: an HF Llama directory, imported and exported "
                           "unchanged into --out (tensors checked bitwise)")
  parser.add_argument("--format", default="safetensors", help="output format: safetensors")
  parser.add_argument("--out", default="", metavar="DIR",
                      help="output directory (default: WORKDIR/export)")
  parser.add_argument("--step", type=int, default=None,
                      help="checkpoint step (default: the latest)")
  parser.add_argument("--dtype", default=None,
                      help="tensor dtype: float32 | bfloat16 (default: float32); with --from-hf "
                           "each tensor's own dtype by default, float16 too")
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
  if args.from_hf:
    return _convert(args)
  if not args.workdir:
    raise ExportError("the following arguments are required: WORKDIR; see chinchax export "
                      "--help (or convert an HF directory: --from-hf DIR --out OUT)")
  args.dtype = args.dtype or "float32"
  from chinchax.export import writer as export_lib  # here: --help imports no JAX (tests/test_imports.py)
  out = export_lib.export(args.workdir, args.out or None, fmt=args.format, step=args.step,
                          trial=args.trial, dtype=args.dtype, tokenizer_path=args.tokenizer,
                          overwrite=args.overwrite, verify=args.verify)
  console.say(f"exported {args.workdir} → {out} (HF LlamaForCausalLM, {args.dtype})")
  return 0



def _convert(args) -> int:
  """``--from-hf DIR --out OUT``: :func:`chinchax.export.convert.convert`.

  Raises:
    ExportError: a WORKDIR or a run's flag as well, no --out, or a gs:// --out.
  """
  extra = [f for f, v in (("WORKDIR", args.workdir), ("--step", args.step is not None),
                          ("--trial", args.trial is not None), ("--tokenizer", args.tokenizer))
           if v]
  if extra:
    raise ExportError(f"--from-hf {args.from_hf} converts an HF directory; {extra[0]} belongs "
                      f"to exporting a run: give one or the other")
  if not args.out or paths_lib.is_url(args.out):
    raise ExportError(f"--from-hf needs a local --out directory (got {args.out or 'none'}); "
                      f"e.g. --out {args.from_hf.rstrip('/')}-chinchax")
  from chinchax.export import convert  # here: --help imports no JAX (tests/test_imports.py)
  out, n = convert.convert(args.from_hf, args.out, dtype=args.dtype, overwrite=args.overwrite,
                           verify=args.verify)
  console.say(f"converted {args.from_hf} → {out} through chinchax's import and export: {n} "
              f"tensors, each bitwise the source's")
  return 0
