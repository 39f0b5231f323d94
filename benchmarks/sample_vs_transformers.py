"""`chinchax sample`'s greedy decoding against HF transformers' greedy `generate` on the export.

For each run: exports it (``chinchax.export``, float32) into a temporary directory, loads the
export with ``transformers.AutoModelForCausalLM`` / ``AutoTokenizer``, continues each prompt
greedily with both (``generate(**tok(prompt), do_sample=False, max_new_tokens=N)``: no other
option, so what generate does comes from the export's own generation_config.json — EOS, and a
padded vocabulary's ``suppress_tokens``) and compares the new token ids one by one. Prints one
line per run and prompt; exit status 1 if any differs.

With ``--numpy`` (or where torch or transformers is missing, said so) the reference is greedy
decoding with ``chinchax.export.numpy_forward``, a float64 numpy forward pass of the exported
tensors in HF Llama's conventions, recomputed for every token, on the ids of the export's
tokenizer.json (with the tokens it adds, as AutoTokenizer) and with generation_config.json's
suppress_tokens at -inf, as generate applies them.

Usage: python benchmarks/sample_vs_transformers.py RUN [RUN ...] [--prompt TEXT] [--new-tokens N]
                                                   [--numpy]
Needs: chinchax with safetensors and tokenizers, plus torch and transformers (CI has neither;
run it where they can be installed: pip install torch transformers).
"""

import argparse
import pathlib
import sys
import tempfile

import numpy as np


def _transformers_greedy(out: pathlib.Path, prompt: str, n: int) -> tuple[list[int], str]:
  import torch
  import transformers

  tok = transformers.AutoTokenizer.from_pretrained(str(out))
  hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
  ids = tok(prompt, return_tensors="pt")
  with torch.no_grad():
    gen = hf.generate(**ids, do_sample=False, max_new_tokens=n)
  _transformers_greedy.prompt_ids = ids["input_ids"][0].tolist()
  return (gen[0, ids["input_ids"].shape[1]:].tolist(),
          f"transformers {transformers.__version__}, torch {torch.__version__}")


def _numpy_greedy(out: pathlib.Path, prompt: str, n: int) -> tuple[list[int], str]:
  import json

  import safetensors.numpy as st
  import tokenizers

  from chinchax.export import writer as export

  tok = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
  tok.encode_special_tokens = True  # special tokens inside text are text, as in chinchax
  config = json.loads((out / "config.json").read_text())
  suppress = json.loads((out / "generation_config.json").read_text()).get("suppress_tokens", [])
  tensors = st.load_file(str(out / "model.safetensors"))
  tokens = tok.encode(prompt, add_special_tokens=True).ids
  _numpy_greedy.prompt_ids = tokens
  new = []
  for _ in range(n):
    logits = export.numpy_forward(tensors, config, np.asarray([tokens + new]))[0, -1]
    logits[suppress] = -np.inf
    new.append(int(np.argmax(logits)))
    if new[-1] == config["eos_token_id"]:
      break
  return new, "float64 numpy forward of the export (chinchax.export.numpy_forward)"


def compare(workdir: str, prompts: list[str], n: int, use_numpy: bool) -> list[tuple[bool, str]]:
  """(equal?, a line saying so) for one run and each prompt."""
  from chinchax.export import writer as export
  from chinchax.sample import run as run_lib
  from chinchax.sample import strategies

  out_lines = []
  with tempfile.TemporaryDirectory() as tmp:
    out = export.export(workdir, pathlib.Path(tmp) / "hf")
    for prompt in prompts:
      hf_new, what = (_numpy_greedy if use_numpy else _transformers_greedy)(out, prompt, n)
      req = run_lib.Request(prompt=prompt, max_new_tokens=n, rule=strategies.Sampling(0.0))
      res = run_lib.sample(workdir, req)
      run = export.load_run(workdir)
      tok = run_lib.tokenizer_of(pathlib.Path(workdir).resolve(), run)
      ids = tok.encode_prompt(prompt.encode("utf-8")).tolist()
      theirs = (_numpy_greedy if use_numpy else _transformers_greedy).prompt_ids
      same_ids = ("prompt ids equal" if ids == theirs else
                  f"PROMPT IDS DIFFER: chinchax {ids[:6]}… vs {theirs[:6]}…")
      out_lines.append(_line(workdir, prompt, res.generation.tokens[0].tolist(), hf_new,
                             f"{what}; {same_ids}, first {ids[:3]}", ids == theirs))
  return out_lines


def _line(workdir, prompt, ours, hf_new, what, same_ids=True):
  same = ours == hf_new[:len(ours)] and len(hf_new) == len(ours) and same_ids
  first = next((i for i, (a, b) in enumerate(zip(ours, hf_new)) if a != b), None)
  return same, (f"{workdir} {prompt!r}: {'equal' if same else 'DIFFERENT'} over {len(ours)} "
                f"new tokens ({what})"
                + ("" if same else f"; first difference at new token {first}: chinchax "
                   f"{ours[first:first + 5] if first is not None else ours} vs HF "
                   f"{hf_new[first:first + 5] if first is not None else hf_new}"))


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("runs", nargs="+", metavar="RUN")
  p.add_argument("--prompt", action="append", default=None,
                 help="a prompt (repeat for several; default: six short code prompts)")
  p.add_argument("--new-tokens", type=int, default=16)
  p.add_argument("--numpy", action="store_true",
                 help="compare with a numpy forward of the export instead of transformers")
  args = p.parse_args()
  use_numpy = args.numpy
  if not use_numpy:
    try:
      import torch  # noqa: F401
      import transformers  # noqa: F401
    except ImportError as e:
      print(f"no transformers here ({e}): comparing with the export's numpy forward instead",
            file=sys.stderr)
      use_numpy = True
  ok = True
  prompts = args.prompt or ["def main(", "import os\n", "class A:", " x = 1", "# ", "return "]
  for run in args.runs:
    for same, line in compare(run, prompts, args.new_tokens, use_numpy):
      print(line)
      ok &= same
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
