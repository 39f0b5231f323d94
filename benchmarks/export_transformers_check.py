"""Checks `chinchax export` directories with transformers (for those who have it; CI has not).

For each export directory: ``AutoTokenizer`` loads it and gives only input_ids and
attention_mask; its ids equal chinchax's on mixed UTF-8 text (a byte-level export: the
UTF-8 bytes; a BPE/HF export: the ``tokenizers`` encoding with special tokens inside text
kept as text, which is what chinchax computes), so a literal ``<|endoftext|>`` is not EOS;
a text four times the trained seq_len gives no length warning; ``AutoModelForCausalLM``
loads it, ``generate(**tok(text, return_tensors="pt"))`` runs, and its logits match the
float64 numpy forward of ``chinchax.export`` (when chinchax is importable too).

The other direction, ``--import-check``: transformers builds a random GQA, untied
``LlamaForCausalLM`` and saves it sharded (``save_pretrained``, safetensors); chinchax imports
it as ``train.init_from=hf:DIR`` does (:mod:`chinchax.export.hf_source`, ``hf_load``) and
its logits must match transformers' on the same tokens.

Usage: python benchmarks/export_transformers_check.py EXPORT_DIR [EXPORT_DIR ...]
       python benchmarks/export_transformers_check.py --import-check
Needs: transformers, tokenizers, numpy (and torch, safetensors for the model checks; torch
and chinchax for --import-check).
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
  return tok.encode(text, add_special_tokens=True).ids  # with the tokens it adds (a BOS), as chinchax


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
  if tok.decode(enc["input_ids"], skip_special_tokens=True) != TEXT:
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
    from chinchax.export import writer as export_lib
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


def check_import() -> list[str]:
  """The failed checks of HF → chinchax on a transformers-saved random Llama (empty: passed)."""
  import tempfile

  import jax
  import torch
  import transformers
  from flax import nnx

  from chinchax import config as config_lib
  from chinchax.export import writer as export_lib
  from chinchax.model import sharding as sharding_lib
  from chinchax.export import hf_load, hf_source
  from chinchax.train import spec as spec_lib
  from chinchax.train import step as step_lib

  torch.manual_seed(0)
  cfg = transformers.LlamaConfig(
      vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=500.0,
      tie_word_embeddings=False, max_position_embeddings=64)
  model = transformers.LlamaForCausalLM(cfg).eval()
  with torch.no_grad():  # larger weights than the init, so attention is far from uniform
    for p in model.parameters():
      p.normal_(0.0, 0.3) if p.ndim > 1 else p.uniform_(0.5, 1.5)
  ids = np.random.default_rng(0).integers(0, 300, size=(2, 24))
  with torch.no_grad():
    want = model(torch.as_tensor(ids)).logits.double().numpy()
  with tempfile.TemporaryDirectory() as d:
    model.save_pretrained(d, safe_serialization=True, max_shard_size="200KB")
    shards = sorted(pathlib.Path(d).glob("*.safetensors"))
    c = config_lib.get_variant("default")
    c.train.init_from = f"hf:{d}"
    src = hf_source.open_source(c)
    spec = spec_lib.resolve(c, 1)
    program = step_lib.build_program(c, spec, sharding_lib.make_mesh(spec.mesh, jax.devices()[:1]))
    params = hf_load.load_params(src, program.abstract_state["params"],
                                 program.shardings["params"], spec.model.n_layers)
    got = export_lib.chinchax_logits(jax.tree.map(np.asarray, nnx.to_pure_dict(params)),
                                     spec.model, ids)
  diff = float(np.abs(got - want).max())
  print(f"  import: {len(shards)} shards; max |chinchax - transformers| logit difference "
        f"{diff:.3g} (logit std {want.std():.3g})")
  return [f"imported logits differ by {diff:.3g}"] if diff > 1e-3 else []


def main(argv: list[str]) -> int:
  if not argv:
    print(__doc__)
    return 2
  if argv == ["--import-check"]:
    failed = check_import()
    print("import: " + ("ok" if not failed else "FAILED: " + "; ".join(failed)))
    return 1 if failed else 0
  bad = 0
  for d in argv:
    failed = check(pathlib.Path(d))
    print(f"{d}: " + ("ok" if not failed else "FAILED: " + "; ".join(failed)))
    bad += bool(failed)
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
