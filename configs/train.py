"""Training configs: `--config configs/train.py:VARIANT`, overrides `--config.model.d_model=128`.

Variants:
  default  ~0.4M-parameter byte-level model on the embedded stdlib corpus, 20 tokens/param
           (Chinchilla); trains in a few minutes on a 2-core CPU.
  tiny     a few thousand steps' worth smaller; for tests and smoke runs.
  small    ~6M parameters; an accelerator-sized smoke run.
  125m     GPT-3-Small-like shape (d_model 768, 12 layers) for accelerators.
"""

from chinchax import config as config_lib


def get_config(variant: str = "default"):
  """Returns the ml_collections ConfigDict of a named variant (see module doc)."""
  return config_lib.get_variant(variant or "default")
