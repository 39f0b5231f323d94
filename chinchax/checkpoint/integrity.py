"""What a checkpoint on disk is, checked: its array specs, checksums and finiteness.

* :class:`CheckpointError` — a checkpoint that cannot be used with this config
  (a ``UserError``: one ``error:`` line).
* :class:`Unusable` — a checkpoint that cannot be restored as saved (truncated,
  missing or altered files); the manager sets it aside and falls back.
* :func:`state_sums` / :func:`verify_sums` — per-array checksums (a wrapping
  uint32 sum of the bit patterns, the same on any mesh) and their check.
* :func:`check_shapes` — the saved arrays against the model's abstract state.
* :func:`read_failure` — an orbax / TensorStore read error in words.
"""

from __future__ import annotations

import pathlib
import re

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from chinchax import errors
from chinchax.storage import paths as paths_lib


class CheckpointError(errors.UserError):
  """A checkpoint cannot be used with this config; the message names the mismatch."""


class Unusable(Exception):
  """A checkpoint that cannot be restored as saved: truncated, missing or altered files."""


def saved_steps(workdir: pathlib.Path, name: str = "checkpoints") -> list[int]:
  """Steps of the complete checkpoints in ``workdir/name`` (orbax renames a step into place;
  on an object store it writes ``commit_success.txt`` into it last)."""
  ckpts = paths_lib.as_path(workdir) / name
  try:
    steps = sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit())
  except OSError:
    return []
  if paths_lib.is_url(ckpts):  # no rename there: orbax marks a finished step with this file
    steps = [s for s in steps if (ckpts / str(s) / "commit_success.txt").exists()]
  return steps


def verify_sums(saved: list[int] | None, state) -> None:
  """Raises Unusable when ``state`` differs from the checksums ``saved`` (if any) or is not finite."""
  if saved is not None:
    now = state_sums(state)
    if len(now) != len(saved) or now != saved:
      paths = [path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
      bad = [p for p, a, b in zip(paths, now, saved) if a != b] or ["its array set"]
      raise Unusable(f"altered: the checksum of {bad[0]} differs from the one saved")
  if not all_finite(state):
    raise Unusable("holds NaN/Inf values")


_SPEC = re.compile(r"\s*\[[a-z_]+(?:\[\d+\])?='.*?'\]")  # TensorStore's [tensorstore_spec='{...}']
_REPR = re.compile(r"<[^<>]*>")  # <bound method pybind11_...>, <object at 0x...>
# TensorStore's status codes, in words.
_STATUS_WORDS = {
    "NOT_FOUND": "a file is missing", "DATA_LOSS": "its bytes fail their checksum (altered)",
    "OUT_OF_RANGE": "a file is shorter than its index says (truncated)",
    "INVALID_ARGUMENT": "its bytes cannot be decoded (damaged)",
    "FAILED_PRECONDITION": "its files do not match each other (damaged)",
    "PERMISSION_DENIED": "a file cannot be read (permissions)",
}


def _words(text: str) -> str:
  """``text`` without TensorStore specs and object reprs, on one line."""
  text = _REPR.sub("", _SPEC.sub("", text))
  return " ".join(text.split())


def first_line(e: Exception) -> str:
  """``Type: message`` of ``e`` in one line of at most 200 characters, without TensorStore's
  spec dumps or object reprs."""
  text = _words(str(e))
  return f"{type(e).__name__}: {text[:200]}".rstrip(": ")


def read_failure(e: Exception) -> str:
  """Why an orbax / TensorStore read failed, in words: which array and which file, and why.

  E.g. ``array opt_state/1/0/count: file .../d/ae0c... is truncated (1,018 of 3,056 bytes)``.
  An error that names no array or file is :func:`first_line` without specs or reprs.
  """
  text = str(e)
  arrays = re.findall(r'Error (?:reading|opening) "([A-Za-z0-9_.]+)/[^"]*" in OCDBT', text)
  files = re.findall(r'local file "([^"]+)"', text)
  code = re.match(r"\s*([A-Z_]{4,}):", text)
  short = re.search(r"not valid for value of size (\d+)", text)
  wanted = re.search(r"byte range \[\d+, (\d+)\)", text)
  if short and wanted:
    why = f"truncated ({int(short.group(1)):,} of {int(wanted.group(1)):,} bytes)"
  elif code and code.group(1) in _STATUS_WORDS:
    why = _STATUS_WORDS[code.group(1)]
  else:
    return first_line(e)
  where = []
  if arrays:
    where.append(f"array {arrays[0].replace('.', '/')}")
  if files:
    where.append(f"file {files[-1]}")
  return f"{', '.join(where) or 'the checkpoint'}: {why}"


@jax.jit
def _all_finite(tree) -> jax.Array:
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


@jax.jit
def _sums(tree) -> list:
  def one(x):
    if x.dtype == jnp.bool_:  # a trials run's alive flags: bitcast takes no bool
      x = x.astype(jnp.uint8)
    bits = {1: jnp.uint8, 2: jnp.uint16}.get(x.dtype.itemsize, jnp.uint32)
    return jnp.sum(jax.lax.bitcast_convert_type(x, bits).astype(jnp.uint32), dtype=jnp.uint32)
  return [one(x) for x in jax.tree.leaves(tree)]


def state_sums(tree) -> list[int]:
  """Per array of ``tree`` (leaf order), the uint32 sum of its bit patterns modulo 2³².

  Integer sums do not depend on the order of addition, so the figure is the
  same on every mesh and device count.
  """
  return [int(v) for v in jax.device_get(_sums(tree))]


def all_finite(tree) -> bool:
  """True when every floating-point array of ``tree`` is free of NaN and Inf (one device reduction)."""
  return bool(jax.device_get(_all_finite(tree)))


def check_shapes(directory: pathlib.Path, step: int, abstract_state) -> None:
  """Compares the arrays saved at ``step`` with ``abstract_state`` by path, shape and dtype.

  Raises:
    CheckpointError: naming the first mismatched parameter (parameters are
      checked before optimizer state) with both shapes, or one that only one
      side has.
    Unusable: the checkpoint's item directory or its metadata is missing or unreadable.
  """
  directory = paths_lib.as_path(directory)
  item_dir = directory / str(step) / "default"
  if not (item_dir / "_METADATA").is_file():
    raise Unusable(f"incomplete: {item_dir.relative_to(directory)}"
                    f"{'/_METADATA' if item_dir.is_dir() else ''} is missing")
  try:
    # The item's handler reads its own metadata (a Checkpointer would look for, and warn about,
    # a step-level _CHECKPOINT_METADATA inside the item directory).
    meta = ocp.StandardCheckpointHandler().metadata(item_dir)
  except Exception as e:  # noqa: BLE001 — a damaged metadata file
    raise Unusable(f"unreadable: its metadata: {read_failure(e)}") from None
  saved = shapes_by_path(getattr(meta, "item_metadata", meta))
  if not saved:
    raise Unusable("unreadable: its metadata lists no array")
  wanted = shapes_by_path(abstract_state)
  where = f"the checkpoint at step {step} in {directory}"
  for path in sorted(set(saved) | set(wanted), key=lambda p: (not p.startswith("params/"), p)):
    if path not in saved:
      raise CheckpointError(f"{where} has no array {path} {wanted[path][0]}, which this config's "
                            f"model has: it was written for a different model shape")
    if path not in wanted:
      raise CheckpointError(f"{where} holds {path} {saved[path][0]}, which this config's model "
                            f"does not have: it was written for a different model shape")
    if saved[path] != wanted[path]:
      (s_shape, s_dtype), (w_shape, w_dtype) = saved[path], wanted[path]
      raise CheckpointError(
          f"{where} holds {path} with shape {s_shape} {s_dtype}, but this config's model needs "
          f"{w_shape} {w_dtype}; use another workdir or the config the checkpoint was written with")



def path_str(path) -> str:
  """A pytree path as 'params/blocks/0/attn/wq_DHK' (dict keys, attributes and indices alike)."""
  parts = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
    else:
      parts.append(str(k))
  return "/".join(p for p in parts if p != "value")


def shapes_by_path(tree) -> dict[str, tuple[tuple[int, ...], str]]:
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {path_str(p): (tuple(x.shape), str(getattr(x, "dtype", "?"))) for p, x in leaves}


