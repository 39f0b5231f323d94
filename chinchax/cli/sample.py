"""``chinchax sample``: text from a run's checkpoint (front end of ``chinchax.sample``).

Continues a prompt with the run's model and its own tokenizer (byte-level, BPE or HF),
decoding over a key/value cache of the run's seq_len positions, and prints the prompt
with its continuation (several samples apart by a line of dashes). Generation stops at
EOS or after --max-new-tokens; prompt tokens + new tokens must fit in seq_len. An empty
prompt starts a new document. --temperature 0 is greedy; otherwise tokens are drawn from
the softmax of logits/T, cut to the --top-k most likely and then to the --top-p most
likely probability mass. A trials run samples its best trial (--trial K another).
A line of timings goes to stderr.

runs/default below is the README's `chinchax train` (bytes of Python source, seq_len 128).

Example:
  chinchax sample runs/default --prompt "def __init__(self" --max-new-tokens 96 --top-p 0.9
"""

from __future__ import annotations

import sys

from chinchax import console
from chinchax.cli import helptext


def _prompt(args) -> str:
  if args.prompt is not None and args.prompt_file:
    raise helptext.UsageError("give --prompt or --prompt-file, not both; see chinchax sample --help")
  if not args.prompt_file:
    return args.prompt or ""
  if args.prompt_file == "-":
    return sys.stdin.read()
  try:
    with open(args.prompt_file, "rb") as f:
      return f.read().decode("utf-8")
  except OSError as e:
    raise helptext.UsageError(f"--prompt-file {args.prompt_file!r} cannot be read: "
                       f"{e.strerror or e}") from None
  except UnicodeDecodeError as e:
    raise helptext.UsageError(f"--prompt-file {args.prompt_file!r} is not UTF-8 text (byte {e.start})") \
        from None


def main(argv: list[str]) -> int:
  """Prints the samples; returns 0 (also for ``--help``).

  Raises:
    UsageError: a flag that cannot be parsed, both --prompt and --prompt-file, an unreadable
      prompt file (one line).
    SampleError, ExportError, TokenizerError: a bad sampling setting, a prompt too long for
      the run's seq_len, no run, checkpoint, trial or tokenizer where the flags say.
  """
  parser = helptext.parser("sample", __doc__)
  parser.add_argument("workdir", metavar="WORKDIR",
                      help="run directory (holds config.json and checkpoints/)")
  parser.add_argument("--prompt", default=None, help="the text to continue (default: none, a "
                      "new document)")
  parser.add_argument("--prompt-file", default="", metavar="FILE",
                      help="read the prompt from a UTF-8 file ('-': standard input)")
  parser.add_argument("--max-new-tokens", type=int, default=None, metavar="N",
                      help="new tokens at most (default: 256, or what seq_len leaves)")
  parser.add_argument("--temperature", type=float, default=0.8,
                      help="softmax temperature, ≥ 0; 0 = greedy")
  parser.add_argument("--top-k", type=int, default=0, help="keep the K most likely tokens; 0 = all")
  parser.add_argument("--top-p", type=float, default=1.0,
                      help="keep the most likely tokens up to this probability, in (0, 1]")
  parser.add_argument("--seed", type=int, default=0, help="seed of the draws")
  parser.add_argument("--num-samples", type=int, default=1, metavar="B",
                      help="continuations of the prompt, drawn as one batch")
  parser.add_argument("--step", type=int, default=None,
                      help="checkpoint step (default: the latest)")
  parser.add_argument("--trial", type=int, default=None,
                      help="of a trials run: the trial to sample (default: its best)")
  parser.add_argument("--tokenizer", default="", metavar="PATH",
                      help="the run's tokenizer.json, where it cannot be found (its sha256 must "
                           "be the run's tokenizer_sha256)")
  parser.add_argument("--no-cache", action="store_true",
                      help="recompute the full forward pass for every token (slow; a check)")
  try:
    args = parser.parse_args(argv)
  except SystemExit as e:  # --help
    return e.code if isinstance(e.code, int) else 0
  from chinchax.sample import run as run_lib  # here: --help imports no JAX (tests/test_imports.py)

  rule = run_lib.strategies.Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
  req = run_lib.Request(prompt="", max_new_tokens=args.max_new_tokens, rule=rule, seed=args.seed,
                        num_samples=args.num_samples, step=args.step, trial=args.trial,
                        tokenizer_path=args.tokenizer, use_cache=not args.no_cache)
  run_lib.check(req)
  req.prompt = _prompt(args)
  result = run_lib.sample(args.workdir, req)
  for i, text in enumerate(result.texts):
    if i:
      console.say("-" * 40)
    console.say(text)
  g = result.generation
  trial = f", trial {result.trial}" if result.trial is not None else ""
  added = f" (with {result.added})" if result.added else ""
  console.say(f"sample: step {result.step}{trial}; {result.prompt_tokens} prompt tokens{added}, "
              f"{g.new_tokens} new in {g.prefill_s + g.decode_s:.3g} s "
              f"({g.tokens_per_s:.4g} tokens/s, {'no cache' if args.no_cache else 'KV cache'}; "
              f"compile {g.compile_s:.3g} s)", stream=sys.stderr)
  return 0
