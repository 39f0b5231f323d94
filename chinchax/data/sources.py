"""Document sources: the embedded standard-library corpus, local files, HF ``datasets``.

A source yields ``(doc_id, text_bytes)`` pairs in a deterministic order and has
a ``fingerprint`` (sha256 over ids and contents) that names its token store.
Sources yield the document bytes as found; invalid UTF-8 and empty documents
are dealt with by the store builder (``data.decode_errors``, see
:func:`normalize`), so a source never fails on them.

Field checks (``data.text_field``) run when a source is constructed, before any
document is read, so a wrong field name fails fast with the fields that exist.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import pathlib
import re
import sysconfig
from typing import Iterator

from chinchax import errors
from chinchax.storage import paths as paths_lib

FILE_SUFFIXES = (".txt", ".jsonl", ".parquet")
TXT_DOCUMENTS = ("file", "paragraph", "line")
_THIRD_PARTY_DIRS = ("site-packages", "dist-packages")  # left out of the stdlib corpus


class DataError(errors.UserError):
  """A corpus is missing, empty, malformed or too small; the message names it."""


def text_to_bytes(value) -> bytes:
  """A text field's value as bytes: str → UTF-8, bytes as is, None → b"".

  Strings read with ``surrogateescape`` (undecodable bytes of a jsonl line) get
  their original bytes back; other lone surrogates (a JSON ``"\\udc00"``) are
  kept as their (invalid) UTF-8 encoding, for :func:`normalize` to handle.
  """
  if value is None:
    return b""
  if isinstance(value, (bytes, bytearray, memoryview)):
    return bytes(value)
  text = value if isinstance(value, str) else str(value)
  try:
    return text.encode("utf-8")
  except UnicodeEncodeError:
    try:
      return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
      return text.encode("utf-8", "surrogatepass")


def normalize(data: bytes, decode_errors: str) -> tuple[bytes | None, str]:
  """Makes a document valid UTF-8 under the ``data.decode_errors`` policy.

  Args:
    data: the document's bytes as the source yielded them.
    decode_errors: "replace" (each invalid sequence becomes U+FFFD, the
      document is kept) or "skip" (the document is dropped).
  Returns:
    (bytes or None when skipped, status) with status "ok", "replaced" or "skipped".
  """
  try:
    data.decode("utf-8")
    return data, "ok"
  except UnicodeDecodeError:
    if decode_errors == "skip":
      return None, "skipped"
    return data.decode("utf-8", "replace").encode("utf-8"), "replaced"


class StdlibSource:
  """The running interpreter's standard-library ``.py`` files, in sorted path order.

  Real text present on every machine with Python; ``site-packages`` is left out.
  """

  name = "stdlib"

  def __init__(self):
    self.root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    found = []
    for directory, subdirs, names in os.walk(self.root):
      # Not walked at all: a site-packages tree can hold many times the stdlib's files.
      subdirs[:] = [d for d in subdirs if d not in _THIRD_PARTY_DIRS]
      found += [pathlib.Path(directory, n) for n in names if n.endswith(".py")]
    self.files = [f for f in sorted(found) if f.is_file()]
    if not self.files:
      raise DataError(f"no standard-library .py files found under {self.root}")

  def describe(self) -> dict:
    return {"kind": "stdlib", "root": str(self.root), "files": len(self.files)}

  def in_words(self) -> str:
    """The corpus for a message: "the standard library's .py files under ROOT (N files)"."""
    return f"the standard library's .py files under {self.root} ({len(self.files):,} files)"

  def __iter__(self) -> Iterator[tuple[str, bytes]]:
    for f in self.files:
      yield str(f.relative_to(self.root)), f.read_bytes()


def _pyarrow_parquet():
  try:
    import pyarrow.parquet as pq
  except ImportError:
    raise DataError("reading .parquet needs pyarrow: pip install 'chinchax[hf]'") from None
  return pq


class FileSource:
  """Local ``.txt`` files (one document each), ``.jsonl`` files (one document per
  line) and ``.parquet`` files (one document per row).

  Args:
    patterns: comma-separated globs (``~`` expanded), e.g. ``"corpus/*.txt,more/*.jsonl"``.
    text_field: the jsonl / parquet field holding the text.
    txt_documents: how a ``.txt`` file is cut into documents: ``file`` (one
      document), ``paragraph`` (at blank lines: a single-file corpus such as
      tiny shakespeare then has documents to hold out for validation), ``line``.
  Raises:
    DataError: a glob that matches no file, a file with an unsupported
      extension, or a jsonl / parquet file whose first row has no ``text_field``.
    PathError: a corpus file, or a directory a glob must list, cannot be read.
  """

  name = "files"

  def __init__(self, patterns: str, text_field: str = "text", txt_documents: str = "file"):
    if txt_documents not in TXT_DOCUMENTS:
      raise DataError(f"data.txt_documents={txt_documents!r} is not one of {TXT_DOCUMENTS}")
    self.text_field = text_field
    self.txt_documents = txt_documents
    self.files: list[pathlib.Path] = []
    for pattern in [p.strip() for p in str(patterns).split(",") if p.strip()]:
      matched = sorted(glob.glob(os.path.expanduser(pattern), recursive=True))
      matched = [m for m in matched if os.path.isfile(m)]
      if not matched:
        blocked = paths_lib.unreadable_dir(pattern)
        if blocked is not None:
          raise paths_lib.PathError(f"data.paths glob {pattern!r} cannot be matched: directory "
                                    f"{blocked} cannot be read (permission denied)")
        where = ("" if os.path.isabs(os.path.expanduser(pattern)) else
                 f" (relative to the current directory {os.getcwd()}; give an absolute path or "
                 f"run from the directory it is relative to)")
        raise DataError(f"data.paths glob {pattern!r} matches no file{where}")
      self.files.extend(pathlib.Path(m).resolve() for m in matched)
    if not self.files:
      raise DataError(f"data.paths={patterns!r} names no file")
    for f in self.files:
      if f.suffix not in FILE_SUFFIXES:
        raise DataError(f"unsupported corpus file {str(f)!r}: use {', '.join(FILE_SUFFIXES)}")
    for f in self.files:
      paths_lib.check_readable_file(f)
      self._check_field(f)

  def _check_field(self, f: pathlib.Path) -> None:
    if f.suffix == ".parquet":
      names = _pyarrow_parquet().read_schema(f).names
      if self.text_field not in names:
        raise DataError(f"{f} has no field {self.text_field!r} (set data.text_field; "
                        f"fields: {names[:20]})")
    elif f.suffix == ".jsonl":
      with f.open("rb") as fh:
        for lineno, line in enumerate(fh, 1):
          if line.strip():
            self._parse_line(f, lineno, line)
            return

  def describe(self) -> dict:
    return {"kind": "files", "files": [str(f) for f in self.files], "text_field": self.text_field,
            "txt_documents": self.txt_documents}

  def in_words(self) -> str:
    """The corpus for a message: its files by name (the first 3, then how many more)."""
    names = ", ".join(str(f) for f in self.files[:3])
    more = f" and {len(self.files) - 3:,} more" if len(self.files) > 3 else ""
    return f"of {len(self.files):,} file(s) {names}{more}"

  def _parse_line(self, f, lineno: int, line: bytes) -> bytes:
    try:
      row = json.loads(line.decode("utf-8", "surrogateescape"))
    except json.JSONDecodeError as e:
      raise DataError(f"{f}:{lineno} is not valid JSON ({e.msg})") from None
    if not isinstance(row, dict) or self.text_field not in row:
      fields = sorted(row)[:10] if isinstance(row, dict) else type(row).__name__
      raise DataError(f"{f}:{lineno} has no field {self.text_field!r} "
                      f"(set data.text_field; fields: {fields})")
    return text_to_bytes(row[self.text_field])

  def __iter__(self) -> Iterator[tuple[str, bytes]]:
    for f in self.files:
      if f.suffix == ".txt":
        data = f.read_bytes()
        if self.txt_documents == "file":
          yield str(f), data
          continue
        pattern = rb"(?:\r?\n[ \t]*){2,}" if self.txt_documents == "paragraph" else rb"\r?\n"
        for i, doc in enumerate(d for d in re.split(pattern, data) if d.strip()):
          yield f"{f}#{i}", doc
      elif f.suffix == ".jsonl":
        with f.open("rb") as fh:
          for lineno, line in enumerate(fh, 1):
            if line.strip():
              yield f"{f}:{lineno}", self._parse_line(f, lineno, line)
      else:
        row = 0
        pf = _pyarrow_parquet().ParquetFile(f)
        for batch in pf.iter_batches(batch_size=1024, columns=[self.text_field]):
          for value in batch.column(0).to_pylist():
            yield f"{f}:{row}", text_to_bytes(value)
            row += 1


class HFSource:
  """A split of an HF ``datasets`` dataset: a hub name or a local directory.

  A directory written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``
  is opened with ``datasets.load_from_disk``; anything else (a hub name, a
  directory of data files) with ``datasets.load_dataset``. Rows are read in
  dataset order, 1,000 at a time; document ids are ``"<split>/<row>"``.

  Args:
    name: dataset name or local path (``~`` expanded).
    split: split to read, e.g. "train".
    text_field: column holding the text.
    config_name: dataset configuration ("" = the default).
    streaming: read rows as a stream (``IterableDataset``) instead of
      materialising the dataset in the HF cache.
  Raises:
    DataError: ``datasets`` not installed, the dataset or split cannot be
      loaded, or it has no column ``text_field``.
  """

  name = "hf"

  def __init__(self, name: str, split: str = "train", text_field: str = "text",
               config_name: str = "", streaming: bool = False):
    try:
      import datasets
    except ImportError:
      raise DataError("data.source='hf' needs the datasets package: pip install 'chinchax[hf]'") from None
    self.dataset_name, self.split, self.text_field = name, split, text_field
    self.config_name, self.streaming = config_name, bool(streaming)
    path = os.path.expanduser(name)
    saved = os.path.isdir(path) and any(
        os.path.exists(os.path.join(path, f)) for f in ("dataset_dict.json", "state.json"))
    try:
      if saved:
        ds = datasets.load_from_disk(path)
        if isinstance(ds, datasets.DatasetDict):
          if split not in ds:
            raise DataError(f"HF dataset {name!r} has no split {split!r}; splits: {sorted(ds)}")
          ds = ds[split]
        if self.streaming:
          ds = ds.to_iterable_dataset()
      else:
        ds = datasets.load_dataset(path if os.path.exists(path) else name, config_name or None,
                                   split=split, streaming=self.streaming)
    except DataError:
      raise
    except Exception as e:  # datasets raises many types (FileNotFound, ValueError, ConnectionError)
      raise DataError(f"cannot load HF dataset {name!r} split {split!r}: "
                      f"{type(e).__name__}: {e}") from None
    self.dataset = ds
    columns = ds.column_names
    if columns is None:  # a stream without declared features: look at its first row
      first = next(iter(ds), None)
      columns = sorted(first) if first else []
    if text_field not in columns:
      raise DataError(f"HF dataset {name!r} split {split!r} has no field {text_field!r} "
                      f"(set data.text_field; fields: {list(columns)[:20]})")

  def describe(self) -> dict:
    return {"kind": "hf", "name": self.dataset_name, "config": self.config_name,
            "split": self.split, "text_field": self.text_field, "streaming": self.streaming}

  def in_words(self) -> str:
    """The corpus for a message: the dataset, its split and the text field."""
    config = f" ({self.config_name})" if self.config_name else ""
    return (f"HF dataset {self.dataset_name}{config}, split {self.split!r}, field "
            f"{self.text_field!r}")

  def __iter__(self) -> Iterator[tuple[str, bytes]]:
    row = 0
    for batch in self.dataset.iter(batch_size=1000):
      for value in batch[self.text_field]:
        yield f"{self.split}/{row}", text_to_bytes(value)
        row += 1


@dataclasses.dataclass(frozen=True)
class Scan:
  """What one read of a source finds.

  Attributes:
    fingerprint: sha256 hex digest over every document id and its bytes, in order.
    documents: documents read (empty ones included).
    nonempty: documents with at least one byte.
    bytes: total bytes of all documents, as read (before UTF-8 repair).
  """

  fingerprint: str
  documents: int
  nonempty: int
  bytes: int


def scan(source) -> Scan:
  """Reads ``source`` once: its fingerprint and counts (see :class:`Scan`)."""
  h = hashlib.sha256()
  docs = nonempty = total = 0
  for doc_id, data in source:
    h.update(doc_id.encode("utf-8", "surrogateescape") + b"\0")
    h.update(len(data).to_bytes(8, "little"))
    h.update(data)
    docs += 1
    nonempty += bool(data)
    total += len(data)
  return Scan(fingerprint=h.hexdigest(), documents=docs, nonempty=nonempty, bytes=total)


def fingerprint(source) -> str:
  """sha256 hex digest over every document id and its bytes, in order (one full read)."""
  return scan(source).fingerprint


def make_source(data_cfg):
  """Builds the source named by ``config.data`` (``source``: stdlib | files | hf).

  Raises:
    DataError: see the source classes.
  """
  if data_cfg.source == "stdlib":
    return StdlibSource()
  if data_cfg.source == "hf":
    return HFSource(data_cfg.hf_name, split=data_cfg.hf_split, text_field=data_cfg.text_field,
                    config_name=data_cfg.hf_config, streaming=data_cfg.hf_streaming)
  return FileSource(data_cfg.paths, data_cfg.text_field, data_cfg.txt_documents)
