"""Runs every `chinchax ...` command of README.md, then of docs/*.md, in page order, as a new
user would on a fresh clone, and counts how many ran, passed, failed and were skipped.

Usage (in a fresh clone, with chinchax installed from it):
    git clone /path/to/chinchax /tmp/docsrun && cd /tmp/docsrun
    pip install --no-deps -e .
    python benchmarks/docs_commands.py [--timeout 300] [--long] [--also 'chinchax train']
                                       [--page sample.md] [--json OUT]

Which commands: each line of a fenced or indented code block that starts with `chinchax `
(continuation lines joined) and each inline `chinchax ...` span that is a whole command (it
has arguments and no placeholder such as WORKDIR, NAME, <verb> or ...). A command is run once,
at its first mention; a bare verb (`chinchax fit`) is a reference, not a command, except
`chinchax train`, `chinchax ladder` and `chinchax bench`, which run as written. Each runs in
the clone's root under ``nice -n 10`` with the per-command ``--timeout`` (seconds); a
`--write-config` that leaves a file git would show as new or changed fails (examples write
outside the tracked tree, e.g. under runs/).

Skipped, with the reason printed: a synopsis (optional flags in brackets), a command that needs
what a fresh clone on this host lacks (the Gutenberg corpus under ../shared, a gs:// bucket, an
HF model or dataset, a GPU or TPU to train on), and, without ``--long``, a command that trains a
whole ladder, a full run, a bench sweep or compiles a 125M model for a TPU (minutes to hours on
a 2-core host); a command that reads a file written by a skipped command is skipped too.

Exit status: 1 when any command that ran failed.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import time

PLACEHOLDER = re.compile(r"^(\.\.\.|<.*>|\[.*)$|(^|/)[A-Z][A-Z0-9_]{2,}(/|$)|^[A-Z]$")
# Commands a page shows being refused: (exit status, a phrase of the one error line it prints).
REFUSALS = {"chinchax plan --flops 1e5": (2, "give --flops 5.7e+09 or more")}
# Verbs whose first argument is a file or directory: an inline span without one names a flag.
POSITIONAL = {"fit", "export", "sample"}
RUN_BARE = {"train", "ladder", "bench"}
# Flags whose value is a file a command writes, and flags whose value a command reads.
WRITES = ("--write-config", "--out")
READS = ("--law", "--step-time-model", "--config")


def commands(text: str) -> list[tuple[str, bool]]:
  """The page's `chinchax ...` commands, in order, each with whether it was an inline span
  (see the module docstring)."""
  out, in_block, held = [], False, ""
  for line in text.splitlines():
    if line.strip().startswith("```"):
      in_block, held = not in_block, ""
      continue
    indented = line.startswith("    ") and (held or line.strip().startswith("chinchax "))
    if in_block or indented:
      line = held + line.strip()
      if line.endswith("\\"):
        held = line[:-1].rstrip() + " "
        continue
      held = ""
      if line.startswith("chinchax "):
        out.append((line, False))
    else:
      held = ""
      for span in re.findall(r"`([^`]+)`", line):
        words = span.split()
        if span.startswith("chinchax ") and (len(words) > 2 or words[1] in RUN_BARE):
          out.append((span, True))
  return out


def words(command: str) -> list[str]:
  return shlex.split(command, comments=True)


def value(ws: list[str], flag: str) -> str | None:
  for i, w in enumerate(ws):
    if w == flag and i + 1 < len(ws):
      return ws[i + 1]
    if w.startswith(flag + "="):
      return w.split("=", 1)[1]
  return None


def skip_reason(ws: list[str], long: bool, missing: dict[str, str],
                inline: bool = False) -> str | None:
  """Why a command is not run here, or None."""
  text = " ".join(ws)
  if any(PLACEHOLDER.search(w) for w in ws[1:]) or "[" in text:
    return "a synopsis (placeholders or optional flags in brackets)"
  if inline and ws[1] in POSITIONAL and (len(ws) < 3 or ws[2].startswith("-")):
    return "an inline mention of a flag, not a whole command"
  if ws[1] == "fit" and len(ws) > 2 and not ws[2].startswith("-"):
    table = ws[2]
    if table in missing:
      return f"reads {table}, written by a skipped command ({missing[table]})"
    if not pathlib.Path(table).exists():
      return f"reads {table}, which no earlier command wrote (a table of your own)"
  if "../shared/corpora" in text or ":gutenberg" in text or "runs/gutenberg" in text:
    return "needs the Gutenberg corpus (../shared/corpora), absent from this clone"
  if "gs://" in text:
    return "needs a gs:// bucket"
  if "~/models" in text or "hf_name=path/or" in text or "data/*.parquet" in text:
    return "needs an HF model, dataset or parquet files of your own"
  if "--config.ladder.worker=True" in text:
    return "one worker of many machines"
  for flag in READS:
    v = value(ws, flag)
    if v is not None:
      path = v.split(":")[0]
      if path in missing:
        return f"reads {path}, written by a skipped command ({missing[path]})"
      if flag != "--config" and path.endswith(".json") and not pathlib.Path(path).exists():
        return f"reads {path}, which no earlier command wrote"
  for w in ws[2:3]:
    if w.startswith("runs/") and not pathlib.Path(w.split(":")[0]).exists():
      parent = next((m for m in missing if w.startswith(m)), None)
      return (f"reads {w}, written by a skipped command ({missing[parent]})" if parent else
              f"reads {w}, which no earlier command wrote")
  verb = ws[1]
  if verb == "train" and (value(ws, "--config") or "").endswith("planned.py"):
    return "trains the plan written above for a TPU pod (v5p-128, 4e9 parameters)"
  if long or "--help" in ws or "-h" in ws:
    return None
  if verb == "ladder" and "--dry-run" not in ws and "--config.ladder.status=True" not in ws:
    return "long: a whole ladder (--long runs it)"
  if verb == "train" and not (value(ws, "--config") or "").endswith(":tiny"):
    return "long: a full training run (--long runs it)"
  if verb == "bench":
    return "long: a bench sweep (--long runs it)"
  if verb == "compile":
    return "long: a TPU/GPU compile of a 125M model or a ladder (--long runs it)"
  if "--aot" in ws:
    return "long: compiles the plan for its hardware (--long runs it)"
  return None


def produces(ws: list[str]) -> list[str]:
  """Paths a command would write (so that a skipped one's readers are skipped too)."""
  out = [v for f in WRITES if (v := value(ws, f)) is not None]
  wd = value(ws, "--config.workdir")
  if ws[1] == "train":
    out.append(wd or "runs/default")
  if ws[1] == "ladder":
    base = wd or "runs/ladder"
    out += [base, f"{base}/results.jsonl", f"{base}/fit", f"{base}/fit/fit.json"]
  if ws[1] == "bench":
    out += ["runs/bench", "runs/bench/step_time.json"]
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--timeout", type=float, default=300.0, help="seconds per command")
  ap.add_argument("--long", action="store_true", help="run the long commands too")
  ap.add_argument("--also", action="append", default=[], metavar="COMMAND",
                  help="run this long command too (its exact text, e.g. 'chinchax train')")
  ap.add_argument("--page", action="append", default=[], help="only these pages (file names)")
  ap.add_argument("--json", default="", help="write the results here")
  args = ap.parse_args(argv)
  root = pathlib.Path.cwd()
  pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
  if args.page:
    pages = [p for p in pages if p.name in args.page]
  # The `chinchax` of this interpreter's environment (its console script), else its module.
  script = pathlib.Path(sys.executable).with_name("chinchax")
  program = ([str(script)] if script.exists() else
             [shutil.which("chinchax")] if shutil.which("chinchax") else
             [sys.executable, "-m", "chinchax.cli"])
  seen, missing, results = set(), {}, []
  for page in pages:
    for command, inline in commands(page.read_text()):
      ws = words(command)
      key = " ".join(ws)
      if key in seen:
        continue
      seen.add(key)
      reason = skip_reason(ws, args.long or key in args.also, missing, inline)
      where = page.relative_to(root)
      if reason:
        for p in produces(ws):
          missing.setdefault(p, f"{where}: {key[:60]}")
        results.append({"page": str(where), "command": key, "status": "skipped",
                        "reason": reason})
        print(f"SKIP  {where}: {key[:110]}\n      {reason}", flush=True)
        continue
      t0 = time.monotonic()
      try:
        proc = subprocess.run(["nice", "-n", "10", "timeout", "-s", "INT", "-k", "30",
                               str(int(args.timeout)), *program, *ws[1:]], cwd=root,
                              capture_output=True,
                              text=True, env={**os.environ, "COLUMNS": "100"})
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
      except FileNotFoundError as e:
        rc, out, err = 127, "", str(e)
      dt = time.monotonic() - t0
      status = "passed" if rc == 0 else ("timed out" if rc in (124, 130, 137) else "failed")
      if key in REFUSALS:  # shown being refused: one error line, the status and phrase given
        want_rc, phrase = REFUSALS[key]
        lines = err.strip().splitlines()
        status = ("passed" if rc == want_rc and len(lines) == 1 and phrase in lines[0]
                  else "failed")
      elif inline and rc == 2 and "expected one argument" in err:
        for p in produces(ws):
          missing.setdefault(p, f"{where}: {key[:60]}")
        results.append({"page": str(where), "command": key, "status": "skipped",
                        "reason": "an inline mention of a flag, not a whole command"})
        print(f"SKIP  {where}: {key[:110]}\n      an inline mention of a flag", flush=True)
        continue
      written = value(ws, "--write-config")
      if written and subprocess.run(["git", "status", "--porcelain", "--", written],
                                    capture_output=True, text=True, cwd=root).stdout.strip():
        status, err = "failed", f"wrote {written} into the repository's tree\n" + err
      results.append({"page": str(where), "command": key, "status": status, "rc": rc,
                      "seconds": round(dt, 1), "stdout_tail": out[-1500:],
                      "stderr_tail": err[-1500:]})
      print(f"{status.upper():6s}{where}: {key[:110]} ({dt:.1f} s, exit {rc})", flush=True)
      if status != "passed":
        print("      " + "\n      ".join((err.strip() or out.strip()).splitlines()[-6:]),
              flush=True)
  counts = {s: sum(r["status"] == s for r in results)
            for s in ("passed", "failed", "timed out", "skipped")}
  ran = counts["passed"] + counts["failed"] + counts["timed out"]
  print(f"\n{len(results)} commands: {ran} ran, {counts['passed']} passed, "
        f"{counts['failed']} failed, {counts['timed out']} timed out, "
        f"{counts['skipped']} skipped")
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps({"counts": counts, "results": results},
                                                  indent=1))
  return 1 if counts["failed"] or counts["timed out"] else 0


if __name__ == "__main__":
  sys.exit(main())
