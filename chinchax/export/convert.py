"""An HF Llama directory imported and exported unchanged: ``chinchax export --from-hf DIR --out OUT``.

One command for a conversion (an HF checkpoint rewritten as chinchax exports it: its files,
its tokenizer and generation config) and for a check that chinchax's import is exact. It
runs the two paths a run takes, not a copy: DIR is checked and read as
``train.init_from=hf:DIR`` reads it (:func:`chinchax.export.hf_source.open_source`, then
:func:`chinchax.export.hf_load.load_params` onto one device, float32), and the parameters are
written as ``chinchax export`` writes a run's (:func:`chinchax.export.writer.to_llama`, the
same table), each tensor in the dtype it had in DIR (float32, bfloat16 or float16, narrowed
back exactly; ``--dtype`` to choose one). Every written tensor is then compared with DIR's,
bitwise; a difference is an error and nothing is written.

The tokenizer is the one a run started from DIR would use (DIR's tokenizer.json, its EOS from
tokenizer_config.json; without one the byte tokenizer), written as an export writes it; a
padded vocabulary is handled as in any export (:mod:`chinchax.export.generation`).
"""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from chinchax import config as config_lib
from chinchax import console
from chinchax.data import tokenizers as tokenizers_lib
from chinchax.export import generation
from chinchax.export import hf_files
from chinchax.export import hf_load
from chinchax.export import hf_source
from chinchax.export import outdir
from chinchax.export import tokenizer_files
from chinchax.export import writer
from chinchax.export.error import ExportError
from chinchax.model import transformer as model_lib
from chinchax.storage import paths as paths_lib

DTYPES = {"float32": np.float32, "bfloat16": "bfloat16", "float16": np.float16}


def _np_dtype(name: str):
  if name == "bfloat16":
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16)
  return np.dtype(DTYPES[name])


def _source_run(c, directory: pathlib.Path) -> dict:
  """The run-like dict :func:`chinchax.export.writer.model_config` and ``llama_config`` read:
  the imported model knobs, and DIR's max_position_embeddings as the trained seq_len."""
  hf = json.loads((directory / "config.json").read_text())
  model = c.model.to_dict()
  seq_len = int(hf.get("max_position_embeddings") or c.train.seq_len)
  return {"config": {"model": model, "train": {"seq_len": seq_len}}, "model_signature": model}


def _params(src, cfg) -> dict:
  """DIR's tensors as chinchax float32 params (numpy nested dicts), read by the import itself."""
  abstract = nnx.eval_shape(lambda: model_lib.Transformer(cfg, nnx.Rngs(params=0)))
  _, state = nnx.split(abstract, nnx.Param)
  one = NamedSharding(Mesh(np.array(jax.devices()[:1]), ("x",)), P())
  params = hf_load.load_params(src, state, jax.tree.map(lambda _: one, state), cfg.n_layers)
  return jax.tree.map(np.asarray, nnx.to_pure_dict(params))


def _tokenizer(c, src) -> tokenizer_files.ExportTokenizer:
  """The tokenizer a run from DIR uses (:func:`hf_source.configure` set ``c.data``)."""
  if src.tokenizer_path is None:
    return tokenizer_files.byte_tokenizer()
  return tokenizer_files.for_tokenizer(tokenizers_lib.make_tokenizer(c.data),
                                       str(src.tokenizer_path))


def convert(directory, out, *, dtype: str | None = None, overwrite: bool = False,
            verify: bool = False) -> tuple[pathlib.Path, int]:
  """Imports the HF Llama directory and exports it again; returns (out, tensors compared).

  Args:
    directory: the HF directory (config.json, model.safetensors or shards, tokenizer.json).
    out: the output directory (the rules of :func:`chinchax.export.outdir.check_out`; never
      DIR itself or a directory holding it).
    dtype: the tensors' dtype ("float32", "bfloat16", "float16"); None = each tensor's own.
    overwrite: replace ``out`` if it is an earlier export.
    verify: also compare a float64 numpy forward of the written tensors with chinchax's logits.
  Raises:
    HFCheckpointError: DIR is refused by the import (:func:`hf_source.open_source`).
    ExportError: a bad ``dtype`` or ``out``; a written tensor that is not DIR's, bitwise.
  """
  from safetensors import safe_open
  import safetensors.numpy as st

  if dtype is not None and dtype not in DTYPES:
    raise ExportError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
  c = config_lib.base_config()
  c.train.init_from = f"{hf_source.PREFIX}{directory}"
  directory = hf_source.hf_dir(c.train.init_from)
  given = str(out)
  out_path = paths_lib.resolved(given)
  if out_path == directory or out_path in directory.parents:
    raise ExportError(f"--out {given} {'is' if out_path == directory else 'holds'} the HF "
                      f"directory being converted; choose a new or empty directory")
  src = hf_source.open_source(c)
  out = outdir.check_out(out_path, directory, overwrite)
  paths_lib.check_writable_dir(out, "--out")
  run = _source_run(c, directory)
  cfg = writer.model_config(run)
  tok = _tokenizer(c, src)
  source_dtypes = {}
  for path in sorted(set(src.files.values())):
    with safe_open(str(path), framework="numpy") as f:
      source_dtypes.update({n: hf_source.DTYPES[f.get_slice(n).get_dtype()]
                            for n in f.keys() if n in src.shapes})
  params = _params(src, cfg)
  tensors = {name: t.astype(_np_dtype(dtype or source_dtypes[name]))
             for name, t in writer.to_llama(params, cfg).items()}
  compared = _compare(src, tensors)
  kinds = sorted(set(dtype and [dtype] or source_dtypes.values()))
  hf_config = writer.llama_config(cfg, run, tok.eos_id, "/".join(kinds), tok.bos_id)
  gen_config, padded = generation.generation_config(tok, cfg.vocab_size)

  def fill(tmp: pathlib.Path) -> None:
    hf_files.write_hf_files(tmp, tensors, hf_config, gen_config, padded, tok, {
        "converted_from": str(directory), "format": "safetensors",
        "dtype": dtype or "each tensor's own", "bitwise_equal_to_source": compared,
        "trained_seq_len": run["config"]["train"]["seq_len"]})

  outdir.write_atomically(out, fill)
  if padded:
    console.say(f"padded vocabulary: {padded}")
  if verify:
    tokens = (np.arange(2 * 16).reshape(2, 16) * 7919) % cfg.vocab_size
    ref = writer.chinchax_logits(params, cfg, tokens)
    got = writer.numpy_forward(st.load_file(str(out / "model.safetensors")), hf_config, tokens)
    console.say(f"verify: max |numpy(export) - chinchax| logit difference = "
                f"{float(np.abs(got - ref).max()):.3g} over {tokens.size} positions")
  return out, compared


def _compare(src, tensors: dict) -> int:
  """How many of ``tensors`` equal DIR's bitwise (a dtype other than DIR's is compared after
  DIR's is cast the same way); raises ExportError naming the first that does not."""
  from safetensors import safe_open

  for name, t in tensors.items():
    with safe_open(str(src.files[name]), framework="numpy") as f:
      theirs = f.get_tensor(name)
    if theirs.dtype != t.dtype:
      theirs = theirs.astype(np.float32).astype(t.dtype)
    if theirs.shape != t.shape or theirs.tobytes() != t.tobytes():
      raise ExportError(f"tensor {name} read by the import and written again differs from "
                        f"{src.files[name].name}'s; nothing was written")
  return len(tensors)
