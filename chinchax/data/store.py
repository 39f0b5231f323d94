"""Token store on disk: one per (corpus, tokenizer), built once, reused after.

Layout of ``<store_root>/<tokenizer>-<fingerprint[:16]>-val<fraction>/``::

  manifest.json     written last: source, fingerprint, tokenizer, counts, split
  train.zarr/       tensorstore zarr3 uint16 array [n_tokens] (documents + EOS each)
  train_docs.npy    int64 [n_docs] start offset of each document in train.zarr
  val.zarr/, val_docs.npy

The build goes to a temporary sibling directory that is renamed into place
only when complete, so a killed build never leaves a store that looks whole.
Documents go to validation by a hash of their id (stable when files are added).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import pathlib
import shutil
import time

import numpy as np
import tensorstore as ts

from chinchax.data import sources as sources_lib

MANIFEST = "manifest.json"
SPLITS = ("train", "val")
_CHUNK = 1 << 20


def _is_val(doc_id: str, val_fraction: float) -> bool:
  h = int.from_bytes(hashlib.sha256(doc_id.encode("utf-8", "surrogateescape")).digest()[:8], "little")
  return h / 2**64 < val_fraction


def _write_array(path: pathlib.Path, tokens: np.ndarray) -> None:
  spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}
  arr = ts.open(spec, create=True, dtype=ts.uint16, shape=[max(len(tokens), 1)],
                chunk_layout=ts.ChunkLayout(chunk_shape=[min(_CHUNK, max(len(tokens), 1))])).result()
  if len(tokens):
    arr.write(tokens).result()


def store_dir(store_root: str, fp: str, tokenizer, val_fraction: float) -> pathlib.Path:
  """``<store_root>/<tokenizer>-<fingerprint[:16]>-val<fraction>``."""
  return (pathlib.Path(os.path.expanduser(store_root))
          / f"{tokenizer.name}-{fp[:16]}-val{val_fraction:g}")


def build_or_load(source, tokenizer, store_root: str, val_fraction: float) -> pathlib.Path:
  """Returns the directory of the token store for (source, tokenizer), building it if absent.

  Raises:
    DataError: the corpus has no non-empty document.
  """
  fp = sources_lib.fingerprint(source)
  final = store_dir(store_root, fp, tokenizer, val_fraction)
  if (final / MANIFEST).exists():
    return final
  t0 = time.time()
  tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
  shutil.rmtree(tmp, ignore_errors=True)
  tmp.mkdir(parents=True)
  parts = {s: [] for s in SPLITS}
  starts = {s: [] for s in SPLITS}
  offsets = {s: 0 for s in SPLITS}
  n_bytes = {s: 0 for s in SPLITS}
  n_empty = 0
  docs = [(doc_id, data) for doc_id, data in source]
  if not any(len(d) for _, d in docs):
    shutil.rmtree(tmp, ignore_errors=True)
    raise sources_lib.DataError(f"corpus {source.describe()} has no non-empty document")
  val_flags = [_is_val(doc_id, val_fraction) for doc_id, _ in docs]
  if not any(val_flags):  # always hold out at least one document
    val_flags[-1] = True
  if all(val_flags):
    val_flags[0] = False
  eos = np.array([tokenizer.eos_id], dtype=np.uint16)
  for (doc_id, data), is_val in zip(docs, val_flags):
    if not data:
      n_empty += 1
      continue
    split = "val" if is_val else "train"
    ids = tokenizer.encode(data)
    starts[split].append(offsets[split])
    parts[split].extend([ids, eos])
    offsets[split] += len(ids) + 1
    n_bytes[split] += len(data)
  counts = {}
  for split in SPLITS:
    tokens = np.concatenate(parts[split]) if parts[split] else np.zeros(0, np.uint16)
    _write_array(tmp / f"{split}.zarr", tokens)
    np.save(tmp / f"{split}_docs.npy", np.asarray(starts[split], dtype=np.int64))
    counts[split] = {"tokens": int(len(tokens)), "documents": len(starts[split]),
                     "bytes": int(n_bytes[split])}
  manifest = {
      "format": 1,
      "source": source.describe(),
      "fingerprint": fp,
      "tokenizer": tokenizer.describe(),
      "val_fraction": val_fraction,
      "split_rule": "document to val iff sha256(doc_id)[:8] / 2^64 < val_fraction (≥ 1 val doc)",
      "splits": counts,
      "empty_documents_skipped": n_empty,
      "build_seconds": round(time.time() - t0, 3),
  }
  (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
  final.parent.mkdir(parents=True, exist_ok=True)
  try:
    os.rename(tmp, final)
  except OSError:  # another process finished the same store first
    shutil.rmtree(tmp, ignore_errors=True)
    if not (final / MANIFEST).exists():
      raise
  logging.info("built token store %s in %.1fs: %s", final, time.time() - t0, counts)
  return final


class TokenSplit:
  """One split of a store: random-access token reads.

  Small splits (≤ ``max_in_memory`` tokens) are read into memory once; larger
  ones are read window by window from tensorstore.
  """

  def __init__(self, directory: pathlib.Path, split: str, max_in_memory: int = 1 << 28):
    if split not in SPLITS:
      raise ValueError(f"split {split!r} is not one of {SPLITS}")
    self.directory = pathlib.Path(directory)
    self.manifest = json.loads((self.directory / MANIFEST).read_text())
    self.split = split
    counts = self.manifest["splits"][split]
    self.n_tokens = counts["tokens"]
    self.n_bytes = counts["bytes"]
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(self.directory / f"{split}.zarr")}}
    self._ts = ts.open(spec, open=True).result()
    self._mem = None
    if self.n_tokens <= max_in_memory:
      self._mem = np.asarray(self._ts[: self.n_tokens].read().result())

  def read(self, start: int, length: int) -> np.ndarray:
    """Tokens [start, start + length) as uint16 [length]."""
    if self._mem is not None:
      return self._mem[start:start + length]
    return np.asarray(self._ts[start:start + length].read().result())

  def all_tokens(self) -> np.ndarray:
    return self._mem if self._mem is not None else self.read(0, self.n_tokens)


def unigram_entropy_nats(tokens: np.ndarray, vocab_size: int) -> float:
  """Entropy (nats/token) of the empirical unigram distribution of ``tokens`` [n]."""
  counts = np.bincount(np.asarray(tokens, dtype=np.int64), minlength=vocab_size).astype(np.float64)
  p = counts[counts > 0] / counts.sum()
  return float(-(p * np.log(p)).sum())


def bits_per_byte(loss_nats_per_token: float, n_tokens: int, n_bytes: int) -> float:
  """Converts a loss in nats/token into bits per UTF-8 byte of text: loss · tokens / (bytes · ln 2)."""
  return loss_nats_per_token * n_tokens / (n_bytes * math.log(2))
