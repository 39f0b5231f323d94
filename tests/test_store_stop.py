"""A token store build with a pool of tokenizer processes, stopped by Ctrl-C, SIGTERM or a full
disk (a real tmpfs): one line, no "leaked semaphore" warning from multiprocessing's resource
tracker, and no half-written shard (``*.npz.tmp-PID``) left holding space."""

import pathlib
import signal
import subprocess
import sys
import time

import pytest

from test_disk_full import small_disk  # noqa: F401 — a fixture
from test_interrupts import REPO, _env


def _prepare(corpus, store_root, *extra):
  return [sys.executable, "-m", "chinchax.cli", "prepare", f"--config={REPO}/configs/train.py:tiny",
          "--config.data.source=files", f"--config.data.paths={corpus}/*.txt",
          f"--config.data.store_root={store_root}", "--config.data.val_fraction=0.1",
          "--config.data.shard_mb=0.02", "--config.data.prepare_workers=2", *extra]


def _tmp_files(root):
  return [p for p in pathlib.Path(root).rglob("*") if ".tmp-" in p.name]


@pytest.fixture(scope="module")
def big_corpus(small_corpus, tmp_path_factory):
  """The small corpus 8 times over (renamed copies): ~5 MB, a few seconds of tokenizing."""
  root = tmp_path_factory.mktemp("big")
  for k in range(8):
    for f in sorted(pathlib.Path(small_corpus).glob("*.txt")):
      (root / f"{k}-{f.name}").write_bytes(f.read_bytes())
  return root


@pytest.mark.parametrize("signum,code,word", [(signal.SIGINT, 130, "interrupted"),
                                              (signal.SIGTERM, 75, "preempted")])
def test_a_stopped_build_is_one_line_and_leaves_no_partial_shard(big_corpus, tmp_path, signum,
                                                                 code, word):
  proc = subprocess.Popen(_prepare(big_corpus, tmp_path), env=_env(), cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 300
  while proc.poll() is None and time.time() < deadline:
    if len(list(tmp_path.glob(".*.partial/shards/*.npz"))) >= 2:  # the pool is at work
      break
    time.sleep(0.01)
  assert proc.poll() is None, proc.communicate()[1][-2000:]
  proc.send_signal(signum)
  _, err = proc.communicate(timeout=120)
  lines = [l for l in err.splitlines() if l.strip() and "tokenize" not in l]
  assert proc.returncode == code, err[-3000:]
  assert len(lines) == 1 and lines[0].startswith(word), err[-3000:]
  assert "leaked" not in err and "Traceback" not in err
  assert not _tmp_files(tmp_path)
  assert list(tmp_path.glob(".*.partial/shards/*.npz"))  # the finished shards are kept


def test_a_build_on_a_full_disk_leaves_no_partial_shard(big_corpus, small_disk):  # noqa: F811
  disk = small_disk("2m")
  r = subprocess.run(_prepare(big_corpus, disk), env=_env(), cwd=REPO, capture_output=True,
                     text=True, timeout=600)
  assert r.returncode == 2, r.stderr[-3000:]
  assert "leaked" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]
  assert [l for l in r.stderr.splitlines() if l.startswith("error: the disk is full")]
  assert not _tmp_files(disk)
