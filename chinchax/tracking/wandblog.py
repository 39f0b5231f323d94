"""Weights & Biases logging (``train.wandb``, off by default; ``pip install 'chinchax[wandb]'``).

A run with ``train.wandb=True`` logs, besides TensorBoard, to one W&B run: the same scalars
under the same tags (:func:`chinchax.tracking.tblog.tag`: ``train/loss``, ``eval/bits_per_byte``,
``perf/mfu`` …) at the same global steps, and the whole config. Its knobs:
``train.wandb_project``, ``train.wandb_entity`` ("" = the account's default),
``train.wandb_name`` ("" = the workdir's name), ``train.wandb_group`` ("" = none),
``train.wandb_mode`` (online | offline: files under ``<workdir>/wandb/`` for ``wandb sync``
later | disabled). The W&B run id is derived from the project and the workdir, so a resumed
run continues its W&B run (W&B keeps the first value logged at a step: the steps a resume
repeats keep their earlier values).

A ladder (``ladder.train_config.train.wandb=True``) is one W&B group, named after the ladder's
workdir unless ``wandb_group`` is set, with one W&B run per ladder run (named by its run id)
and one run "fit" holding the fit's figures and its scalar results (:func:`log_fit`).
Only process 0 logs.
"""

from __future__ import annotations

import hashlib
import json
import math
import pathlib

from chinchax.storage import paths as paths_lib
from chinchax.tracking import tblog

def run_id(project: str, where: str) -> str:
  """A W&B run id (16 hex digits) fixed by the project and the run's directory."""
  return hashlib.sha256(f"{project}\0{where}".encode()).hexdigest()[:16]


def _init(train, *, name: str, where: str, group: str | None, config: dict,
          job_type: str | None = None):
  import wandb

  local = None if paths_lib.is_url(where) else where
  if local:
    pathlib.Path(local).mkdir(parents=True, exist_ok=True)
  return wandb.init(project=train.wandb_project, entity=train.wandb_entity or None, name=name,
                    group=group, job_type=job_type, mode=train.wandb_mode, dir=local,
                    id=run_id(train.wandb_project, where), resume="allow", config=config,
                    settings=wandb.Settings(silent=True))  # no banners among chinchax's lines


class RunLogger:
  """One training run's W&B run: :meth:`write` takes the metrics rows TensorBoard takes.

  Args:
    config: the run's config (``train.wandb_*`` knobs; logged whole).
    workdir: the run directory (W&B's local files go to ``<workdir>/wandb/``).
  """

  def __init__(self, config, workdir):
    t = config.train
    workdir = str(workdir)
    self.run = _init(t, name=t.wandb_name or paths_lib.as_path(workdir).name, where=workdir,
                     group=t.wandb_group or None, config=config.to_dict())

  def write(self, row: dict) -> None:
    """Logs every finite numeric value of ``row`` (but step, tokens) at ``row["step"]``,
    tagged as in TensorBoard."""
    data = {tblog.tag(k): float(v) for k, v in row.items()
            if k not in ("step", "tokens") and not isinstance(v, bool)
            and isinstance(v, (int, float)) and math.isfinite(v)}
    if data:
      self.run.log(data, step=int(row["step"]))

  def close(self) -> None:
    self.run.finish()


def open_run(config, workdir) -> RunLogger | None:
  """A :class:`RunLogger` when ``config.train.wandb`` is set, else None."""
  return RunLogger(config, workdir) if config.train.wandb else None


def ladder_group(train, ladder_workdir) -> str:
  """The ladder's W&B group: ``wandb_group``, else the ladder workdir's name."""
  return train.wandb_group or paths_lib.as_path(str(ladder_workdir)).name


def name_ladder_run(cfg, ladder_workdir, run_id_: str) -> None:
  """Puts one ladder run in the ladder's group, named by its run id (``cfg`` edited in place)."""
  if cfg.train.wandb:
    cfg.train.wandb_group = ladder_group(cfg.train, ladder_workdir)
    cfg.train.wandb_name = run_id_


def _scalars(tree, prefix: str = "") -> dict:
  """The finite numbers of a JSON tree, keyed by their '/'-joined path (lists left out)."""
  out = {}
  for k, v in tree.items():
    key = f"{prefix}{k}"
    if isinstance(v, dict):
      out.update(_scalars(v, key + "/"))
    elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
      out[key] = float(v)
  return out


def log_fit(ladder_config, fit_dir) -> bool:
  """Logs a ladder's fit to its group as the run "fit": every figure (``*.png``) of ``fit_dir``
  as an image and the numbers of ``fit.json``; False (nothing logged) when W&B is off.
  """
  t = ladder_config.train_config.train
  if not t.wandb:
    return False
  import wandb

  fit_dir = paths_lib.as_path(str(fit_dir))
  run = _init(t, name="fit", where=str(fit_dir), job_type="fit",
              group=ladder_group(t, ladder_config.workdir), config=ladder_config.to_dict())
  data = {f"fit/{p.stem}": wandb.Image(str(p)) for p in sorted(fit_dir.glob("*.png"))}
  fit_json = fit_dir / "fit.json"
  if fit_json.exists():
    data.update({f"fit/{k}": v for k, v in _scalars(json.loads(fit_json.read_text())).items()})
  if data:
    run.log(data)
  run.finish()
  return True

