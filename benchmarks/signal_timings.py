"""SIGINT and SIGTERM at fixed moments of a real `chinchax train`'s first seconds: exit status,
lines printed on stderr, delay from the signal to the exit.

Each try starts the `chinchax` console script (the installed command, as a user types it) on
a tiny run whose token store is already built, sends one signal ``t`` seconds after the
command started (its ``execve``) and waits for the exit. Every row must read 130 (SIGINT) or 75 (SIGTERM) with one line.

  python benchmarks/signal_timings.py --until 10 --step 0.2 --tries 3 --out signal_table.md

On a loaded host the grid is long (every try lasts t + its delay); ``--step`` and ``--tries``
trim it. Prints a markdown table (one row per moment, both signals) and a verdict line.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
EXPECTED = {signal.SIGINT: 130, signal.SIGTERM: 75}


def chinchax_command() -> str:
  """The installed console script next to this interpreter (else the one on PATH)."""
  here = pathlib.Path(sys.executable).parent / "chinchax"
  return str(here) if here.exists() else shutil.which("chinchax")


def train_cmd(root: pathlib.Path, workdir: pathlib.Path, steps: int = 5000) -> list[str]:
  """A tiny run over ``root/corpus`` with its store under ``root/stores``."""
  return [chinchax_command(), "train", f"--config={REPO}/configs/train.py:tiny",
          f"--config.workdir={workdir}", "--config.data.source=files",
          f"--config.data.paths={root}/corpus/*.txt", f"--config.data.store_root={root}/stores",
          "--config.data.val_fraction=0.1", f"--config.budget.steps={steps}",
          "--config.train.checkpoint_every=5", "--config.train.log_every=5",
          "--config.train.eval_every=100000", "--config.train.peak_flops_per_device=1e9",
          "--config.train.progress=False"]


def env() -> dict:
  return dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")


def make_corpus(root: pathlib.Path) -> None:
  """~0.6 MB of real text (60 standard-library modules) and its token store (one full run)."""
  corpus = root / "corpus"
  corpus.mkdir(parents=True, exist_ok=True)
  stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
  for f in sorted(f for f in stdlib.glob("*.py") if f.stat().st_size > 4000)[:60]:
    (corpus / (f.stem + ".txt")).write_bytes(f.read_bytes())
  subprocess.run(train_cmd(root, root / "warm", steps=2), env=env(), check=True,
                 capture_output=True)


def exec_time(proc) -> float:
  """The moment ``proc`` runs the command (``execve`` done; a signal between ``fork`` and
  ``execve`` would reach the forked copy of this script, not the command)."""
  cmdline = pathlib.Path(f"/proc/{proc.pid}/cmdline")
  while proc.poll() is None:
    try:
      if b"chinchax" in cmdline.read_bytes():
        break
    except OSError:
      break
    time.sleep(0.001)
  return time.monotonic()


def one_try(cmd: list[str], at_s: float, signum: int, timeout_s: float = 120.0) -> dict:
  """Starts ``cmd``, sends ``signum`` ``at_s`` seconds later; exit status, stderr lines, delay."""
  with tempfile.TemporaryFile() as err:
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.DEVNULL, stderr=err, cwd=REPO)
    start = exec_time(proc)
    time.sleep(max(0.0, at_s - (time.monotonic() - start)))
    sent = time.monotonic()
    if proc.poll() is None:
      proc.send_signal(signum)
    try:
      code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      proc.kill()
      code = f"hung>{timeout_s:g}s"
    delay = time.monotonic() - sent
    err.seek(0)
    lines = [l for l in err.read().decode(errors="replace").splitlines() if l.strip()]
  return {"code": code, "lines": lines, "delay": delay}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--until", type=float, default=10.0)
  p.add_argument("--step", type=float, default=0.2)
  p.add_argument("--start", type=float, default=0.2)
  p.add_argument("--tries", type=int, default=3)
  p.add_argument("--out", default="")
  p.add_argument("--root", default="", help="a directory with corpus/ and stores/ (made if empty)")
  args = p.parse_args(argv)
  root = pathlib.Path(args.root or tempfile.mkdtemp(prefix="chinchax-signals-"))
  if not (root / "stores").exists():
    make_corpus(root)
  moments = [round(args.start + i * args.step, 3)
             for i in range(int(round((args.until - args.start) / args.step)) + 1)]
  rows, bad = [], []
  header = ("| t (s) | SIGINT exit | SIGINT lines | SIGINT delay s (median, max) | SIGTERM exit "
            "| SIGTERM lines | SIGTERM delay s (median, max) |")
  print(header + "\n|" + "---|" * 7, flush=True)
  n = 0
  for t in moments:
    cells = [f"{t:.1f}"]
    for signum in (signal.SIGINT, signal.SIGTERM):
      results = []
      for k in range(args.tries):
        n += 1
        wd = root / "runs" / f"{n}"
        results.append(one_try(train_cmd(root, wd), t, signum))
        shutil.rmtree(wd, ignore_errors=True)
      codes = sorted({str(r["code"]) for r in results})
      counts = sorted({len(r["lines"]) for r in results})
      delays = [r["delay"] for r in results]
      cells += ["/".join(codes), "/".join(map(str, counts)),
                f"{statistics.median(delays):.2f}, {max(delays):.2f}"]
      for r in results:
        if r["code"] != EXPECTED[signum] or len(r["lines"]) != 1:
          bad.append(f"t={t:.1f} {signal.Signals(signum).name}: exit {r['code']}, "
                     f"lines {r['lines'][:6]}")
    row = "| " + " | ".join(cells) + " |"
    rows.append(row)
    print(row, flush=True)
  verdict = (f"{n} tries: every one exited 130 (SIGINT) or 75 (SIGTERM) with one line" if not bad
             else f"{len(bad)} of {n} tries departed:\n" + "\n".join(bad))
  print(verdict)
  if args.out:
    pathlib.Path(args.out).write_text("\n".join([header, "|" + "---|" * 7, *rows, "", verdict])
                                      + "\n")
  return 0 if not bad else 1


if __name__ == "__main__":
  sys.exit(main())
