"""TensorBoard event files next to metrics.jsonl, read back with tensorboard's own event reader."""

import json
import pathlib

import pytest

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
event_multiplexer = pytest.importorskip("tensorboard.backend.event_processing.plugin_event_multiplexer")

from chinchax.tracking import tblog


def _scalars(logdir):
  acc = event_accumulator.EventAccumulator(str(logdir))
  acc.Reload()
  return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def test_training_run_writes_readable_events(bpe_run):
  """Acceptance 5: every metrics.jsonl value is a TensorBoard scalar at its step."""
  c, _ = bpe_run
  workdir = pathlib.Path(c.workdir)
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  got = _scalars(workdir / tblog.TB_DIR)
  assert {"train/loss", "train/bits_per_byte", "eval/loss", "eval/bits_per_byte", "train/lr",
          "train/grad_norm", "perf/tokens_per_s", "perf/mfu"} <= set(got)
  for key in ("loss", "bits_per_byte", "eval_loss", "eval_bits_per_byte", "lr"):
    want = [(r["step"], r[key]) for r in rows if key in r]
    assert [s for s, _ in got[tblog.tag(key)]] == [s for s, _ in want]
    assert [v for _, v in got[tblog.tag(key)]] == pytest.approx([v for _, v in want], rel=1e-6)


def test_resume_purges_steps_after_the_checkpoint_and_runs_are_separate(tmp_path):
  run_a = tmp_path / "ladder" / "run_a" / tblog.TB_DIR
  w = tblog.ScalarWriter(run_a)
  for step in range(1, 11):
    w.write({"step": step, "loss": 10.0 - step, "tokens": step * 100, "note": "text is skipped"})
  w.close()
  w = tblog.ScalarWriter(run_a, purge_step=7)  # resumed from the checkpoint at step 6
  for step in range(7, 9):
    w.write({"step": step, "loss": 100.0 + step, "eval_loss": float("nan")})
  w.close()
  got = _scalars(run_a)
  assert set(got) == {"train/loss"}
  assert got["train/loss"] == [(s, 10.0 - s) for s in range(1, 7)] + [(7, 107.0), (8, 108.0)]
  w = tblog.ScalarWriter(tmp_path / "ladder" / "run_b" / tblog.TB_DIR)
  w.write({"step": 1, "loss": 1.0, "eval_loss": 2.0, "mfu": 0.5})
  w.close()
  mux = event_multiplexer.EventMultiplexer()
  mux.AddRunsFromDirectory(str(tmp_path / "ladder"))
  mux.Reload()
  assert sorted(mux.Runs()) == ["run_a/tensorboard", "run_b/tensorboard"]
  assert {"train/loss", "eval/loss", "perf/mfu"} <= set(_scalars(tmp_path / "ladder" / "run_b" / tblog.TB_DIR))
