"""Checkpoints: an orbax CheckpointManager over the train state, plus the run's config.

Saves are asynchronous every ``checkpoint_every`` steps and at the end; the
latest ``keep_checkpoints`` are kept. Restore targets carry the shardings of
the current mesh, so the state lands directly sharded. ``config.json`` in the
workdir records the run: its config, model signature and data signature (the
tokenizer's sha256 and the corpus fingerprint). A restart whose model, data or
any of :data:`RESUME_KEYS` differs is refused before anything is overwritten;
so is a workdir holding checkpoints but no ``config.json`` (what they were
trained with cannot be checked, and cannot be rebuilt from the arrays alone).

A fresh run may start from another run's checkpoint (``train.init_from``,
:func:`check_init_source` then :func:`restore_init_source`): the full state,
step counter included, verified by the same per-array checksums; a trunk keeps
its branch checkpoints with ``train.save_steps`` (``Checkpointer(save_steps=)``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from chinchax import console
from chinchax import errors
from chinchax import paths as paths_lib

MODEL_KEYS = ("d_model", "n_layers", "n_heads", "d_ff", "vocab_size", "tie_embeddings",
              "scan_layers")
# Knobs that decide the function trained, the data order, the schedule or the budget: a resume
# must keep them, or the run would silently become another run. (Mesh, dtype, attention kernel
# and remat may change.) data.tokenizer_path is checked by the tokenizer's content hash and the
# corpus by its fingerprint (DATA_SIGNATURE), not by their paths or globs.
RESUME_KEYS = (
    "seed",
    "model.rope_theta", "model.norm_eps", "model.init", "model.init_std", "model.document_mask",
    "train.global_batch_size", "train.seq_len", "train.peak_lr", "train.warmup_steps",
    "train.min_lr_ratio", "train.b1", "train.b2", "train.eps", "train.weight_decay",
    "train.decay_embeddings", "train.grad_clip", "train.z_loss",
    "train.schedule", "train.decay_fraction", "train.decay_shape", "train.decay_start_step",
    "budget.mode", "budget.tokens_per_param", "budget.flops", "budget.tokens", "budget.steps",
    "budget.n_kind",
    "data.source", "data.paths", "data.text_field", "data.txt_documents", "data.tokenizer",
    "data.eos_token", "data.bpe_vocab_size", "data.decode_errors", "data.hf_name",
    "data.hf_config", "data.hf_split", "data.val_fraction",
    "data.allow_repeat",
)


# config.json's "data_signature": what the run reads, by content. (name, what a change means)
DATA_SIGNATURE = {
    "tokenizer_sha256": "data.tokenizer_path (or data.tokenizer) names a tokenizer with other "
                        "contents",
    "store_fingerprint": "the corpus (data.paths / data.source) has other documents or contents",
}


class CheckpointError(errors.UserError):
  """A checkpoint cannot be used with this config; the message names the mismatch."""


class _Unusable(Exception):
  """A checkpoint that cannot be restored as saved: truncated, missing or altered files."""


class Checkpointer:
  """Thin wrapper over ``ocp.CheckpointManager`` for the train-state pytree.

  Every save also records a checksum per array of the state (a wrapping
  uint32 sum of its bit patterns: the same on any mesh) in
  ``<directory>.sums.json``; a restore verifies it, and that the state is
  finite, and falls back to the newest intact checkpoint. An unusable
  checkpoint is moved to ``<directory>-unusable/`` with a warning, never deleted.

  ``save_steps`` (``train.save_steps``) are saved besides every ``every``-th
  step and never deleted: orbax's ``save_on_steps`` plus a preservation policy
  keeping the latest ``keep`` and those steps (a trunk's branch points).
  """

  def __init__(self, directory: pathlib.Path, every: int, keep: int,
               save_steps: tuple[int, ...] = ()):
    self.directory = pathlib.Path(directory)
    self.sums_path = self.directory.with_name(self.directory.name + ".sums.json")
    self.save_steps = frozenset(save_steps)
    if self.save_steps:
      policy = ocp.checkpoint_managers.AnyPreservationPolicy([
          ocp.checkpoint_managers.LatestN(n=keep),
          ocp.checkpoint_managers.CustomSteps(sorted(self.save_steps))])
      options = ocp.CheckpointManagerOptions(
          save_interval_steps=every, save_on_steps=self.save_steps, preservation_policy=policy,
          enable_async_checkpointing=True, create=True)
    else:
      options = ocp.CheckpointManagerOptions(max_to_keep=keep, save_interval_steps=every,
                                             enable_async_checkpointing=True, create=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state, force: bool = False) -> bool:
    """Starts an async save of ``state`` at ``step`` if the interval (or ``force``) says so,
    and records the state's checksums."""
    if not (force or self.manager.should_save(step)):
      return False
    try:
      paths_lib.check_writable_dir(self.directory, "checkpoint directory")
    except paths_lib.PathError as e:
      raise CheckpointError(f"{e}: cannot save step {step}; {self._last_complete()}") from None
    sums = state_sums(state)
    try:
      saved = self.manager.save(step, args=ocp.args.StandardSave(state), force=force)
    except Exception as e:  # noqa: BLE001 — orbax reports a failed earlier async write here
      raise CheckpointError(f"saving the checkpoint of step {step} in {self.directory} failed "
                            f"({_first_line(e)}); {self._last_complete()}") from None
    if saved:
      self._record_sums(step, sums)
    return saved

  def _last_complete(self) -> str:
    """Where the newest complete checkpoint is, in words (after pending writes end)."""
    try:
      self.manager.wait_until_finished()
    except Exception:  # noqa: BLE001 — the failed write is reported by the caller
      pass
    steps = _saved_steps(self.directory.parent, self.directory.name)
    return (f"the last complete checkpoint is step {steps[-1]} in {self.directory}" if steps
            else "no checkpoint is complete")

  def _saved_sums(self) -> dict:
    try:
      return json.loads(self.sums_path.read_text())
    except (OSError, ValueError):
      return {}

  def _record_sums(self, step: int, sums: list[int]) -> None:
    if jax.process_index() != 0:
      return
    keep = {str(s) for s in self.manager.all_steps()} | {str(step)}
    table = {k: v for k, v in self._saved_sums().items() if k in keep}
    table[str(step)] = sums
    tmp = self.sums_path.with_name(self.sums_path.name + ".tmp")
    tmp.write_text(json.dumps(table))
    os.replace(tmp, self.sums_path)

  def restore_latest(self, abstract_state, shardings):
    """Restores the newest intact checkpoint onto ``shardings``, or returns None when there is none.

    The checkpoint may come from another mesh or device count: every array is
    read straight into the sharding given here. A checkpoint whose files are
    truncated, missing or altered (checksum mismatch), or whose state is not
    finite, is moved to ``<directory>-unusable/`` with a warning naming it,
    and the next older one is tried.

    Raises:
      CheckpointError: an array's shape or dtype, or the set of arrays, differs
        from ``abstract_state`` (a different model), or no checkpoint is
        intact; nothing is read or written.
    """
    target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          abstract_state, shardings)
    unusable = []
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        self.check_shapes(step, abstract_state)
        try:
          state = self.manager.restore(step, args=ocp.args.StandardRestore(target))
        except Exception as e:  # noqa: BLE001 — orbax / tensorstore: any read failure
          raise _Unusable(f"unreadable: {_first_line(e)}") from None
        self._verify(step, state)
      except _Unusable as e:
        unusable.append((step, str(e)))
        continue
      self._set_aside(unusable, step)
      return state
    if unusable:
      raise CheckpointError(
          f"no checkpoint in {self.directory} can be restored: "
          f"{'; '.join(f'step {s} {why}' for s, why in unusable)}; move the directory away to "
          f"start afresh, or use another workdir")
    return None

  def _verify(self, step: int, state) -> None:
    """Raises _Unusable when ``state`` differs from its recorded checksums or is not finite."""
    _verify_sums(self._saved_sums().get(str(step)), state)

  def _set_aside(self, unusable: list, good_step: int) -> None:
    """Moves unusable checkpoints to ``<directory>-unusable/<step>`` (process 0), warns, reloads."""
    if not unusable:
      return
    aside = self.directory.with_name(self.directory.name + "-unusable")
    for step, why in unusable:
      dest = aside / str(step)
      n = 1
      while dest.exists():
        dest, n = aside / f"{step}-{n}", n + 1
      if jax.process_index() == 0:
        aside.mkdir(parents=True, exist_ok=True)
        os.replace(self.directory / str(step), dest)
      console.warn(f"the checkpoint at step {step} in {self.directory} is {why}; moved to {dest}; "
                   f"resuming from step {good_step}", enabled=jax.process_index() == 0)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # noqa: PLC0415 — multi-process only
      multihost_utils.sync_global_devices("chinchax:checkpoints-set-aside")
    self.manager.reload()

  def check_shapes(self, step: int, abstract_state) -> None:
    """:func:`check_shapes` of this directory's checkpoint at ``step``."""
    check_shapes(self.directory, step, abstract_state)

  def wait_and_close(self) -> None:
    """Waits for pending writes and closes the manager.

    Raises:
      CheckpointError: a pending write failed (e.g. the directory turned read-only).
    """
    try:
      self.manager.wait_until_finished()
    except Exception as e:  # noqa: BLE001 — orbax / tensorstore write errors
      raise CheckpointError(f"writing a checkpoint in {self.directory} failed ({_first_line(e)});"
                            f" {self._last_complete()}") from None
    finally:
      try:
        self.manager.close()
      except Exception:  # noqa: BLE001 — already reported above
        pass


def _verify_sums(saved: list[int] | None, state) -> None:
  """Raises _Unusable when ``state`` differs from the checksums ``saved`` (if any) or is not finite."""
  if saved is not None:
    now = state_sums(state)
    if len(now) != len(saved) or now != saved:
      paths = [_path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
      bad = [p for p, a, b in zip(paths, now, saved) if a != b] or ["its array set"]
      raise _Unusable(f"altered: the checksum of {bad[0]} differs from the one saved")
  if not all_finite(state):
    raise _Unusable("holds NaN/Inf values")


def _first_line(e: Exception) -> str:
  text = str(e).strip().splitlines()
  return f"{type(e).__name__}: {text[0][:200] if text else ''}"


@jax.jit
def _all_finite(tree) -> jax.Array:
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


@jax.jit
def _sums(tree) -> list:
  def one(x):
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
    _Unusable: the checkpoint's item directory or its metadata is missing or unreadable.
  """
  directory = pathlib.Path(directory)
  item_dir = directory / str(step) / "default"
  if not (item_dir / "_METADATA").is_file():
    raise _Unusable(f"incomplete: {item_dir.relative_to(directory)}"
                    f"{'/_METADATA' if item_dir.is_dir() else ''} is missing")
  try:
    # The item's handler reads its own metadata (a Checkpointer would look for, and warn about,
    # a step-level _CHECKPOINT_METADATA inside the item directory).
    meta = ocp.StandardCheckpointHandler().metadata(item_dir)
  except Exception as e:  # noqa: BLE001 — a damaged metadata file
    raise _Unusable(f"unreadable: its metadata: {type(e).__name__}") from None
  saved = _shapes_by_path(getattr(meta, "item_metadata", meta))
  if not saved:
    raise _Unusable("unreadable: its metadata lists no array")
  wanted = _shapes_by_path(abstract_state)
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



def _path_str(path) -> str:
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


def _shapes_by_path(tree) -> dict[str, tuple[tuple[int, ...], str]]:
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {_path_str(p): (tuple(x.shape), str(getattr(x, "dtype", "?"))) for p, x in leaves}


def _model_signature(config, vocab_size: int | None = None) -> dict:
  sig = {k: config.model[k] for k in MODEL_KEYS}
  if vocab_size is not None:
    sig["vocab_size"] = vocab_size
  return sig


def _saved_steps(workdir: pathlib.Path, name: str = "checkpoints") -> list[int]:
  """Steps of the complete checkpoints in ``workdir/name`` (orbax renames a step into place)."""
  ckpts = pathlib.Path(workdir) / name
  try:
    return sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit())
  except OSError:
    return []


def _saved_run(workdir: pathlib.Path, abstract_state=None) -> dict | None:
  """config.json of a workdir that holds checkpoints; None when there is no checkpoint.

  Without a config.json, and given ``abstract_state``, the newest checkpoint
  with readable metadata is first compared with it (a different model is
  reported as such), then the workdir is refused.

  Raises:
    CheckpointError: checkpoints without a readable config.json.
  """
  steps = _saved_steps(workdir)
  if not steps:
    return None
  path = pathlib.Path(workdir) / "config.json"
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError) as e:
    for step in reversed(steps if abstract_state is not None else []):
      try:
        check_shapes(pathlib.Path(workdir) / "checkpoints", step, abstract_state)
        break
      except _Unusable:
        continue
    why = "no config.json" if isinstance(e, FileNotFoundError) else f"an unreadable {path.name} ({e})"
    raise CheckpointError(
        f"workdir {workdir} holds checkpoints (steps {', '.join(map(str, steps))}) but {why}, so "
        f"the settings they were trained with cannot be checked; put the run's config.json back, "
        f"or use another workdir") from None


def check_data_signature(workdir: pathlib.Path, key: str, value: str,
                         payload: dict | None = None) -> None:
  """Refuses to resume when the saved ``data_signature[key]`` (see :data:`DATA_SIGNATURE`) differs.

  Raises:
    CheckpointError: naming the setting and both hashes; nothing is written.
  """
  payload = _saved_run(workdir) if payload is None else payload
  saved = (payload or {}).get("data_signature", {}).get(key)
  if saved is not None and saved != value:
    raise CheckpointError(
        f"workdir {workdir} holds a run trained on other data: {DATA_SIGNATURE[key]} "
        f"({key} {value[:16]}, saved {saved[:16]}); use another workdir, or the saved data")


def check_compatible(workdir: pathlib.Path, config, vocab_size: int | None = None,
                     tokenizer_sha256: str | None = None, abstract_state=None) -> None:
  """Refuses to resume in ``workdir`` with a model, data or settings that differ from its run.

  Args:
    workdir: the run directory.
    config: the run's config.
    vocab_size: the resolved vocab size (``model.vocab_size``, or the
      tokenizer's when that is 0); None skips the check for ``vocab_size=0``.
    tokenizer_sha256: the tokenizer's content hash (None: not known yet, as for
      a BPE still to be trained; the corpus fingerprint covers it).
    abstract_state: the run's abstract train state: without a config.json the
      checkpoint's array shapes are compared with it first.
  Raises:
    CheckpointError: checkpoints but no config.json; or naming each mismatched
      field (saved vs config), for the vocab size the saved and current
      tokenizers, for the tokenizer its content hash.
  """
  payload = _saved_run(workdir, abstract_state)
  if payload is None:
    return
  saved = payload.get("model_signature", {})
  now = _model_signature(config, vocab_size)
  for k, v in saved.items():
    if k == "vocab_size" and now[k] == 0:
      continue
    if k == "vocab_size" and now[k] != v:
      saved_tok = payload.get("config", {}).get("data", {}).get("tokenizer", "?")
      raise CheckpointError(
          f"workdir {workdir} holds a checkpoint of a model with vocab_size={v} (tokenizer "
          f"{saved_tok!r}), but this run's tokenizer {config.data.tokenizer!r} and "
          f"model.vocab_size={config.model.vocab_size} give vocab_size={now[k]}; use the "
          f"tokenizer the checkpoint was trained with, or another workdir")
    if k in now and now[k] != v:
      raise CheckpointError(
          f"workdir {workdir} holds a checkpoint of a model with model.{k}={v!r}, but the config "
          f"says model.{k}={now[k]!r}; use another workdir or the saved "
          f"{'layout' if k == 'scan_layers' else 'shape'}")
  saved_cfg = payload.get("config", {})
  changed = []
  for key in RESUME_KEYS:
    old_v, new_v, missing = saved_cfg, config, False
    for part in key.split("."):
      if not isinstance(old_v, dict) or part not in old_v:
        missing = True
        break
      old_v, new_v = old_v[part], new_v[part]
    if not missing and old_v != new_v:
      changed.append(f"{key}={new_v!r} (saved {old_v!r})")
  if changed:
    raise CheckpointError(
        f"workdir {workdir} holds a run started with other settings; resuming would silently "
        f"change it: {', '.join(changed)}. Use another workdir, or the saved settings")
  if tokenizer_sha256 is not None:  # same settings, but the tokenizer file has other contents
    check_data_signature(workdir, "tokenizer_sha256", tokenizer_sha256, payload)


def saved_init(workdir: pathlib.Path) -> dict | None:
  """The ``init`` record of a workdir's config.json ({"from", "step"}: the checkpoint the run
  started from, ``train.init_from``), or None."""
  try:
    return json.loads((pathlib.Path(workdir) / "config.json").read_text()).get("init")
  except (OSError, ValueError):
    return None


def write_run_config(workdir: pathlib.Path, config, spec, data_signature: dict | None = None,
                     init: dict | None = None) -> None:
  """Writes ``config.json``: the full config, the resolved model signature, the data
  signature (keys of :data:`DATA_SIGNATURE`), the budget and, for a run started from
  another run's checkpoint, ``init`` = {"from": its checkpoints directory, "step": s}."""
  payload = {
      "config": json.loads(config.to_json_best_effort()),
      "model_signature": _model_signature(config, spec.model.vocab_size),
      "data_signature": dict(data_signature or {}),
      "budget": {"N": spec.n_params, "n_kind": spec.n_kind, "D": spec.tokens,
                 "steps": spec.steps, "C_6nd": spec.flops_6nd},
  }
  if init:
    payload["init"] = dict(init)
  tmp = pathlib.Path(workdir) / "config.json.tmp"
  tmp.write_text(json.dumps(payload, indent=2))
  tmp.replace(pathlib.Path(workdir) / "config.json")


# Settings a run started from another run's checkpoint (``train.init_from``) must share with it,
# besides the model signature and the tokenizer's hash: what one step reads. (Schedule, budget,
# optimizer hyper-parameters and the corpus may differ: a cooldown has its own.)
INIT_KEYS = ("train.seq_len", "train.global_batch_size", "data.tokenizer")


@dataclasses.dataclass(frozen=True)
class InitSource:
  """A checked ``train.init_from`` checkpoint.

  Attributes:
    directory: the source run's checkpoints directory.
    step: the step of the checkpoint the run starts from.
    tokenizer_sha256: the source run's tokenizer hash (None if it recorded none).
  """

  directory: pathlib.Path
  step: int
  tokenizer_sha256: str | None

  def check_tokenizer(self, tokenizer_sha256: str) -> None:
    """Refuses a run whose tokenizer (content hash) differs from the source's.

    Raises:
      CheckpointError: naming both hashes.
    """
    if self.tokenizer_sha256 is not None and tokenizer_sha256 != self.tokenizer_sha256:
      raise CheckpointError(
          f"train.init_from={str(self.directory.parent)!r} was trained with another tokenizer "
          f"(sha256 {self.tokenizer_sha256[:16]}, this run's {tokenizer_sha256[:16]}): its "
          f"token ids mean other things here; use the source run's data.tokenizer settings")


def init_source_dirs(path) -> tuple[pathlib.Path, pathlib.Path]:
  """(workdir, checkpoints directory) of a ``train.init_from`` path: a run's workdir, or the
  ``checkpoints`` directory inside it."""
  p = pathlib.Path(os.path.expanduser(str(path).strip())).resolve()
  if (p / "checkpoints").is_dir() or not p.is_dir() or (p / "config.json").exists():
    return p, p / "checkpoints"
  return p.parent, p


def has_checkpoints(workdir: pathlib.Path) -> bool:
  """True when ``workdir/checkpoints`` holds a complete checkpoint (a run that resumes)."""
  return bool(_saved_steps(workdir))


def check_init_source(config, workdir: pathlib.Path, steps: int, vocab_size: int,
                      tokenizer_sha256: str | None, abstract_state) -> InitSource:
  """Checks ``train.init_from`` / ``train.init_step`` against this run, before any data is read.

  Args:
    config: this run's config.
    workdir: this run's workdir (resolved); it must differ from the source's.
    steps: this run's total steps; the source step must come before the last.
    vocab_size: this run's resolved vocab size.
    tokenizer_sha256: this run's tokenizer hash (None: a BPE still to train;
      then :meth:`InitSource.check_tokenizer` runs once the store is built).
    abstract_state: this run's abstract train state (array paths, shapes, dtypes).
  Returns:
    the source checkpoint (directory and step).
  Raises:
    CheckpointError: the source has no config.json or no checkpoint; the
      step (``train.init_step``, 0 = latest) is not saved there (the saved
      steps are named); the step is not before this run's last; the model
      signature (shape, vocab, tied head, layer layout), seq_len, batch,
      tokenizer or the arrays (optimizer state included) differ.
  """
  t = config.train
  src_workdir, directory = init_source_dirs(t.init_from)
  where = f"train.init_from={t.init_from!r}"
  if src_workdir == pathlib.Path(workdir).resolve():
    raise CheckpointError(f"{where} is this run's own workdir; give another run's workdir (a "
                          f"run resumes from its own checkpoints without init_from)")
  saved = _saved_steps(directory.parent, directory.name)
  if not saved:
    raise CheckpointError(f"{where}: {directory} holds no complete checkpoint; give the workdir "
                          f"of a run that saved one")
  step = t.init_step or saved[-1]
  if step not in saved:
    raise CheckpointError(
        f"{where} has no checkpoint at train.init_step={step}; its saved steps are "
        f"{', '.join(map(str, saved))} (a trunk keeps its branch steps with train.save_steps)")
  if step >= steps:
    raise CheckpointError(
        f"{where} at step {step} is not before this run's last step {steps}: nothing would be "
        f"trained; choose an earlier train.init_step or a larger budget")
  try:
    payload = json.loads((src_workdir / "config.json").read_text())
  except (OSError, ValueError) as e:
    raise CheckpointError(f"{where}: {src_workdir / 'config.json'} cannot be read ({e}), so the "
                          f"settings its checkpoints were trained with cannot be checked") from None
  theirs = payload.get("model_signature", {})
  ours = _model_signature(config, vocab_size)
  for k in MODEL_KEYS:
    if k in theirs and theirs[k] != ours[k]:
      raise CheckpointError(f"{where} is a model with model.{k}={theirs[k]!r}, but this run has "
                            f"model.{k}={ours[k]!r}; use the source's model settings")
  src_cfg = payload.get("config", {})
  for key in INIT_KEYS:
    old_v, new_v = src_cfg, config
    for part in key.split("."):
      old_v, new_v = (old_v or {}).get(part), new_v[part]
    if old_v != new_v:
      raise CheckpointError(f"{where} was trained with {key}={old_v!r}, but this run has "
                            f"{key}={new_v!r}; a run continued from it must keep it")
  src = InitSource(directory, step, payload.get("data_signature", {}).get("tokenizer_sha256"))
  if tokenizer_sha256 is not None:
    src.check_tokenizer(tokenizer_sha256)
  try:
    check_shapes(directory, step, abstract_state)
  except _Unusable as e:
    raise CheckpointError(f"{where}: the checkpoint at step {step} is {e}") from None
  return src


def restore_init_source(src: InitSource, abstract_state, shardings):
  """The full train state (params, optimizer state, step) of ``src`` onto ``shardings``.

  The source directory is opened read-only; the state is verified against the
  per-array checksums the source recorded (``Checkpointer``) and for finiteness.

  Raises:
    CheckpointError: the checkpoint is unreadable, altered or not finite
      (nothing in the source directory is moved or written).
  """
  target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract_state, shardings)
  where = f"the checkpoint at step {src.step} in {src.directory}"
  try:
    # The item's own handler reads it: nothing is opened for writing in the source directory.
    state = ocp.StandardCheckpointHandler().restore(
        src.directory / str(src.step) / "default", args=ocp.args.StandardRestore(target))
  except Exception as e:  # noqa: BLE001 — orbax / tensorstore: any read failure
    raise CheckpointError(f"{where} is unreadable: {_first_line(e)}") from None
  sums_path = src.directory.with_name(src.directory.name + ".sums.json")
  try:
    sums = json.loads(sums_path.read_text()).get(str(src.step))
  except (OSError, ValueError):
    sums = None
  try:
    _verify_sums(sums, state)
  except _Unusable as e:
    raise CheckpointError(f"{where} is {e}; it cannot start this run") from None
  return state
