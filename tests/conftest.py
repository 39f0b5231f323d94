"""Shared fixtures: 8 virtual CPU devices, a small local corpus, a shared store root."""

import os
import pathlib
import sysconfig

# Must happen before JAX starts its backend.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

from chinchax import config as config_lib  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> pathlib.Path:
  """~0.6 MB of real text: 60 standard-library modules copied as .txt documents."""
  root = tmp_path_factory.mktemp("corpus")
  stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
  files = sorted(f for f in stdlib.glob("*.py") if f.stat().st_size > 4000)[:60]
  for f in files:
    (root / (f.stem + ".txt")).write_bytes(f.read_bytes())
  return root


@pytest.fixture(scope="session")
def store_root(tmp_path_factory) -> pathlib.Path:
  return tmp_path_factory.mktemp("stores")


@pytest.fixture(scope="session")
def bpe_run(small_corpus, tmp_path_factory):
  """A 10-step `tiny` run on a trained 512-id BPE of the small corpus, untied head, one device.

  Returns:
    (config, summary) of the finished run; its workdir holds a checkpoint at step 10.
  """
  from chinchax import train as train_lib
  root = tmp_path_factory.mktemp("bpe_run")
  c = config_lib.get_variant("tiny")
  c.workdir = str(root / "run")
  c.data.update(source="files", paths=str(small_corpus / "*.txt"), store_root=str(root / "stores"),
                val_fraction=0.1, tokenizer="bpe", bpe_vocab_size=512, prepare_workers=1)
  c.model.tie_embeddings = False
  c.budget.steps = 10
  c.train.update(eval_every=5, log_every=5, checkpoint_every=10)
  c.mesh.num_cpu_devices = 0
  return c, train_lib.train(c, devices=jax.devices()[:1], verbose=False)


@pytest.fixture
def tiny_config(small_corpus, store_root, tmp_path):
  """The `tiny` variant on the small corpus, float32, 20 steps, in a fresh workdir."""
  c = config_lib.get_variant("tiny")
  c.workdir = str(tmp_path / "run")
  c.data.source = "files"
  c.data.paths = str(small_corpus / "*.txt")
  c.data.store_root = str(store_root)
  c.data.val_fraction = 0.1
  c.mesh.num_cpu_devices = 0
  return c
