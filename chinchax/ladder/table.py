"""The ladder's results table, safe under many concurrent writers on local or shared disks.

Each run's row is its own file ``rows/<run_id>.json`` beside ``results.jsonl``,
written to a unique temporary name and renamed into place (``os.replace``:
atomic on POSIX local filesystems and on NFS, where rename is one server
operation). A run has one row file, so a row cannot be duplicated, and a
rewrite (a retried run) replaces it whole.

``results.jsonl`` (one JSON row per line, the table ``chinchax fit`` reads) is
the merge of the row files: a writer reads every row, writes the merge to a
unique temporary file, renames it over ``results.jsonl``, then reads the rows
again and merges once more if they changed meanwhile. The last rename of all
is therefore followed by a read that found nothing new, so the final
``results.jsonl`` holds every row (a writer whose stale merge lands late sees
the newer rows on its check and merges again). No ``flock`` is needed; rows
known by name (the grid's run ids) are opened by name, so a shared
filesystem's cached directory listing cannot hide them.

This module and :mod:`chinchax.storage.atomic` use the standard library only.
"""

from __future__ import annotations

import json
import pathlib
import sys

from chinchax.storage import atomic as files

ROWS_DIR = "rows"
STALE_ROWS_DIR = "stale-rows"  # rows taken out of the table (a validation run of an older fit)


def _read_row(path: pathlib.Path) -> dict | None:
  """A row file's row; None when there is none. A damaged one (truncated: not a JSON row with
  a ``run_id``) is renamed ``<run>.json.damaged`` with one warning, and its run is trained
  again (resuming from its checkpoints)."""
  try:
    text = path.read_text()
  except FileNotFoundError:
    return None
  try:
    row = json.loads(text)
  except ValueError:
    row = None
  if isinstance(row, dict) and "run_id" in row:
    return row
  damaged = path.with_name(path.name + ".damaged")
  try:
    path.rename(damaged)
  except FileNotFoundError:  # another worker set it aside first
    return None
  print(f"warning: {path} is damaged ({len(text)} bytes, not a JSON row: truncated?); moved to "
        f"{damaged}; its run will be trained again from its checkpoints", file=sys.stderr,
        flush=True)
  return None


def _order(row: dict):
  return (row.get("C_budget", 0.0), row.get("N", 0), row["run_id"])


class ResultsTable:
  """``results.jsonl`` with exactly one row per run id, written by any number of workers.

  Args:
    path: the table, ``<workdir>/results.jsonl``; row files go to ``<workdir>/rows/``.
    run_ids: ids to open by name on every read (besides those the directory lists).

  Attributes:
    rows: run id -> row (dict with at least ``run_id`` and ``status``), as last read.

  A table written by an older chinchax (``results.jsonl`` without ``rows/``)
  is taken over: its rows become row files on first open.
  """

  def __init__(self, path: pathlib.Path, run_ids=()):
    self.path = files.as_path(path)
    self.rows_dir = self.path.parent / ROWS_DIR
    self.run_ids = list(run_ids)
    self.rows: dict[str, dict] = {}
    if not self.rows_dir.exists() and self.path.exists():
      self.rows_dir.mkdir(parents=True, exist_ok=True)
      for line in self.path.read_text().splitlines():
        if line.strip():
          row = json.loads(line)
          if not self._row_path(row["run_id"]).exists():
            files.write_atomic(self._row_path(row["run_id"]), json.dumps(row))
    self.refresh()

  def _row_path(self, run_id: str) -> pathlib.Path:
    return self.rows_dir / f"{run_id}.json"

  def refresh(self) -> dict[str, dict]:
    """Reads every row file again; returns (and keeps) run id -> row."""
    names = set(self.run_ids)
    if self.rows_dir.exists():
      names |= {p.stem for p in self.rows_dir.glob("*.json")}
    rows = {}
    for name in sorted(names):
      row = _read_row(self._row_path(name))
      if row is not None:
        rows[row["run_id"]] = row
    self.rows = rows
    return rows

  def row(self, run_id: str) -> dict | None:
    """The current row of one run (read from its file now), or None."""
    row = _read_row(self._row_path(run_id))
    if row is None:
      self.rows.pop(run_id, None)
    else:
      self.rows[run_id] = row
    return row

  def done(self, run_id: str) -> bool:
    return self.rows.get(run_id, {}).get("status") == "done"

  def upsert(self, row: dict) -> None:
    """Writes one run's row (replacing an earlier one) and merges ``results.jsonl``."""
    self.rows_dir.mkdir(parents=True, exist_ok=True)
    files.write_atomic(self._row_path(row["run_id"]), json.dumps(row))
    self.merge()

  def set_aside(self, run_id: str) -> pathlib.Path:
    """Moves one run's row file to ``stale-rows/`` beside ``rows/`` (kept, no longer in the
    table), merges ``results.jsonl`` and returns where the row went."""
    dest_dir = self.path.parent / STALE_ROWS_DIR
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest, n = dest_dir / f"{run_id}.json", 1
    while dest.exists():
      dest, n = dest_dir / f"{run_id}.{n}.json", n + 1
    self._row_path(run_id).rename(dest)
    self.rows.pop(run_id, None)
    self.merge()
    return dest

  def merge(self) -> pathlib.Path:
    """Rewrites ``results.jsonl`` from the row files until a re-read finds nothing new."""
    merged = None
    while True:
      rows = self.refresh()
      if rows == merged:
        return self.path
      files.write_atomic(self.path, "".join(json.dumps(r) + "\n"
                                      for r in sorted(rows.values(), key=_order)))
      merged = rows
