"""Token store on disk: one per (corpus, tokenizer, split rule), built once, reused after.

Layout of ``<store_root>/<tokenizer>-<fingerprint[:16]>-val<fraction>-<key[:8]>/``::

  manifest.json     source, fingerprint, tokenizer (and its sha256), counts,
                    split rule, content hash; its presence marks a complete store
  train.zarr/       tensorstore zarr3 array [n_tokens] of uint16 (vocab ≤ 65,536)
                    or uint32: each document's ids followed by EOS
  train_docs.npy    int64 [n_docs] start offset of each document in train.zarr
  val.zarr/, val_docs.npy
  tokenizer.json    the HF tokenizer (tokenizer=hf or bpe); absent for bytes

``key`` hashes the tokenizer's digest, the invalid-UTF-8 policy and the format
version, so a different tokenizer of the same name never reuses a store.

A store is built by :mod:`chinchax.data.builder` in a hidden sibling
``.<name>.partial/`` directory (resumable shard by shard) and renamed into place
only when complete, so a killed build never leaves a store that looks whole.
A document goes to validation by a hash of its content, so the split is the
same whatever the source kind (files, jsonl, parquet, HF dataset), file order
or tokenizer; bits per byte are therefore comparable across tokenizers.
"""

from __future__ import annotations

import hashlib
import json
import math
import pathlib

import numpy as np
import tensorstore as ts

from chinchax import console
from chinchax.storage import paths as paths_lib
from chinchax.data import reader as reader_lib
from chinchax.data import remote as remote_lib

FORMAT = 2
MANIFEST = "manifest.json"
SPLITS = ("train", "val")
REPLACEMENT = "\ufffd".encode("utf-8")  # U+FFFD, what invalid UTF-8 becomes under "replace"
# Above this share of U+FFFD among a store's text bytes, a warning: binary files read as text, or a
# corpus in another encoding.
REPLACEMENT_WARN_SHARE = 0.01
SPLIT_RULE = ("document to val iff int.from_bytes(sha256(document bytes)[:8], 'little') / 2^64 "
              "< val_fraction; then at least one document in each split")
CHUNK = 1 << 20  # tokens per zarr chunk
_HASH_READ = 1 << 24


def is_val(data: bytes, val_fraction: float) -> bool:
  """Whether a document (its UTF-8 bytes) belongs to the validation split (see ``SPLIT_RULE``)."""
  h = int.from_bytes(hashlib.sha256(data).digest()[:8], "little")
  return h / 2**64 < val_fraction


def store_key(tokenizer, decode_errors: str) -> str:
  """sha256 hex over the format version, the tokenizer's digest and the UTF-8 policy."""
  payload = json.dumps({"format": FORMAT, "tokenizer": tokenizer.digest,
                        "decode_errors": decode_errors}, sort_keys=True)
  return hashlib.sha256(payload.encode()).hexdigest()


def store_dir(store_root: str, fp: str, tokenizer, val_fraction: float,
              decode_errors: str = "replace") -> pathlib.Path:
  """``<store_root>/<tokenizer>-<fingerprint[:16]>-val<fraction>-<key[:8]>``."""
  key = store_key(tokenizer, decode_errors)
  return (paths_lib.as_path(store_root)  # local, or gs:// (chinchax.data.remote)
          / f"{tokenizer.name}-{fp[:16]}-val{val_fraction:g}-{key[:8]}")


def is_complete(directory: pathlib.Path) -> bool:
  """True for a finished store (its manifest exists; partial builds never have one)."""
  return (paths_lib.as_path(directory) / MANIFEST).is_file()


def open_array(path: pathlib.Path, *, dtype=None, n_tokens: int | None = None, context=None):
  """Opens (or, given dtype and n_tokens, creates) a 1-D zarr3 token array.

  ``context``: a tensorstore context (e.g. :func:`chinchax.data.reader.cache_context`)."""
  spec = {"driver": "zarr3", "kvstore": paths_lib.kvstore_spec(path)}
  kw = {} if context is None else {"context": context}
  if dtype is None:  # a complete store never changes: cached chunks need no revalidation
    return ts.open({**spec, "recheck_cached_data": False}, open=True, **kw).result()
  n = max(int(n_tokens), 1)
  return ts.open(spec, create=True, dtype=ts.dtype(np.dtype(dtype).name), shape=[n],
                 chunk_layout=ts.ChunkLayout(chunk_shape=[min(CHUNK, n)]), **kw).result()


def hash_parts(dtype, splits: dict) -> str:
  """The store's content hash from per-split parts.

  Args:
    dtype: token dtype (uint16 / uint32).
    splits: {split: (n_tokens, sha256 hex of the little-endian token bytes,
      sha256 hex of the int64 little-endian document starts)}.
  Returns:
    sha256 hex digest; equal for stores with equal tokens and documents
    whatever the source kind, worker count, shard size or interruptions.
  """
  h = hashlib.sha256(f"chinchax token store v{FORMAT} {np.dtype(dtype).name}".encode())
  for split in SPLITS:
    n, tokens_hex, starts_hex = splits[split]
    h.update(f"|{split}|{n}|{tokens_hex}|{starts_hex}".encode())
  return h.hexdigest()


def content_hash(directory: pathlib.Path) -> str:
  """Recomputes the content hash of a complete store from its arrays (reads every token)."""
  directory = paths_lib.as_path(directory)
  manifest = json.loads((directory / MANIFEST).read_text())
  dtype = np.dtype(manifest["dtype"]).newbyteorder("<")
  parts = {}
  for split in SPLITS:
    n = manifest["splits"][split]["tokens"]
    arr = open_array(directory / f"{split}.zarr")
    h = hashlib.sha256()
    for start in range(0, n, _HASH_READ):
      h.update(np.asarray(arr[start:min(n, start + _HASH_READ)].read().result()).astype(dtype).tobytes())
    starts = remote_lib.load_npy(directory / f"{split}_docs.npy").astype("<i8")
    parts[split] = (n, h.hexdigest(), hashlib.sha256(starts.tobytes()).hexdigest())
  return hash_parts(dtype, parts)


class TokenSplit:
  """One split of a store: random-access token reads, one window or a batch of them.

  Args:
    directory: the store (local or gs://).
    split: "train" | "val".
    max_in_memory: with ``reader="auto"``, a split of at most this many tokens
      that cannot be memory-mapped is read into this process's RAM once.
    reader: how windows are read (:mod:`chinchax.data.reader`): ``auto`` =
      ``mmap`` for a local store (raw chunk files, page cache shared by the
      host's processes), else ``memory`` up to ``max_in_memory`` tokens (read
      once, as byte ranges of the tokens alone where the chunks are raw: not
      the padding of the last chunk, and no chunk cache kept), else
      ``ranged`` (byte ranges of the raw chunk objects: a gs:// store), else
      ``tensorstore``; or one of those by name (``memory`` for any size: the
      whole split in RAM).
    cache_mb: MB of tensorstore chunk cache (``tensorstore`` reader).
  Raises:
    ValueError: an unknown split or reader name.
  """

  def __init__(self, directory: pathlib.Path, split: str, max_in_memory: int = 1 << 28,
               reader: str = "auto", cache_mb: float = 256.0):
    if split not in SPLITS:
      raise ValueError(f"split {split!r} is not one of {SPLITS}")
    if reader not in reader_lib.READERS:
      raise ValueError(f"reader {reader!r} is not one of {reader_lib.READERS}")
    self.directory = paths_lib.as_path(directory)
    self.manifest = json.loads((self.directory / MANIFEST).read_text())
    self.split = split
    counts = self.manifest["splits"][split]
    self.n_tokens = counts["tokens"]
    self.n_bytes = counts["bytes"]
    path = self.directory / f"{split}.zarr"
    chosen = None
    if reader in ("auto", "mmap"):
      chosen = reader_lib.ChunkFileReader.open(path)
      if chosen is None and reader == "mmap":
        raise ValueError(f"{path} cannot be memory-mapped (a gs:// store, or chunks that are "
                         f"not raw bytes); use reader 'auto', 'memory', 'ranged' or 'tensorstore'")
    held = reader == "memory" or (reader == "auto" and self.n_tokens <= max_in_memory)
    if chosen is None and (reader == "ranged" or (reader == "auto" and not held)):
      chosen = reader_lib.RangeReader.open(path)
      if chosen is None and reader == "ranged":
        raise ValueError(f"{path} does not hold raw chunks for ranged reads; use reader "
                         f"'auto', 'memory' or 'tensorstore'")
    if chosen is None and held:  # raw chunks: read once as byte ranges of the tokens alone
      ranged = reader_lib.RangeReader.open(path)
      if ranged is not None:
        chosen = reader_lib.MemoryReader(ranged.read_all())
    if chosen is None:  # a held split keeps no chunk cache: its tokens are already in RAM
      cache_bytes = 0 if held else int(cache_mb * 2**20)
      self._ts = open_array(path, context=reader_lib.cache_context(cache_bytes))
      if held:
        chosen = reader_lib.MemoryReader(np.asarray(self._ts[: self.n_tokens].read().result()))
      else:
        chosen = reader_lib.TensorstoreReader(self._ts)
    self.reader = chosen
    self._mem = chosen.tokens if chosen.kind == "memory" else None

  @property
  def bytes_per_token(self) -> float:
    """Mean UTF-8 bytes of text per token over the split (EOS tokens counted, 0 bytes each)."""
    return self.n_bytes / self.n_tokens if self.n_tokens else float("nan")

  def read(self, start: int, length: int) -> np.ndarray:
    """Tokens [start, start + length) as uint16 / uint32 [length]."""
    return self.reader.read(start, length)

  def read_windows(self, starts, length: int) -> np.ndarray:
    """Tokens [s, s + length) for each s of ``starts`` (int [n]): uint16 / uint32 [n, length].

    All windows of the call are read at once (see :mod:`chinchax.data.reader`);
    the values equal ``read(s, length)`` row by row."""
    return self.reader.read_windows(starts, length)

  def all_tokens(self) -> np.ndarray:
    return self._mem if self._mem is not None else self.read(0, self.n_tokens)


def unigram_entropy_nats(tokens: np.ndarray, vocab_size: int) -> float:
  """Entropy (nats/token) of the empirical unigram distribution of ``tokens`` [n]."""
  counts = np.bincount(np.asarray(tokens, dtype=np.int64), minlength=vocab_size).astype(np.float64)
  p = counts[counts > 0] / counts.sum()
  return float(-(p * np.log(p)).sum())


def bits_per_byte(loss_nats_per_token: float, n_tokens: int, n_bytes: int) -> float:
  """Converts a loss in nats/token into bits per UTF-8 byte of text: loss · tokens / (bytes · ln 2).

  With (n_tokens, n_bytes) of the split the loss was measured on, this is
  comparable across tokenizers: the same documents, the same bytes.
  """
  return loss_nats_per_token * n_tokens / (n_bytes * math.log(2))


def replacement_share(manifest: dict) -> float:
  """Share of a store's text bytes that are U+FFFD (3 bytes each); NaN for a store built
  before the count was kept."""
  if "replacement_chars" not in manifest:
    return float("nan")
  text_bytes = sum(manifest["splits"][s]["bytes"] for s in SPLITS)
  return 3 * manifest["replacement_chars"] / max(text_bytes, 1)


def warn_replacement_share(directory: pathlib.Path) -> None:
  """Warns when more than :data:`REPLACEMENT_WARN_SHARE` of the store's text is U+FFFD."""
  m = json.loads((paths_lib.as_path(directory) / MANIFEST).read_text())
  share = replacement_share(m)
  if share > REPLACEMENT_WARN_SHARE:
    console.warn(f"{100 * share:.1f}% of the text in store {directory} is U+FFFD replacement "
                 f"characters ({m['documents']['invalid_utf8_replaced']:,} documents had invalid "
                 f"UTF-8): binary files, or text in another encoding? data.decode_errors='skip' "
                 f"drops such documents")
