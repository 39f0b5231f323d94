"""Bytes and HTTP requests a training step reads from a gs:// token store, counted on the wire.

  python benchmarks/gcs_bytes_per_step.py [--small-mb 8] [--large-mb 64] [--steps 6]

Starts fake-gcs-server (tests/gcs_server.py) and a counting HTTP proxy in front of it
(tests/gcs_proxy.py: every request forwarded as is, the response body bytes counted after any
chunked framing is undone), points every storage client at the proxy (``STORAGE_EMULATOR_HOST``,
``TENSORSTORE_GCS_HTTP_URL``), builds two bytes-tokenizer stores (uint16 tokens, 1 token per
byte of a generated corpus, ``loader_throughput.make_corpus``) and uploads them. Then, for each
read path, it opens the store's train and val splits as a run does (``chinchax.train.rundata``:
both splits, ``data.store_reader``, ``data.store_cache_mb``) and counts the start-up traffic,
and for B × T = 64 × 1024 and 512 × 1024 it reads ``--steps`` successive steps of
:class:`chinchax.data.pipeline.TrainBatches` (all B rows: one process) and counts the traffic
of each. The payload floor of a step is B × (T + 1) × 2 bytes (its windows' own tokens).

Read paths (``data.store_reader``; ``auto`` picks by the split's size):

* ``auto, small split``: a split of at most 2^28 tokens is read into RAM once at start;
  steps read nothing.
* ``auto, large split``: above 2^28 tokens ``auto`` reads byte ranges (``ranged``). A store
  that large is not built here: the small-size bound is lowered to 0 tokens
  (``TokenSplit(max_in_memory=0)``, a constructor argument, not a config knob), which takes
  exactly the path a larger split takes; ``store_reader=ranged`` is the same reader by name.
* ``tensorstore``: whole 2 MB chunks (1M tokens) through the chunk cache
  (``store_cache_mb``, 256 by default; the ``cache 0`` row has none, as a split far larger
  than the cache behaves once it is warm). ``auto`` never picks it for a chinchax store
  (raw chunks); a foreign, compressed array would get it.

Batches are checked equal, bit for bit, across read paths. The fake server keeps objects on
this machine's disk, so only the counts carry over to a real bucket, not the timings.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import statistics
import sys
import tempfile

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

SHAPES = ((64, 1024), (512, 1024))  # (B, T)


def _rows(small: str, large: str):
  """(name, store, TokenSplit keyword arguments) per read path."""
  return [
      ("auto, small split (memory)", small, {}),
      ("auto, large split (ranged)", large, dict(max_in_memory=0)),
      ("tensorstore, cache 256 MB", large, dict(reader="tensorstore")),
      ("tensorstore, cache 0", large, dict(reader="tensorstore", cache_mb=0)),
  ]


def measure(proxy, store: str, kw: dict, steps: int, reference: dict) -> dict:
  """Counts the start-up traffic of opening ``store``'s splits with ``kw`` and the traffic of
  each of ``steps`` steps per shape. Returns {"startup": Counts, "reader": kind,
  "val": Counts, "n_tokens": int, ..., (B, T): [Counts per step]}; checks each batch against ``reference``
  {(store, B, T, step): batch}, filling it on first sight."""
  from chinchax.data import pipeline
  from chinchax.data import store as store_lib
  before = proxy.snapshot()
  train = store_lib.TokenSplit(store, "train", **kw)
  mid = proxy.snapshot()
  val_kw = {k: v for k, v in kw.items() if k != "max_in_memory"}  # a real run's val split
  val = store_lib.TokenSplit(store, "val", **val_kw)
  out = {"startup": mid.minus(before), "val": proxy.since(mid), "reader": train.reader.kind,
         "n_tokens": train.n_tokens, "val_reader": val.reader.kind, "val_tokens": val.n_tokens}
  for k, (b, t) in enumerate(SHAPES):
    if k:  # a fresh split per shape: each shape starts on a cold cache
      train = store_lib.TokenSplit(store, "train", **kw)
    tb = pipeline.TrainBatches(train, t, b, steps=steps, seed=0)
    per = []
    for step in range(steps):
      before = proxy.snapshot()
      batch = tb.batch(step)
      per.append(proxy.since(before))
      ref = reference.setdefault((store, b, t, step), batch)
      if not np.array_equal(ref, batch):
        raise AssertionError(f"{store} B={b} T={t} step {step}: the batch differs by reader")
    out[(b, t)] = per
  return out


def report(results: dict) -> None:
  """Prints one line per (read path, shape): start-up and per-step bytes and requests."""
  print(f"{'read path':30s} {'reader':>11s} {'split tokens':>13s} {'start-up':>10s} "
        f"{'B x T':>10s} {'floor/step':>11s} {'bytes/step':>11s} {'x floor':>8s} "
        f"{'req/step':>9s} {'step 0':>10s}")
  for name, r in results.items():
    up = r["startup"]
    for b, t in SHAPES:
      per = r[(b, t)]
      floor = b * (t + 1) * 2
      later = per[1:] or per
      mean_bytes = statistics.mean(c.body_bytes for c in later)
      mean_req = statistics.mean(c.requests for c in later)
      print(f"{name:30s} {r['reader']:>11s} {r['n_tokens']:13,d} {up.body_bytes / 1e6:8.2f}MB "
            f"{f'{b}x{t}':>10s} {floor / 1e3:9.1f}kB {mean_bytes / 1e3:9.1f}kB "
            f"{mean_bytes / floor:8.3f} {mean_req:9.1f} {per[0].body_bytes / 1e3:8.1f}kB",
            flush=True)
    v = r["val"]
    print(f"{'':30s} start-up, train split: {up.requests} requests {up.by_kind}; val split "
          f"({r['val_tokens']:,} tokens, {r['val_reader']}): {v.body_bytes / 1e6:.2f} MB in "
          f"{v.requests} requests")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--small-mb", type=float, default=8, help="corpus MB of the small store")
  ap.add_argument("--large-mb", type=float, default=64, help="corpus MB of the 'large' store")
  ap.add_argument("--steps", type=int, default=6, help="steps counted per shape (the mean "
                  "leaves out step 0, shown apart: a cold cache)")
  args = ap.parse_args()
  import gcs_proxy
  import gcs_server
  import loader_throughput
  from chinchax.data import remote
  work = pathlib.Path(tempfile.mkdtemp(prefix="chinchax-gcs-bytes-"))
  server = gcs_server.start(work / "gcs")
  proxy = gcs_proxy.CountingProxy(server.url)
  gcs_server.point_clients_at(proxy.url)
  try:
    stores = {}
    for name, mb, seed in (("small", args.small_mb, 1), ("large", args.large_mb, 2)):
      loader_throughput.make_corpus(work / f"{name}_corpus", mb, seed=seed)
      built = loader_throughput.build_store(work / f"{name}_corpus", work / f"{name}_stores")
      stores[name] = f"gs://{gcs_server.BUCKET}/stores/{name}/{built.name}"
      remote.upload(built, stores[name])
    print(f"fake-gcs-server {server.url}, counted through the proxy at {proxy.url}; "
          f"{args.steps} steps per shape", flush=True)
    results, reference = {}, {}
    for name, which, kw in _rows(stores["small"], stores["large"]):
      results[name] = measure(proxy, which, kw, args.steps, reference)
    report(results)
  finally:
    proxy.close()
    server.proc.kill()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  main()
