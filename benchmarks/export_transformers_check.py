"""Checks `chinchax export` directories with transformers (for those who have it; CI has not).

For each export directory: ``AutoTokenizer`` loads it and gives only input_ids and
attention_mask; its ids equal chinchax's on mixed UTF-8 text (a byte-level export: the
UTF-8 bytes; a BPE/HF export: the ``tokenizers`` encoding with special tokens inside text
kept as text, which is what chinchax computes), so a literal ``<|endoftext|>`` is not EOS;
a text four times the trained seq_len gives no length warning; ``AutoModelForCausalLM``
loads it, ``generate(**tok(text, return_tensors="pt"))`` runs, and its logits match the
float64 numpy forward of ``chinchax.export`` (when chinchax is importable too).

Usage: python benchmarks/export_transformers_check.py EXPORT_DIR [EXPORT_DIR ...]
Needs: transformers, tokenizers, numpy (and torch, safetensors for the model checks).
Exit status 1 if a check fails.
"""

import json
import logging
import pathlib
import sys

import numpy as np

TEXT = ("def f(x):\n\treturn x  # naïve café, Zürich\r\n日本語のテキスト 🦙 \x00\x7f"
        "  end.<|endoftext|>next doc ½ ÿ\u0100")


def _expected_ids(out: pathlib.Path, text: str) -> list[int]:
  info = json.loads((out / "export_info.json").read_text())["tokenizer"]
  if info["kind"] == "bytes":
    return list(text.encode("utf-8"))
  import tokenizers
  tok = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
  tok.encode_special_tokens = True  # chinchax.data.tokenizers.HFTokenizer's setting
  return tok.encode(text, add_special_tokens=False).ids


def check(out: pathlib.Path) -> list[str]:
  """The failed checks of one export directory (empty: all passed)."""
  import transformers
  failed = []
  tok = transformers.AutoTokenizer.from_pretrained(str(out))
  # First: transformers warns about a long text only once per tokenizer.
  seq_len = json.loads((out / "export_info.json").read_text())["trained_seq_len"]
  records = []
  handler = logging.Handler()
  handler.emit = records.append
  transformers.logging.get_logger().addHandler(handler)
  try:
    long_ids = tok("the quick brown fox " * seq_len)["input_ids"]
  finally:
    transformers.logging.get_logger().removeHandler(handler)
  if len(long_ids) <= seq_len or any("longer than" in r.getMessage() for r in records):
    failed.append(f"a {len(long_ids)}-token text warns: {[r.getMessage() for r in records]}")
  enc = tok(TEXT)
  if set(enc) != {"input_ids", "attention_mask"}:
    failed.append(f"tokenizer outputs {sorted(enc)}")
  want = _expected_ids(out, TEXT)
  if enc["input_ids"] != want:
    i = next((i for i, (a, b) in enumerate(zip(enc["input_ids"], want)) if a != b),
             min(len(want), len(enc["input_ids"])))
    failed.append(f"ids differ from chinchax's from position {i}: "
                  f"{enc['input_ids'][i:i + 4]} vs {want[i:i + 4]}")
  if tok.eos_token_id in enc["input_ids"]:
    failed.append("a literal <|endoftext|> in text became EOS")
  if tok.decode(enc["input_ids"]) != TEXT:
    failed.append(f"decode(encode(text)) != text: {tok.decode(enc['input_ids'])!r}")
  try:
    import torch
  except ImportError:
    print(f"  ({out}: torch not installed; the tokenizer alone was checked)")
    return failed
  model = transformers.AutoModelForCausalLM.from_pretrained(str(out), torch_dtype=torch.float32)
  batch = tok("Once upon a time", return_tensors="pt")
  generated = model.generate(**batch, max_new_tokens=8, do_sample=False)
  if generated.shape[1] <= batch["input_ids"].shape[1]:
    failed.append("generate produced no tokens")
  try:
    from chinchax import export as export_lib
    import safetensors.numpy as st
  except ImportError:
    print(f"  ({out}: chinchax not importable here; logits not compared)")
  else:
    ids = np.asarray([want[:32]])
    with torch.no_grad():
      got = model(torch.as_tensor(ids)).logits.double().numpy()
    ref = export_lib.numpy_forward(st.load_file(str(out / "model.safetensors")),
                                   json.loads((out / "config.json").read_text()), ids)
    diff = float(np.abs(got - ref).max())
    print(f"  {out}: max |transformers - numpy forward| logit difference {diff:.3g}")
    if diff > 1e-3:
      failed.append(f"logits differ by {diff:.3g}")
  return failed


def main(argv: list[str]) -> int:
  if not argv:
    print(__doc__)
    return 2
  bad = 0
  for d in argv:
    failed = check(pathlib.Path(d))
    print(f"{d}: " + ("ok" if not failed else "FAILED: " + "; ".join(failed)))
    bad += bool(failed)
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
