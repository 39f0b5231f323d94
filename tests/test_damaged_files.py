"""Files a crash can leave damaged: a half-written last line of metrics.jsonl, a checkpoint
without its manifest.ocdbt, a truncated rows/<run>.json. Each is handled with one warning
naming the file, and the run goes on as if nothing had happened."""

import json
import pathlib

import jax

from chinchax import ladder
from chinchax import train as train_lib


def _rows(workdir):
  lines = (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()
  return [{k: v for k, v in json.loads(l).items() if k in ("step", "loss", "eval_loss")}
          for l in lines]


def test_torn_metrics_line_and_missing_manifest_resume_with_one_warning_each(tiny_config,
                                                                             capfd):
  c = tiny_config
  c.train.update(checkpoint_every=10, keep_checkpoints=3)
  devices = jax.devices()[:1]
  train_lib.train(c, devices=devices, verbose=False)  # 20 steps: checkpoints 10 and 20
  want = _rows(c.workdir)
  wd = pathlib.Path(c.workdir)
  # Killed while writing step 20's row and checkpoint: a half line, no manifest.
  for m in (wd / "checkpoints" / "20").rglob("manifest.ocdbt"):
    m.unlink()
  metrics = wd / "metrics.jsonl"
  metrics.write_text(metrics.read_text() + '{"step": 20, "loss": 4.1')
  capfd.readouterr()
  train_lib.train(c, devices=devices, verbose=True)
  out, err = capfd.readouterr()
  assert "resumed from checkpoint at step 10" in out
  warnings = [l for l in err.splitlines() if l.startswith("warning:")]
  assert len(warnings) == 2, err[-3000:]
  torn = [w for w in warnings if str(metrics) in w]
  assert len(torn) == 1 and "half-written" in torn[0]
  assert [w for w in warnings if "checkpoint at step 20" in w and "resuming from step 10" in w]
  assert "Event loop is closed" not in err and "Traceback" not in err
  assert _rows(c.workdir) == want  # the resumed run wrote the same rows, no torn line


def test_truncated_row_file_is_set_aside_and_its_run_becomes_unrecorded(tmp_path, capfd):
  table = ladder.ResultsTable(tmp_path / "results.jsonl", ["a", "b"])
  table.upsert({"run_id": "a", "status": "done", "C_budget": 1.0, "N": 1})
  table.upsert({"run_id": "b", "status": "done", "C_budget": 2.0, "N": 2})
  row_b = tmp_path / "rows" / "b.json"
  row_b.write_text(row_b.read_text()[:17])  # a crash mid-write
  capfd.readouterr()
  again = ladder.ResultsTable(tmp_path / "results.jsonl", ["a", "b"])
  assert set(again.rows) == {"a"}  # b is trained again (it resumes from its checkpoints)
  assert again.row("b") is None
  err = capfd.readouterr().err
  assert err.count("warning:") == 1 and str(row_b) in err and "damaged" in err
  assert (tmp_path / "rows" / "b.json.damaged").exists()
  again.merge()
  assert [json.loads(l)["run_id"] for l in (tmp_path / "results.jsonl").read_text().splitlines()
          ] == ["a"]
