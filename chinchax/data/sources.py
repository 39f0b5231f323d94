"""Document sources: the embedded standard-library corpus and local files.

A source yields ``(doc_id, text_bytes)`` pairs in a deterministic order and has
a ``fingerprint`` (sha256 over ids and contents) that names its token store.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import pathlib
import sysconfig
from typing import Iterator


class DataError(ValueError):
  """A corpus is missing, empty, malformed or too small; the message names it."""


class StdlibSource:
  """The running interpreter's standard-library ``.py`` files, in sorted path order.

  Real text present on every machine with Python; ``site-packages`` is left out.
  """

  name = "stdlib"

  def __init__(self):
    self.root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    self.files = [f for f in sorted(self.root.rglob("*.py"))
                  if not {"site-packages", "dist-packages"} & set(f.parts) and f.is_file()]
    if not self.files:
      raise DataError(f"no standard-library .py files found under {self.root}")

  def describe(self) -> dict:
    return {"kind": "stdlib", "root": str(self.root), "files": len(self.files)}

  def __iter__(self) -> Iterator[tuple[str, bytes]]:
    for f in self.files:
      yield str(f.relative_to(self.root)), f.read_bytes()


class FileSource:
  """Local ``.txt`` files (one document each) and ``.jsonl`` files (one document per line).

  Args:
    patterns: comma-separated globs (``~`` expanded), e.g. ``"corpus/*.txt,more/*.jsonl"``.
    text_field: the jsonl field holding the text.
  Raises:
    DataError: a glob that matches no file, or a file with an unsupported extension.
  """

  name = "files"

  def __init__(self, patterns: str, text_field: str = "text"):
    self.text_field = text_field
    self.files: list[pathlib.Path] = []
    for pattern in [p.strip() for p in str(patterns).split(",") if p.strip()]:
      matched = sorted(glob.glob(os.path.expanduser(pattern), recursive=True))
      matched = [m for m in matched if os.path.isfile(m)]
      if not matched:
        raise DataError(f"data.paths glob {pattern!r} matches no file")
      self.files.extend(pathlib.Path(m).resolve() for m in matched)
    if not self.files:
      raise DataError(f"data.paths={patterns!r} names no file")
    for f in self.files:
      if f.suffix not in (".txt", ".jsonl"):
        raise DataError(f"unsupported corpus file {str(f)!r}: use .txt or .jsonl")

  def describe(self) -> dict:
    return {"kind": "files", "files": [str(f) for f in self.files], "text_field": self.text_field}

  def __iter__(self) -> Iterator[tuple[str, bytes]]:
    for f in self.files:
      if f.suffix == ".txt":
        yield str(f), f.read_bytes()
        continue
      with f.open("rb") as fh:
        for lineno, line in enumerate(fh, 1):
          if not line.strip():
            continue
          try:
            row = json.loads(line)
          except json.JSONDecodeError as e:
            raise DataError(f"{f}:{lineno} is not valid JSON ({e.msg})") from None
          if not isinstance(row, dict) or self.text_field not in row:
            raise DataError(f"{f}:{lineno} has no field {self.text_field!r} "
                            f"(set data.text_field; fields: {sorted(row)[:10] if isinstance(row, dict) else type(row).__name__})")
          yield f"{f}:{lineno}", str(row[self.text_field]).encode("utf-8")


def fingerprint(source) -> str:
  """sha256 hex digest over every document id and its bytes, in order."""
  h = hashlib.sha256()
  for doc_id, data in source:
    h.update(doc_id.encode("utf-8", "surrogateescape") + b"\0")
    h.update(len(data).to_bytes(8, "little"))
    h.update(data)
  return h.hexdigest()


def make_source(data_cfg):
  """Builds the source named by ``config.data``."""
  if data_cfg.source == "stdlib":
    return StdlibSource()
  return FileSource(data_cfg.paths, data_cfg.text_field)
