"""Resuming a run started from ``train.init_from=hf:DIR`` once DIR is gone.

The HF directory is read only when a run starts (:mod:`chinchax.export.hf_source`): once the
workdir holds a checkpoint, that checkpoint holds the params, the workdir's ``config.json``
the model knobs DIR set, and the run's token store a copy of DIR's ``tokenizer.json`` (found
by its sha256, as ``chinchax export`` finds it: :func:`chinchax.export.tokenizer_files.find`).
So a resume needs nothing from DIR; :func:`configure_from_run` sets the config from those.
"""

from __future__ import annotations

import sys

from chinchax import config as config_lib
from chinchax import console
from chinchax.checkpoint import integrity
from chinchax.checkpoint import run_config
from chinchax.export import hf_source
from chinchax.export import tokenizer_files
from chinchax.export.error import ExportError, HFCheckpointError
from chinchax.storage import paths as paths_lib

# The model knobs an HF directory sets (hf_source.read_config's keys).
MODEL_KNOBS = ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "vocab_size",
               "tie_embeddings", "rope_theta", "norm_eps")


def configure_from_run(config, workdir, say: bool = True) -> bool:
  """For ``train.init_from=hf:DIR`` with DIR gone and a checkpoint in ``workdir``: sets the
  model knobs left at their defaults and the tokenizer from the saved run (in place).

  Args:
    config: the run's config (``train.init_from`` = ``hf:DIR``).
    workdir: the run's directory (local or gs://).
    say: print one ``note:`` line saying where the model and tokenizer come from.
  Returns:
    True when the config was set here (the run resumes from its own checkpoint); False when
    ``init_from`` is not ``hf:``, DIR exists, or the workdir holds no checkpoint (then
    :func:`chinchax.export.hf_source.open_source` reads DIR, and says what is wrong with it).
  Raises:
    HFCheckpointError: the run's tokenizer is found neither at its recorded path nor in its
      token store (the line names the step the workdir holds and where it looked).
  """
  directory = hf_source.hf_dir(config.train.init_from)
  if directory is None or directory.exists():
    return False
  payload = run_config.saved_run(workdir)
  if payload is None:
    return False
  step = max(integrity.saved_steps(workdir))
  saved = payload.get("config", {})
  defaults = config_lib.base_config()
  for knob in MODEL_KNOBS:  # a knob the user set stays: check_compatible compares it
    if knob in saved.get("model", {}) and config.model[knob] == defaults.model[knob]:
      config.model[knob] = type(defaults.model[knob])(saved["model"][knob])
  data = saved.get("data", {})
  where = (f"workdir {workdir} holds a run at step {step} started from "
           f"train.init_from={config.train.init_from}, which no longer exists")
  tok_path = ""
  if data.get("tokenizer") == "hf":
    recorded = data.get("tokenizer_path", "")
    if recorded and paths_lib.as_path(recorded).exists():
      tok_path = recorded
    else:
      try:
        found = tokenizer_files.find(paths_lib.as_path(workdir), payload)
      except ExportError as e:
        raise HFCheckpointError(f"{where}, and its tokenizer is not found either ({e}); put "
                                f"the directory back to resume, or use another workdir") from None
      tok_path = found.info["found_at"]
    config.data.tokenizer, config.data.tokenizer_path = "hf", tok_path
    if not config.data.eos_token:
      config.data.eos_token = data.get("eos_token", "")
  if say:
    tok = f", its tokenizer from {tok_path}" if tok_path else ""
    console.say(f"note: {where}; it resumes from its own checkpoint (the model knobs from "
                f"{workdir}/config.json{tok})", stream=sys.stderr)
  return True
