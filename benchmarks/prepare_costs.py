"""``chinchax prepare`` costs: wall time, peak disk, peak RSS, start-up on an existing store.

  python benchmarks/prepare_costs.py [--mb 300] [--big-doc-mb 32] [--workers 2]
                                     [--code DIR] [--keep]

Generates a ``--mb`` MB corpus of ``.txt`` documents (``loader_throughput.make_corpus``), then in
a fresh subprocess builds its bytes-tokenizer store (``builder.build``, ``--workers``
processes) while this process samples the size of the store root every 20 ms (peak disk:
shards, partial store and store together); the subprocess reports its wall time, the
manifest's phase times and its peak RSS (``ru_maxrss`` of itself and of its worker
processes). A second subprocess (three times, median) then starts on the existing store (scan + lookup: the
start-up of every later ``prepare`` / ``train``). Last, with ``--big-doc-mb``, a store of one
document of that size is built with a byte-level BPE tokenizer.json (1,000 ids, trained
here on 2 MB of the same text; ``tokenizer=hf``, 1 worker): the peak RSS of encoding one huge
document.

``--code DIR`` runs the subprocesses on another checkout's ``chinchax`` package (e.g. one
exported with ``git archive <commit> chinchax | tar -x -C DIR``); given twice (``--code OLD
--code .``) the checkouts take turns at every measurement, for a before/after comparison on
the same corpus under the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

_CHILD = r"""
import json, resource, sys, time
from chinchax.data import builder, sources, tokenizers
corpus, root, tok, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
t = time.perf_counter()
src = sources.FileSource(corpus + "/*.txt")
tokenizer = (tokenizers.ByteTokenizer() if tok == "bytes"
             else tokenizers.HFTokenizer.from_file(tok, name="bpe1000", kind="hf"))
d = builder.build(src, tokenizer, root, 0.01, workers=workers)
wall = time.perf_counter() - t
m = json.loads((d / "manifest.json").read_text())
print(json.dumps({"wall_s": wall, "timings": m["timings"],
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "children_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
                  "store_mb": sum(p.stat().st_size for p in d.rglob("*") if p.is_file()) / 1e6}))
"""


def _du(root: pathlib.Path) -> int:
  """Apparent bytes of every file under ``root`` (``du -sb``; 0 before it exists). A file
  renamed while du walks makes it complain and exit 1, with the total still printed."""
  out = subprocess.run(["du", "-sb", str(root)], capture_output=True, text=True)
  return int(out.stdout.split()[0]) if out.stdout.strip() else 0


def run_build(code: pathlib.Path, corpus, root, tok: str, workers: int) -> dict:
  """One build in a subprocess on ``code``'s chinchax; adds the sampled peak disk (MB)."""
  peak, done = [0], threading.Event()

  def sample():
    while not done.is_set():
      peak[0] = max(peak[0], _du(root))
      time.sleep(0.02)

  th = threading.Thread(target=sample, daemon=True)
  th.start()
  env = dict(os.environ, PYTHONPATH=str(code), JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", _CHILD, str(corpus), str(root), tok, str(workers)],
                       env=env, capture_output=True, text=True, cwd=str(root.parent))
  # (cwd: ``python -c`` puts the working directory first on sys.path, before PYTHONPATH)
  done.set()
  th.join()
  if out.returncode:
    raise RuntimeError(out.stderr[-3000:])
  res = json.loads(out.stdout.strip().splitlines()[-1])
  res["peak_disk_mb"] = peak[0] / 1e6
  return res


def _train_small_bpe(corpus: pathlib.Path, path: pathlib.Path) -> None:
  from chinchax.data import tokenizers
  texts, size = [], 0
  for f in sorted(corpus.glob("*.txt")):
    texts.append(f.read_text())
    size += len(texts[-1])
    if size > 2e6:
      break
  path.write_text(tokenizers.train_bpe(texts, 1000).to_json())


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--mb", type=float, default=300, help="corpus MB (bytes tokenizer)")
  ap.add_argument("--big-doc-mb", type=float, default=32, help="the one-document BPE build (0: skip)")
  ap.add_argument("--workers", type=int, default=2)
  ap.add_argument("--code", action="append", default=[],
                  help="checkout whose chinchax package builds (repeatable: the checkouts take "
                       "turns at every measurement; default this repository)")
  ap.add_argument("--keep", action="store_true")
  args = ap.parse_args()
  import loader_throughput
  work = pathlib.Path(tempfile.mkdtemp(prefix="chinchax-prepare-bench-"))
  codes = [pathlib.Path(c).resolve() for c in args.code] or [REPO]
  try:
    n = loader_throughput.make_corpus(work / "corpus", args.mb)
    print(f"corpus {n / 1e6:.0f} MB")
    for k, code in enumerate(codes):
      first = run_build(code, work / "corpus", work / f"stores{k}", "bytes", args.workers)
      t = first["timings"]
      print(f"{code}\n  build     wall {first['wall_s']:.1f} s (scan {t['scan_s']:.1f}, tokenize "
            f"{t['tokenize_s']:.1f}, assemble {t['assemble_s']:.1f}); store {first['store_mb']:.0f} "
            f"MB, peak disk {first['peak_disk_mb']:.0f} MB = "
            f"{first['peak_disk_mb'] / first['store_mb']:.2f}x the store; peak RSS "
            f"{first['rss_mb']:.0f} MB (workers {first['children_rss_mb']:.0f} MB)", flush=True)
    starts = {k: [] for k in range(len(codes))}
    for _ in range(3):
      for k, code in enumerate(codes):
        starts[k].append(run_build(code, work / "corpus", work / f"stores{k}", "bytes",
                                   args.workers)["wall_s"])
    for k, code in enumerate(codes):
      s = sorted(starts[k])[1]
      print(f"{code}\n  existing  start-up {s:.3f} s, median of 3 ({s / n * 1e9:.3f} s per GB of "
            f"corpus; source listing + scan + store lookup, after the imports)")
    if args.big_doc_mb:
      big = work / "big"
      size = loader_throughput.make_corpus(big, 0, seed=2, big_doc_mb=args.big_doc_mb)
      tok = work / "bpe1000.json"
      _train_small_bpe(work / "corpus", tok)
      for k, code in enumerate(codes):
        res = run_build(code, big, work / f"big_stores{k}", str(tok), 1)
        print(f"{code}\n  big doc   one {size / 1e6:.1f} MB document, BPE 1000: wall "
              f"{res['wall_s']:.1f} s, peak RSS {res['rss_mb']:.0f} MB", flush=True)
  finally:
    if args.keep:
      print(f"kept {work}")
    else:
      shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
  main()
