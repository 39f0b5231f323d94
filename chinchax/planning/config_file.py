"""``--write-config``: the planned run as a config file that ``chinchax train --config`` runs.

The file's ``get_config(variant=None)`` starts from
``chinchax.config.base_config()`` and sets the model shape, batch, seq_len,
peak LR, warmup, eval/checkpoint intervals, the budget (mode "tokens",
tokens = the planned D in whole steps, so the run sees exactly D) and the
workdir. One table of settings (:func:`_settings`) feeds both the ConfigDict
that is validated (:func:`planned_config`) and the source that is written
(:func:`config_source`), so the file says what was validated.
"""

from __future__ import annotations

import json
import os
import pathlib

from chinchax import config as config_lib
from chinchax.storage import paths as paths_lib
from chinchax.data import sources as sources_lib
from chinchax.data import unique as unique_lib
from chinchax.planning.errors import PlanError
from chinchax.planning.planner import Plan

# How the written file lays out each section's update(...) call: one line per group.
_LAYOUT = {
    "model": (("vocab_size", "d_model", "n_layers"), ("n_heads", "d_ff", "tie_embeddings"),
              ("remat", "scan_layers")),
    "mesh": (("data", "fsdp", "tensor"),),
    "train": (("global_batch_size", "seq_len"), ("microbatches",),
              ("peak_lr", "warmup_steps"),
              ("eval_every", "checkpoint_every"), ("log_every",)),
    "budget": (("mode", "tokens", "n_kind"),),
}


def _settings(plan: Plan) -> tuple[dict[str, dict], int, str]:
  """({section: {field: value}}, mesh.num_cpu_devices, the comment saying why) for ``plan``."""
  s, b = plan.chosen.shape, plan.batch
  every = max(1, min(1000, b.steps // 10))
  if plan.hardware is not None and plan.hardware.accelerator.kind == "cpu":
    cpu_devices, cpu_note = plan.hardware.n_devices, f"the {plan.hardware.spec!r} the plan timed"
  else:
    cpu_devices = next(n for n in (8, 4, 2, 1) if b.global_batch_size % n == 0)
    cpu_note = "as many virtual devices as divide the batch"
  sections = {
      "model": s.arch(),
      "train": dict(global_batch_size=b.global_batch_size, seq_len=b.seq_len, peak_lr=b.peak_lr,
                    warmup_steps=b.warmup_steps, eval_every=every, checkpoint_every=every,
                    log_every=max(1, min(50, b.steps // 20))),
      "budget": dict(mode="tokens", tokens=plan.D, n_kind="total"),
  }
  if plan.fit is not None:  # how the run fits its devices (chinchax.planning.layout)
    sections["model"]["remat"] = plan.fit.remat
    # train.loss_chunk_size stays "auto": on the plan's hardware it is plan.fit.loss_chunk.
    sections["train"]["microbatches"] = plan.fit.microbatches
    if plan.fit.mesh["fsdp"] > 1:  # FSDP over however many devices the run gets
      sections["mesh"] = dict(data=1, fsdp=-1, tensor=1)
  if plan.layout is not None:  # chinchax plan --aot moved the run to a layout that fits
    sections["model"].update(remat=plan.layout["remat"], scan_layers=plan.layout["scan_layers"])
    sections["mesh"] = dict(plan.layout["mesh"])
    if "microbatches" in plan.layout:
      sections["train"]["microbatches"] = plan.layout["microbatches"]
  if plan.tokenizer:  # a vocabulary the plan chose (an accelerator's 32k BPE)
    sections["data"] = dict(plan.tokenizer)
  recipe = plan.recipe or {}
  for name, values in (recipe.get("settings") or {}).items():  # the law's recipe (planning.recipe)
    sections.setdefault(name, {}).update(values)
  for name, knob, value in recipe.get("overrides") or ():  # plan --set, last
    sections.setdefault(name, {})[knob] = value
  if plan.data_limit:  # plan --unique-tokens: train in epochs over U tokens of whole documents
    data = sections.setdefault("data", {})
    data.update(allow_repeat=True, unique_tokens=int(round(plan.data_limit["unique_tokens"])))
    # A uniform sample of documents, as the repeat ladder's laws were fitted (a store-order
    # prefix is unlike the validation split: docs/data-constrained.md); --set may say otherwise.
    data.setdefault("unique_order", "shuffled")
  return sections, cpu_devices, cpu_note


def planned_config(plan: Plan, workdir: str):
  """The ConfigDict of the planned run (what the file of :func:`config_source` returns)."""
  sections, cpu_devices, _ = _settings(plan)
  c = config_lib.base_config()
  c.workdir = workdir
  for name, values in sections.items():
    c[name].update(**values)
  c.mesh.num_cpu_devices = cpu_devices
  return c


def _literal(value) -> str:
  """Python source of a setting: strings in double quotes, numbers and booleans as repr."""
  return json.dumps(value) if isinstance(value, str) else repr(value)


def _update_call(name: str, values: dict) -> str:
  opening = f"  c.{name}.update("
  layout = _LAYOUT.get(name, ())
  groups = [", ".join(f"{k}={_literal(values[k])}" for k in group if k in values)
            for group in layout]
  laid = {k for group in layout for k in group}
  rest = [k for k in values if k not in laid]  # e.g. a law recipe's knobs, three a line
  groups += [", ".join(f"{k}={_literal(values[k])}" for k in rest[i:i + 3])
             for i in range(0, len(rest), 3)]
  groups = [g for g in groups if g]
  return opening + (",\n" + " " * len(opening)).join(groups) + ")"


def config_source(plan: Plan, workdir: str) -> str:
  """Python source of an ml_collections config file that trains ``plan`` exactly."""
  sections, cpu_devices, cpu_note = _settings(plan)
  budget_desc = ", ".join(f"{k}={v:.6g}" for k, v in plan.budget.items())
  loss = "n/a" if plan.predicted_loss is None else f"{plan.predicted_loss:.4f} nats/token"
  if plan.loss_units:  # what the loss is in, or why there is none (chinchax.planning.loss_units)
    loss += f"\n({plan.loss_units['note']})"
  deps = (plan.recipe or {}).get("departures")
  if deps:
    loss += f"\nDeparts from the law's recipe: {'; '.join(deps)}; its prediction no longer holds"
  updates = "\n".join(_update_call(name, values) for name, values in sections.items())
  planned = {"law": plan.law.name, "N": int(plan.N), "D": int(plan.D), "C": float(plan.C),
             "predicted_loss": (None if plan.predicted_loss is None or deps
                                else round(float(plan.predicted_loss), 6))}
  return f'''"""Planned run: {plan.mode} budget ({budget_desc}), law {plan.law.name}.

N = {plan.N:,} parameters, D = {plan.D:,} tokens ({plan.D / plan.N:.1f} tokens/param),
C = 6ND = {plan.C:.4g} FLOPs, predicted loss {loss}.
Run: chinchax train --config THIS_FILE
"""

from chinchax import config as config_lib

# What the plan predicts for this run (``chinchax train`` prints it beside the measured loss).
PLANNED = {planned!r}


def get_config(variant=None):
  """The planned run's config (``variant`` is accepted and ignored)."""
  del variant
  c = config_lib.base_config()
  c.workdir = {workdir!r}
{updates}
  # On CPU: {cpu_note} (ignored on accelerators).
  c.mesh.num_cpu_devices = {cpu_devices}
  return c
'''


def check_config_path(path: str | os.PathLike, overwrite: bool = False) -> pathlib.Path:
  """The ``--write-config`` path, checked: a ``.py`` name in a writable directory (or one
  :func:`write_config` can create: its nearest existing parent is a writable directory, so
  ``runs/planned.py`` works on a fresh clone), and no file there already unless ``overwrite``.

  Raises:
    PlanError: a parent is a file or not writable, the name is not ``.py``, or a file exists
      at ``path`` and ``overwrite`` is False.
  """
  path = pathlib.Path(path)
  existing = next(p for p in (path.parent, *path.parent.parents) if p.exists() or p == p.parent)
  if not existing.is_dir():
    raise PlanError(f"cannot write config {str(path)!r}: {str(existing)!r} is not a directory")
  paths_lib.check_writable_dir(existing, "--write-config directory")
  if path.suffix != ".py":
    raise PlanError(f"config path {str(path)!r} must end in .py (an ml_collections config file)")
  if path.exists() and not overwrite:
    raise PlanError(f"--write-config {str(path)!r} exists; pass --overwrite to replace it, or "
                    f"choose another path")
  return path


def write_config(plan: Plan, path: str | os.PathLike, workdir: str | None = None,
                 n_devices: int | None = None, overwrite: bool = False) -> pathlib.Path:
  """Validates the planned config and writes its file; nothing is written on error.

  Args:
    plan: the planned run.
    path: the ``.py`` file to write (missing directories are made, after the checks).
    workdir: the run's workdir (default :func:`default_workdir`).
    n_devices: devices the config is validated for (default 1).
    overwrite: replace a file already at ``path`` (default: refuse).
  Returns:
    The path written.
  Raises:
    PlanError: the directory does not exist, the path does not end in .py, or
      the config fails ``chinchax.config.validate`` or ``chinchax.data.unique.check_config``
      (a ``--unique-tokens`` below one batch of the plan: train would refuse it).
  """
  path = check_config_path(path, overwrite)
  workdir = workdir or default_workdir(plan)
  config = planned_config(plan, workdir)
  try:
    config_lib.validate(config, n_devices=n_devices or 1)
  except config_lib.ConfigError as e:
    raise PlanError(f"the planned config is invalid: {e}") from None
  try:
    unique_lib.check_config(config.data, config.train)  # a U below one batch of the plan
  except sources_lib.DataError as e:
    raise PlanError(f"--unique-tokens {config.data.unique_tokens:,} cannot train the plan "
                    f"(chinchax train would refuse the config): {e}") from None
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(config_source(plan, workdir))
  tmp.replace(path)
  return path


def default_workdir(plan: Plan) -> str:
  """runs/plan-N<N>-D<D>, e.g. runs/plan-N1.2e+06-D2.4e+07."""
  return f"runs/plan-N{plan.N:.2g}-D{plan.D:.2g}"
