"""Running a block with every loaded OpenBLAS limited to one thread."""

from __future__ import annotations

import contextlib
import ctypes

_BLAS_SYMBOLS = (  # (set, get) pairs of the OpenBLAS builds numpy/scipy ship with.
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
    ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
    ("openblas_set_num_threads", "openblas_get_num_threads"),
)


@contextlib.contextmanager
def single_threaded_blas():
  """Limits every loaded OpenBLAS to one thread inside the block (Linux; else a no-op).

  scipy's L-BFGS-B calls BLAS on 5-element vectors; OpenBLAS threads gain
  nothing there and, on a busy machine, waking them made the 4500-start fit
  about 10x slower.
  """
  restore = []
  try:
    with open("/proc/self/maps") as f:
      paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
  except OSError:
    paths = set()
  for path in sorted(paths):
    try:
      lib = ctypes.CDLL(path)
    except OSError:
      continue
    for set_name, get_name in _BLAS_SYMBOLS:
      setter, getter = getattr(lib, set_name, None), getattr(lib, get_name, None)
      if setter is not None and getter is not None:
        getter.restype = ctypes.c_int
        restore.append((setter, int(getter())))
        setter(ctypes.c_int(1))
        break
  try:
    yield
  finally:
    for setter, n in restore:
      setter(ctypes.c_int(n))
