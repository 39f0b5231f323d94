"""Training configs: `--config configs/train.py:VARIANT`, overrides `--config.model.d_model=128`.

Variants:
  default  ~177k-parameter byte-level model on the embedded stdlib corpus, 20 tokens/param
           (Chinchilla); trains in a few minutes on a 2-core CPU.
  tiny     ~29k parameters, 20 steps; for tests and smoke runs.
  small    ~4.9M parameters; an accelerator-sized smoke run.
  125m     GPT-3-Small-like shape (d_model 768, 12 layers; 85M parameters with the byte vocab)
           for accelerators.
"""

from chinchax import config as config_lib


def get_config(variant: str = "default"):
  """Returns the ml_collections ConfigDict of a named variant (see module doc)."""
  return config_lib.get_variant(variant or "default")
