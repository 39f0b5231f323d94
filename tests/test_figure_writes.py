"""A fit's figures on a disk that fills while they are written (a real tmpfs): the figure that
did not fit is absent, never truncated, and no temporary file is left holding space."""

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from analysis.repeat import report  # noqa: E402
from test_disk_full import small_disk  # noqa: E402,F401 — a fixture


def _figure():
  fig, ax = plt.subplots()
  rng = np.random.default_rng(0)
  for k in range(20):  # ~6,000 points: a PNG of ~220 kB, an SVG of ~160 kB
    ax.plot(rng.normal(size=300).cumsum(), lw=0.5)
  return fig


def test_a_figure_that_does_not_fit_is_absent_not_truncated(small_disk):  # noqa: F811
  disk = small_disk("1m")
  fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
  free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
  os.write(fd, b"\0" * (free - 300_000))  # room for the PNG (~220 kB), not the SVG (~160 kB)
  os.close(fd)
  with pytest.raises(OSError):
    report.save_figure(_figure(), str(disk), "frontier")
  names = sorted(p.name for p in disk.iterdir())
  assert "frontier.svg" not in names, names
  assert not [n for n in names if ".tmp-" in n], names
  assert (disk / "frontier.png").read_bytes().endswith(b"IEND\xaeB`\x82")  # whole
