"""Where ``chinchax export`` may write, and the atomic replacement of an earlier export.

An export only ever replaces what an export wrote. ``--out DIR`` is accepted when DIR

* does not exist, or is an empty directory, or
* is an earlier export — it holds ``export_info.json`` and nothing but the files an
  export writes (:data:`EXPORT_FILES`) — and ``--overwrite`` is given;

and DIR is not a run directory (one holding ``checkpoints/`` or a run's ``config.json``),
not an ancestor of the exported run, and, inside a run directory, passes through nothing
the run holds (``RUN/export`` or ``RUN/hf/v1`` are fine while new; ``RUN/checkpoints/x``
is not). Every refusal is one line naming DIR and what would be valid, raised before any
checkpoint is read.

The files are written into a hidden temporary sibling of DIR, which is renamed into place
when complete; an earlier export is moved aside first and deleted only after the rename.

A URL (``--out gs://BUCKET/PREFIX``) follows the same rules, a prefix standing for a
directory: it must name a prefix (not a whole bucket), and a prefix holding a run, lying
among a run's objects, or holding objects that are not an earlier export is refused, with
``--overwrite`` or without. There are no renames on an object store: the files are written
locally, then uploaded one object each: first ``export_info.json`` marked
``"upload": "incomplete"``, so an interrupted upload still counts as an export that
``--overwrite`` may replace, and last the complete ``export_info.json``; objects of an earlier
export that the new one does not write are deleted after the upload; an upload that fails into
a new prefix deletes what it wrote when the storage still answers.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile

from chinchax.export.error import ExportError
from chinchax.storage import paths as paths_lib

# Every file an export may write (export_info.json marks the directory as one).
EXPORT_FILES = frozenset({
    "model.safetensors", "config.json", "generation_config.json", "export_info.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})


def is_run_dir(path: pathlib.Path) -> bool:
  """True for a chinchax run directory: it holds ``checkpoints/``, or a run's ``config.json``
  (a JSON object with ``model_signature``, which an export's config.json never has)."""
  if (path / "checkpoints").is_dir():
    return True
  try:
    return "model_signature" in json.loads((path / "config.json").read_text())
  except (OSError, ValueError, TypeError):
    return False


def is_export_dir(path: pathlib.Path) -> bool:
  """True for an earlier export: a directory with ``export_info.json`` whose entries are all
  plain files named in :data:`EXPORT_FILES` (no subdirectory, no link, nothing else)."""
  url = paths_lib.is_url(path)  # an object store has no links
  if not path.is_dir() or (not url and path.is_symlink()) or not (
      path / "export_info.json").is_file():
    return False
  return all(f.name in EXPORT_FILES and f.is_file() and (url or not f.is_symlink())
             for f in path.iterdir())


def _valid(workdir: pathlib.Path) -> str:
  return (f"choose a new or empty directory (default {workdir / 'export'}), or an earlier "
          f"export (export_info.json and its files only) with --overwrite")


def check_out(out, workdir: pathlib.Path, overwrite: bool) -> pathlib.Path:
  """Checks that the export may write ``out`` (see the module docstring); touches nothing.

  Args:
    out: the output directory as given (``~`` expanded).
    workdir: the exported run's directory, resolved.
    overwrite: ``--overwrite`` was given.
  Returns:
    ``out`` as an absolute path, symbolic links resolved.
  Raises:
    ExportError: ``out`` is the run, holds it, lies among a run's own files, is a file, is
      a non-empty directory that is not an earlier export, or is an earlier export and
      ``overwrite`` is false.
  """
  if paths_lib.is_url(out):
    return _check_url_out(str(out), workdir, overwrite)
  given = os.path.expanduser(str(out))
  out = pathlib.Path(given).resolve()
  valid = _valid(workdir)
  if out == workdir:
    raise ExportError(f"--out {given} is the run directory itself; an export there would "
                      f"replace its checkpoints; {valid}")
  if out in workdir.parents:
    raise ExportError(f"--out {given} holds the run {workdir}; {valid}")
  for run in out.parents:
    if not is_run_dir(run):
      continue
    child = run / out.relative_to(run).parts[0]
    if child.name == "checkpoints" or (child != out and child.exists()):
      where = (f"is the {child.name} directory of the run {run}" if child == out else
               f"is inside {child}, which belongs to the run {run}")
      raise ExportError(f"--out {given} {where}; inside a run, export to a new directory such "
                        f"as {run / 'export'} or to an earlier export")
  if out.exists() and not out.is_dir():
    raise ExportError(f"--out {given} is a file, not a directory; {valid}")
  if out.is_dir() and any(out.iterdir()):
    _check_held(out, given, overwrite, valid, ("is a chinchax run directory", "is not empty"))
  return out


def _check_held(out, given: str, overwrite: bool, valid: str, words: tuple[str, str]) -> None:
  """Refuses a non-empty ``out`` that is a run, holds anything but an earlier export, or is
  one and ``overwrite`` is false; ``words``: how to say "is a run" and "is not empty"."""
  if is_run_dir(out):
    raise ExportError(f"--out {given} {words[0]}; {valid}")
  if not is_export_dir(out):
    others = sorted(f.name for f in out.iterdir() if f.name not in EXPORT_FILES or not f.is_file())
    raise ExportError(
        f"--out {given} {words[1]} and is not an earlier export (it holds "
        f"{', '.join(others[:3])}{', …' if len(others) > 3 else ''}); --overwrite replaces "
        f"only an earlier export; {valid}")
  if not overwrite:
    what = ("an export whose upload was interrupted" if _incomplete(out) else
            "an earlier export")
    raise ExportError(f"--out {given} holds {what}; pass --overwrite to replace "
                      f"it, or choose another --out")


def _incomplete(out) -> bool:
  """True for an export (on an object store) whose upload did not finish."""
  try:
    return json.loads((out / "export_info.json").read_text()).get("upload") == "incomplete"
  except (OSError, ValueError, AttributeError):
    return False


def _check_url_out(given: str, workdir, overwrite: bool):
  """:func:`check_out` for a URL: the same rules over prefixes (see the module docstring)."""
  scheme, rest = given.split("://", 1)
  bucket, _, key = rest.partition("/")
  key = key.strip("/")
  if not bucket or not key:
    raise ExportError(f"--out {given} names {'a whole bucket' if bucket else 'no bucket'}; an "
                      f"export needs a prefix of its own: write {scheme}://"
                      f"{bucket or 'BUCKET'}/NAME (a new prefix, or an earlier export with "
                      f"--overwrite)")
  out = paths_lib.as_path(f"{scheme}://{bucket}/{key}")
  valid = _valid(workdir)
  run_url = str(workdir).rstrip("/") if paths_lib.is_url(workdir) else None
  if run_url == str(out):
    raise ExportError(f"--out {given} is the run directory itself; an export there would "
                      f"replace its checkpoints; {valid}")
  if run_url and run_url.startswith(str(out) + "/"):
    raise ExportError(f"--out {given} holds the run {run_url}; {valid}")
  parts = key.split("/")
  for i in range(1, len(parts)):
    run = paths_lib.as_path(f"{scheme}://{bucket}/{'/'.join(parts[:i])}")
    if not is_run_dir(run):
      continue
    child = run / parts[i]
    if child.name == "checkpoints" or (str(child) != str(out) and child.exists()):
      where = (f"is the {child.name} prefix of the run {run}" if str(child) == str(out) else
               f"is inside {child}, which belongs to the run {run}")
      raise ExportError(f"--out {given} {where}; inside a run, export to a new prefix such "
                        f"as {run / 'export'} or to an earlier export")
  if out.exists() and any(True for _ in out.iterdir()):
    _check_held(out, given, overwrite, valid, ("holds a chinchax run", "holds objects"))
  return out


def _write_url(out, fill) -> None:
  """:func:`write_atomically` for a URL: written locally, then uploaded (module docstring)."""
  tmp = pathlib.Path(tempfile.mkdtemp(prefix="chinchax-export-"))
  try:
    fill(tmp)
    before = {p.name for p in out.iterdir()} if out.exists() else set()
    if before and not is_export_dir(out):
      raise ExportError(f"--out {out} changed during the export and is no longer an earlier "
                        f"export; nothing was replaced")
    names = sorted(os.listdir(tmp), key=lambda n: (n == "export_info.json", n))
    info = json.loads((tmp / "export_info.json").read_text())
    done = []
    try:  # marked incomplete first: an interrupted upload is an export --overwrite may replace
      (out / "export_info.json").write_text(json.dumps({**info, "upload": "incomplete"}))
      done.append("export_info.json")
      for name in names:  # export_info.json last, complete
        (out / name).write_bytes((tmp / name).read_bytes())
        done.append(name)
    except BaseException:
      if not before:  # a new prefix: nothing half-written is left (when the storage answers)
        for name in reversed(done):
          try:
            (out / name).unlink()
          except Exception:  # noqa: BLE001 — the storage is gone: the error raised says so
            break
      raise
    for name in sorted(before - set(names)):
      (out / name).unlink()
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def apply_umask(directory: pathlib.Path) -> None:
  """Gives ``directory`` and its files the modes a new directory and file get under the
  process's umask (0o777 and 0o666 masked): safetensors writes its file 0o600 and
  ``tempfile.mkdtemp`` its directory 0o700, which would leave a shared model directory
  unreadable to the group."""
  mask = os.umask(0)
  os.umask(mask)
  directory.chmod(0o777 & ~mask)
  for f in directory.iterdir():
    if f.is_file():
      f.chmod(0o666 & ~mask)


def write_atomically(out: pathlib.Path, fill) -> None:
  """Writes a complete export at ``out``: ``fill(tmp)`` writes the files into a new hidden
  sibling directory, which then replaces ``out``.

  An existing ``out`` (already checked by :func:`check_out`) is checked again to be empty or
  an earlier export, moved aside, and deleted only once the new export is in place; on any
  error (or Ctrl-C) the temporary directory is removed and ``out`` is as it was.

  Raises:
    ExportError: ``out`` stopped being empty or an export since it was checked.
    Whatever ``fill`` raises.
  """
  if paths_lib.is_url(out):
    _write_url(out, fill)
    return
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
  old = tmp.with_name(tmp.name + "-old")
  try:
    fill(tmp)
    apply_umask(tmp)
    if out.exists():
      if any(out.iterdir()) and not is_export_dir(out):
        raise ExportError(f"--out {out} changed during the export and is no longer an earlier "
                          f"export; nothing was replaced")
      os.replace(out, old)
    try:
      os.replace(tmp, out)
    except BaseException:
      if old.exists():
        os.replace(old, out)
      raise
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  shutil.rmtree(old, ignore_errors=True)
