"""Acceptance 5: a config written by `chinchax plan` trains end to end and sees the plan's D."""

import contextlib
import importlib.util
import io
import json

import jax

from chinchax.cli import plan as plan_cli
from chinchax import train as train_lib


def test_planned_config_trains_to_planned_tokens(small_corpus, store_root, tmp_path):
  target = tmp_path / "planned.py"
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    rc = plan_cli.main(["--flops", "1e10", "--hardware", "cpu", "--json",
                        "--write-config", str(target), "--workdir", str(tmp_path / "run")])
  assert rc == 0
  planned = json.loads(out.getvalue())
  spec = importlib.util.spec_from_file_location("planned_config", target)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  cfg = mod.get_config()
  # Only the environment changes: this machine's small test corpus and store, no progress bar.
  cfg.data.update(source="files", paths=str(small_corpus / "*.txt"), store_root=str(store_root),
                  val_fraction=0.1)
  cfg.train.progress = False
  summary = train_lib.train(cfg, devices=jax.devices()[:1])
  assert summary["tokens"] == planned["D"]
  assert summary["steps"] == planned["steps"]
  assert summary["params_total"] == planned["N"]
  assert summary["final_eval_loss"] < summary["val_unigram_entropy_nats"]  # it learned something
