"""Batched window reads from a token store's zarr3 arrays (:class:`chinchax.data.store.TokenSplit`).

A training batch is B windows of ``seq_len + 1`` tokens at scattered offsets.
Read one at a time through tensorstore, each window costs a whole chunk read
(1M tokens: 2 MB of uint16), so the rate is about 3,500 windows/s whatever
their length. Four readers answer :meth:`read_windows` (all windows of a
batch at once, int [n, length]) instead:

* :class:`MemoryReader` — the split held in this process's RAM.
* :class:`ChunkFileReader` — a *local* array whose chunks are raw bytes (the
  zarr3 ``bytes`` codec alone, the layout every chinchax store has): each
  chunk file is memory-mapped once and a window is a slice of it, so a window
  costs a memory copy, and the page cache is shared by every process of the
  host. Chunks never written (all fill value) read as the fill value.
* :class:`RangeReader` — the same layout on any kvstore (``gs://`` above all):
  each window is one or two byte-range reads of its own bytes, all of a
  batch's reads issued together in one ``ts.Batch``.
* :class:`TensorstoreReader` — any other array: whole chunks through
  tensorstore, all of a batch's window reads issued at once in one
  ``ts.Batch`` (reads of the same chunk coalesced, distinct chunks fetched
  concurrently), through a context with a cache pool (:func:`cache_context`).

Every reader returns exactly the stored tokens, so the batch of a step does not
depend on which one read it.
"""

from __future__ import annotations

import collections
import json
import pathlib
import threading

import numpy as np
import tensorstore as ts

from chinchax.storage import paths as paths_lib

READERS = ("auto", "memory", "mmap", "ranged", "tensorstore")
# Chunk files kept memory-mapped at once by a ChunkFileReader (an LRU; each map is one chunk,
# 2-4 MB of address space, so 4,096 maps stay far below Linux's default vm.max_map_count).
MAX_MAPPED_CHUNKS = 4096


def cache_context(cache_bytes: int) -> ts.Context:
  """A tensorstore context whose chunk cache pool holds up to ``cache_bytes`` bytes (0 = none)."""
  return ts.Context({"cache_pool": {"total_bytes_limit": int(max(cache_bytes, 0))}})


def _check_windows(starts, length: int, n_tokens: int | None = None) -> np.ndarray:
  """``starts`` as int64 [n]; ValueError for a negative length, IndexError for a window that
  leaves an array of ``n_tokens`` tokens (when given)."""
  starts = np.asarray(starts, dtype=np.int64).reshape(-1)
  if length < 0:
    raise ValueError(f"window length {length} is negative")
  if n_tokens is not None and len(starts) and (starts.min() < 0
                                               or starts.max() + length > n_tokens):
    raise IndexError(f"a window of {length} tokens at {starts.min()}..{starts.max()} leaves "
                     f"the array of {n_tokens} tokens")
  return starts


def raw_layout(meta: dict):
  """(chunk, dtype, fill_value, n_tokens, key) of a 1-D zarr3 array whose chunks are raw
  little-endian bytes (the ``bytes`` codec alone), from its ``zarr.json``; None for any other
  layout. ``key`` maps a chunk index to its key under the array (``c/<i>``)."""
  grid = meta.get("chunk_grid", {})
  codecs = meta.get("codecs", [])
  encoding = meta.get("chunk_key_encoding", {"name": "default"})
  shape = meta.get("shape", [])
  if (meta.get("zarr_format") != 3 or len(shape) != 1 or grid.get("name") != "regular"
      or len(codecs) != 1 or codecs[0].get("name") != "bytes"):
    return None
  dtype = np.dtype(meta["data_type"])
  if dtype.itemsize > 1 and codecs[0].get("configuration", {}).get("endian", "little") != "little":
    return None
  sep = encoding.get("configuration", {}).get("separator")
  if encoding.get("name") == "default":
    sep = sep or "/"

    def key(i):
      return f"c{sep}{i}"
  elif encoding.get("name") == "v2":
    key = str
  else:
    return None
  chunk = int(grid["configuration"]["chunk_shape"][0])
  return chunk, dtype.newbyteorder("<"), meta.get("fill_value", 0), int(shape[0]), key


class MemoryReader:
  """Windows sliced from a token array held in memory (``tokens``: [n_tokens])."""

  kind = "memory"

  def __init__(self, tokens: np.ndarray):
    self.tokens = tokens

  def read(self, start: int, length: int) -> np.ndarray:
    """Tokens [start, start + length) (a view of the held array)."""
    return self.tokens[start:start + length]

  def read_windows(self, starts, length: int) -> np.ndarray:
    """Tokens [s, s + length) for every s of ``starts`` [n]: [n, length] in the store's dtype."""
    starts = _check_windows(starts, length)
    out = np.empty((len(starts), length), self.tokens.dtype)
    for j, s in enumerate(starts.tolist()):
      out[j] = self.tokens[s:s + length]
    return out


class ChunkFileReader:
  """Windows read from the memory-mapped raw chunk files of a local zarr3 array.

  Use :meth:`open` (None when the array's layout does not allow it).

  Args:
    path: the array directory (holding ``zarr.json`` and ``c/<i>``).
    chunk: tokens per chunk.
    dtype: the stored (little-endian) dtype.
    fill_value: value of chunks that were never written.
    n_tokens: the array's length.
    key: chunk index → chunk file path relative to ``path``.
  """

  kind = "mmap"

  def __init__(self, path: pathlib.Path, chunk: int, dtype, fill_value, n_tokens: int, key):
    self.path, self.chunk, self.dtype, self.n_tokens = path, chunk, np.dtype(dtype), n_tokens
    self._fill = np.full(chunk, fill_value, self.dtype)
    self._key = key
    self._maps: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
    self._lock = threading.Lock()

  @classmethod
  def open(cls, path) -> "ChunkFileReader | None":
    """The reader of a local 1-D zarr3 array with raw little-endian chunks; None otherwise
    (a gs:// array, compressed or sharded chunks, another key encoding)."""
    if paths_lib.is_url(path):
      return None
    path = pathlib.Path(path)
    try:
      layout = raw_layout(json.loads((path / "zarr.json").read_text()))
    except (OSError, ValueError):
      return None
    return None if layout is None else cls(path, *layout)

  def _chunk(self, i: int) -> np.ndarray:
    with self._lock:
      m = self._maps.get(i)
      if m is not None:
        self._maps.move_to_end(i)
        return m
      f = self.path / self._key(i)
      if not f.exists():
        m = self._fill
      else:
        m = np.memmap(f, dtype=self.dtype, mode="r")
        if len(m) != self.chunk:
          raise OSError(f"chunk file {f} holds {len(m)} tokens, not the array's chunk of "
                        f"{self.chunk}: the store is damaged")
      self._maps[i] = m
      if len(self._maps) > MAX_MAPPED_CHUNKS:
        self._maps.popitem(last=False)
      return m

  def _copy(self, out: np.ndarray, start: int) -> None:
    length, c, pos = len(out), self.chunk, 0
    while pos < length:
      i, off = divmod(start + pos, c)
      take = min(length - pos, c - off)
      out[pos:pos + take] = self._chunk(i)[off:off + take]
      pos += take

  def read(self, start: int, length: int) -> np.ndarray:
    """Tokens [start, start + length), clipped to the array's end."""
    length = max(0, min(length, self.n_tokens - start))
    out = np.empty(length, self.dtype)
    self._copy(out, start)
    return out

  def read_windows(self, starts, length: int) -> np.ndarray:
    """Tokens [s, s + length) for every s of ``starts`` [n] (all inside the array): [n, length]."""
    starts = _check_windows(starts, length, self.n_tokens)
    out = np.empty((len(starts), length), self.dtype)
    for j, s in enumerate(starts.tolist()):
      self._copy(out[j], s)
    return out


class RangeReader:
  """Windows read as byte ranges of the raw chunk objects, any kvstore (gs:// above all).

  A window costs one or two ranged reads of its own bytes (not a whole chunk);
  all of a batch's reads are issued together in one ``ts.Batch``. Use :meth:`open`.

  Args:
    kvstore: the opened ``ts.KvStore`` of the array directory (its path ends in "/").
    chunk, dtype, fill_value, n_tokens, key: see :func:`raw_layout`.
  """

  kind = "ranged"

  def __init__(self, kvstore, chunk: int, dtype, fill_value, n_tokens: int, key):
    self.kv, self.chunk, self.dtype, self.n_tokens = kvstore, chunk, np.dtype(dtype), n_tokens
    self.fill, self._key = fill_value, key

  @classmethod
  def open(cls, path) -> "RangeReader | None":
    """The reader of a 1-D zarr3 array of raw chunks at ``path`` (local or gs://); None for
    another layout."""
    spec = paths_lib.kvstore_spec(path)
    spec["path"] = spec["path"].rstrip("/") + "/"
    kv = ts.KvStore.open(spec).result()
    got = kv.read("zarr.json").result()
    if got.state != "value":
      return None
    layout = raw_layout(json.loads(bytes(got.value)))
    return None if layout is None else cls(kv, *layout)

  def read_windows(self, starts, length: int) -> np.ndarray:
    """Tokens [s, s + length) for every s of ``starts`` [n] (all inside the array): [n, length]."""
    starts = _check_windows(starts, length, self.n_tokens)
    out = np.empty((len(starts), length), self.dtype)
    size, c, pieces = self.dtype.itemsize, self.chunk, []
    with ts.Batch() as batch:
      for j, s in enumerate(starts.tolist()):
        pos = 0
        while pos < length:
          i, off = divmod(s + pos, c)
          take = min(length - pos, c - off)
          f = self.kv.read(self._key(i), byte_range=slice(off * size, (off + take) * size),
                           batch=batch)
          pieces.append((j, pos, take, f))
          pos += take
    for j, pos, take, f in pieces:
      r = f.result()
      out[j, pos:pos + take] = (np.frombuffer(r.value, self.dtype) if r.state == "value"
                                else self.fill)
    return out

  def read(self, start: int, length: int) -> np.ndarray:
    """Tokens [start, start + length), clipped to the array's end."""
    length = max(0, min(length, self.n_tokens - start))
    return self.read_windows([start], length)[0] if length else np.zeros(0, self.dtype)

  def read_all(self, group_chunks: int = 32) -> np.ndarray:
    """Every token of the array, [n_tokens]: byte ranges of the tokens alone (not the padding
    of the last chunk), ``group_chunks`` chunk objects read concurrently at a time (the memory
    needed beyond the result is about two such groups)."""
    out = np.empty(self.n_tokens, self.dtype)
    step = self.chunk * max(int(group_chunks), 1)
    for s in range(0, self.n_tokens, step):
      take = min(step, self.n_tokens - s)
      out[s:s + take] = self.read_windows([s], take)[0]
    return out


class TensorstoreReader:
  """Windows read through tensorstore, a batch's reads issued together (``ts.Batch``).

  Args:
    array: the opened tensorstore array (open it with :func:`cache_context` for a cache).
  """

  kind = "tensorstore"

  def __init__(self, array):
    self.array = array

  def read(self, start: int, length: int) -> np.ndarray:
    """Tokens [start, start + length)."""
    return np.asarray(self.array[start:start + length].read().result())

  def read_windows(self, starts, length: int) -> np.ndarray:
    """Tokens [s, s + length) for every s of ``starts`` [n]: [n, length], read concurrently."""
    starts = _check_windows(starts, length)
    out = np.empty((len(starts), length), self.array.dtype.numpy_dtype)
    with ts.Batch() as batch:
      futures = [self.array[s:s + length].read(batch=batch) for s in starts.tolist()]
    for j, f in enumerate(futures):
      out[j] = f.result()
    return out
