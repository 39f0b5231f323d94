"""``chinchax train``: one training run from a config file and dotted overrides.

Example:
  chinchax train --config configs/train.py:tiny --config.workdir=runs/tiny
  chinchax train --config.data.source=files --config.data.paths='corpus/*.txt' --config.workdir=runs/mine
"""

from __future__ import annotations

import sys

import jax

from chinchax import config as config_lib
from chinchax.runtime import distributed as distributed_lib
from chinchax.runtime import interrupts
from chinchax.runtime import jax_settings as runtime
from chinchax import train as train_lib
from chinchax.cli import flags as flags_lib
from chinchax.export import hf_source


def check_budget_knobs(budget, typed: set[str]) -> None:
  """Refuses a budget knob typed on the command line that ``budget.mode`` does not read
  (``--config.budget.steps=2`` under mode ``tokens_per_param`` would train the whole
  tokens-per-parameter budget).

  Raises:
    ConfigError: names the knob, the mode and the ``--config.budget.mode`` that reads it.
  """
  for knob in sorted(typed & (set(config_lib.BUDGET_MODES) - {budget.mode})):  # mode = its knob
    raise config_lib.ConfigError(
        f"--config.budget.{knob}={budget[knob]!r} has no effect: budget.mode="
        f"{budget.mode!r} sets D from budget.{budget.mode}; add --config.budget.mode={knob} "
        f"to budget by {knob}")


def main(argv: list[str]) -> int:
  """Runs (or resumes) the run; 0 when done, 75 when preempted (SIGTERM) and 130 when
  interrupted (Ctrl-C) after its checkpoint.

  Raises:
    UserError: bad flags, config, data, checkpoint or multi-process start-up.
  """
  config = flags_lib.parse_config(argv, flags_lib.config_file("train.py"), "train")
  if config is None:
    return 0
  config_lib.validate(config)
  check_budget_knobs(config.budget, flags_lib.set_knobs(argv, "budget"))
  # a model knob typed on the command line is the user's even when it equals its default
  hf_source.check_set_knobs(config, flags_lib.set_knobs(argv, "model"))
  runtime.setup_cpu_devices(config.mesh.num_cpu_devices)
  runtime.setup_compilation_cache(config.compile_cache_dir)
  distributed_lib.initialize(config.distributed)  # before any device is used
  distributed_lib.install_sigterm_handler()
  try:
    summary = train_lib.train(config)
  except distributed_lib.Preempted as e:  # SIGTERM, or Ctrl-C (Interrupted): after a checkpoint
    if jax.process_index() == 0:
      print(str(e), file=sys.stderr)
    return (interrupts.INTERRUPTED_EXIT_CODE if isinstance(e, interrupts.Interrupted)
            else distributed_lib.PREEMPTED_EXIT_CODE)
  planned = flags_lib.planned_of(argv)
  if planned and jax.process_index() == 0:
    print(plan_line(planned, summary, [a for a in argv if a.startswith("--config.")
                                       and not a.startswith(_NEUTRAL_KNOBS)]))
  return 0


# Knobs that change where or how a run is logged, not what it trains: no bearing on the prediction.
_NEUTRAL_KNOBS = ("--config.workdir", "--config.compile_cache_dir", "--config.mesh.",
                  "--config.train.progress", "--config.train.checkpoint", "--config.train.log",
                  "--config.train.wandb", "--config.distributed.")


def plan_line(planned: dict, summary: dict, overrides: list[str]) -> str:
  """``plan    predicted 2.1034 (law fit), measured 2.0857 ± 0.0110 nats/token (-0.84%)``: a
  planned config's prediction (``PLANNED`` of a ``plan --write-config`` file) beside the run's
  final eval loss; ``overrides`` typed on the command line are named (they may void it)."""
  measured, se = summary.get("final_eval_loss"), summary.get("final_eval_loss_se")
  pred = planned.get("predicted_loss")
  got = "no eval loss" if measured is None else (
      f"measured {measured:.4f}" + (f" ± {se:.4f}" if se else "") + " nats/token")
  if pred is None:
    text = f"plan    law {planned.get('law')} made no loss prediction for this run; {got}"
  else:
    rel = f" ({100 * (measured - pred) / pred:+.2f}%)" if measured is not None else ""
    text = f"plan    predicted {pred:.4f} (law {planned.get('law')}), {got}{rel}"
  if overrides:
    text += f"; typed overrides may void the prediction: {' '.join(overrides)}"
  return text
