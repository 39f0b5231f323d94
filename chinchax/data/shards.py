"""Tokenizing a corpus shard by shard, in this process or a pool of ``workers`` processes.

A shard is a run of consecutive documents of at least ``shard_bytes`` bytes
(boundaries depend only on the documents and the shard size). Each is
repaired (UTF-8 policy), assigned to splits and tokenized in batch, then
written atomically as ``<k>.npz``; shards already on disk are reused, which is
how an interrupted build resumes (``chinchax.data.builder``).
"""

from __future__ import annotations

import collections
import contextlib
import gc
import multiprocessing
import os
import pickle
import signal
import sys
import traceback

import numpy as np

from chinchax import console
from chinchax import errors
from chinchax.data import sources as sources_lib
from chinchax.data import store as store_lib

# Counters of a shard (and of a store's manifest): documents read, empty skipped,
# invalid UTF-8 replaced, invalid UTF-8 skipped.
STATS = ("documents", "empty", "replaced", "skipped")
TMP_INFIX = ".tmp-"  # a shard being written: <shard>.npz.tmp-<pid>, renamed when complete
_worker_tokenizer = None


def default_workers() -> int:
  """Tokenizer processes for ``data.prepare_workers=0``: min(8, CPU count)."""
  return max(1, min(8, os.cpu_count() or 1))


def _init_worker(tokenizer_pickle: bytes) -> None:
  """Pool initializer: one tokenizer per process, single-threaded, Ctrl-C left to the parent."""
  global _worker_tokenizer
  os.environ["TOKENIZERS_PARALLELISM"] = "false"
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  _worker_tokenizer = pickle.loads(tokenizer_pickle)


def tokenize_shard(path: str, docs: list[bytes], val_fraction: float, decode_errors: str,
                   tokenizer=None) -> dict:
  """Repairs, split-assigns and tokenizes one shard; writes ``path`` (npz) atomically.

  The npz holds ``tokens`` [n] (each kept document's ids then EOS, in the
  tokenizer's dtype), ``doc_tokens`` int64 [d] (tokens per kept document, EOS
  included), ``doc_bytes`` int64 [d], ``doc_val`` bool [d] and ``stats`` int64
  [4] (documents read, empty skipped, invalid UTF-8 replaced, skipped) and
  ``replacement_chars`` int64 (U+FFFD characters in the kept text).

  Args:
    path: the shard file to write.
    docs: the shard's documents as read from the source.
    val_fraction: see ``store.is_val``.
    decode_errors: "replace" | "skip".
    tokenizer: the tokenizer; None in a pool worker (uses the process's own).
  Returns:
    the stats as a dict.
  """
  tok = tokenizer if tokenizer is not None else _worker_tokenizer
  stats = dict.fromkeys(STATS, 0)
  stats["documents"] = len(docs)
  kept, val, replacement_chars = [], [], 0
  for data in docs:
    if not data:
      stats["empty"] += 1
      continue
    text, status = sources_lib.normalize(data, decode_errors)
    if text is None:
      stats["skipped"] += 1
      continue
    stats["replaced"] += status == "replaced"
    replacement_chars += text.count(store_lib.REPLACEMENT)
    kept.append(text)
    val.append(store_lib.is_val(text, val_fraction))
  ids = tok.encode_batch(kept) if kept else []
  eos = np.array([tok.eos_id], dtype=tok.dtype)
  pieces = [p for a in ids for p in (a.astype(tok.dtype, copy=False), eos)]
  tokens = np.concatenate(pieces) if pieces else np.zeros(0, tok.dtype)
  tmp = f"{path}{TMP_INFIX}{os.getpid()}"
  try:
    with open(tmp, "wb") as f:
      np.savez(f, tokens=tokens, doc_tokens=np.array([len(a) + 1 for a in ids], np.int64),
               doc_bytes=np.array([len(t) for t in kept], np.int64),
               doc_val=np.array(val, dtype=bool),
               stats=np.array([stats[k] for k in STATS], np.int64),
               replacement_chars=np.int64(replacement_chars))
    os.replace(tmp, path)
  except BaseException:  # a full disk, a stop: the half-written shard holds no space
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise
  return stats


def _release_semaphores(exc: BaseException) -> None:
  """Frees a terminated pool's semaphores now (once nothing refers to the pool): the command
  ends with ``os._exit``, where multiprocessing's resource tracker would otherwise report them
  as "leaked semaphore objects"."""
  traceback.clear_frames(exc.__traceback__)  # the frames that waited on the pool's results
  gc.collect()


def iter_shards(source, shard_bytes: int):
  """Yields (documents, bytes) per shard: consecutive documents, ≥ shard_bytes each but the last."""
  docs, size = [], 0
  for _, data in source:
    docs.append(data)
    size += len(data)
    if size >= shard_bytes:
      yield docs, size
      docs, size = [], 0
  if docs:
    yield docs, size


def tokenize_all(source, tokenizer, info, shard_dir, shard_bytes, val_fraction, decode_errors,
              workers, progress, partial) -> tuple[int, int]:
  """Tokenizes every shard not already on disk; returns (shards in the corpus, reused)."""
  done = {p.name for p in shard_dir.glob("*.npz")}
  bar = console.progress(total=info.bytes, unit="B", unit_scale=True, desc="tokenize",
                         enabled=progress, stream=sys.stderr)
  pool, held, inflight = None, None, collections.deque()
  n_shards = reused = 0

  def run_here(job):
    tokenize_shard(*job[:4], tokenizer=tokenizer)
    bar.update(job[4])

  def wait_oldest():
    result, size = inflight.popleft()
    result.get()
    bar.update(size)

  try:
    for k, (docs, size) in enumerate(iter_shards(source, shard_bytes)):
      n_shards = k + 1
      path = shard_dir / f"{k:06d}.npz"
      if path.name in done:
        reused += 1
        bar.update(size)
        continue
      job = (str(path), docs, val_fraction, decode_errors, size)
      if workers <= 1:
        run_here(job)
        continue
      if pool is None and held is None:  # start processes only once a second shard needs them
        held = job
        continue
      if pool is None:
        ctx = multiprocessing.get_context("spawn")
        pool = ctx.Pool(workers, initializer=_init_worker, initargs=(pickle.dumps(tokenizer),))
        inflight.append((pool.apply_async(tokenize_shard, held[:4]), held[4]))
        held = None
      inflight.append((pool.apply_async(tokenize_shard, job[:4]), size))
      while len(inflight) >= 2 * workers:
        wait_oldest()
    if held is not None:
      run_here(held)
    while inflight:
      wait_oldest()
  except BaseException as e:
    if pool is not None:
      pool.terminate()
      pool.join()
      pool = None
      inflight.clear()
      _release_semaphores(e)
    for tmp in shard_dir.glob(f"*{TMP_INFIX}*"):  # a worker's shard cut short by terminate()
      with contextlib.suppress(OSError):
        tmp.unlink()
    bar.close()
    if isinstance(e, KeyboardInterrupt):
      kept = len(list(shard_dir.glob("*.npz")))
      raise errors.InterruptedWith(f"interrupted: {kept} finished shard(s) kept in {partial}; "
                                   f"rerun the same command to resume") from None
    raise
  if pool is not None:
    pool.close()
    pool.join()
  bar.close()
  return n_shards, reused
