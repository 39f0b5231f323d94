"""Tokenizers. The default is byte-level: 256 byte values plus an EOS id."""

from __future__ import annotations

import numpy as np


class ByteTokenizer:
  """Each UTF-8 byte is one token (ids 0–255); EOS = 256; vocab_size = 257."""

  name = "bytes"
  vocab_size = 257
  eos_id = 256
  dtype = np.uint16

  def encode(self, data: bytes) -> np.ndarray:
    """Bytes → uint16 ids [len(data)]."""
    return np.frombuffer(data, dtype=np.uint8).astype(np.uint16)

  def decode(self, ids) -> bytes:
    """ids → bytes; EOS and out-of-range ids are dropped."""
    arr = np.asarray(ids)
    return bytes(arr[(arr >= 0) & (arr < 256)].astype(np.uint8).tolist())

  def describe(self) -> dict:
    return {"name": self.name, "vocab_size": self.vocab_size, "eos_id": self.eos_id}


def make_tokenizer(name: str):
  """Returns the tokenizer named by ``config.data.tokenizer``."""
  if name == "bytes":
    return ByteTokenizer()
  raise ValueError(f"unknown tokenizer {name!r}; known: 'bytes'")
