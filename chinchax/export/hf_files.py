"""The files of an HF Llama directory, written the same way by ``chinchax export`` (a run) and
``chinchax export --from-hf`` (a conversion): :func:`write_hf_files`."""

from __future__ import annotations

import json
import pathlib

from chinchax.export import llama_table
from chinchax.export import tokenizer_files


def write_hf_files(tmp: pathlib.Path, tensors: dict, hf_config: dict, gen_config: dict, padded,
                   tok, info: dict) -> None:
  """Writes an HF Llama directory's files into ``tmp``: model.safetensors (``tensors``, name →
  array), config.json, generation_config.json, tokenizer.json, tokenizer_config.json and
  export_info.json (``info`` followed by the tokenizer, the vocabulary padding ``padded`` as
  ``generation.generation_config`` describes it, the tensors' shapes and the mapping table).

  Raises:
    OSError: a file cannot be written (a full disk included).
  """
  import safetensors.numpy as st  # the export extra: only an export needs it
  st.save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
  (tmp / "config.json").write_text(json.dumps(hf_config, indent=2))
  (tmp / "generation_config.json").write_text(json.dumps(gen_config, indent=2))
  (tmp / "tokenizer.json").write_text(tok.json_text)
  (tmp / "tokenizer_config.json").write_text(json.dumps(
      tokenizer_files.tokenizer_config(tok.eos_token, tok.bos_token), indent=2))
  info = {**info, "tokenizer": tok.info, "generate": padded or "every row is a tokenizer id",
          "architecture": "LlamaForCausalLM",
          "tensors": {k: list(v.shape) for k, v in tensors.items()}, "mapping": llama_table.mapping()}
  (tmp / "export_info.json").write_text(json.dumps(info, indent=2))
