"""train.wandb: a run's W&B files (offline mode, no network) hold TensorBoard's scalars and the
config; a ladder's runs share its group; the fit's figures and numbers go to a run "fit"."""

import glob
import json
import pathlib
import struct
import time

import jax
import pytest

wandb = pytest.importorskip("wandb", reason="wandb is not installed (pip install 'chinchax[wandb]')")
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

from wandb.proto import wandb_internal_pb2  # noqa: E402

from chinchax import config as config_lib  # noqa: E402
from chinchax.tracking import tblog
from chinchax.tracking import wandblog

_BLOCK = 32768  # the .wandb file is a LevelDB log: 32 KiB blocks of 7-byte-header chunks


def _records(run_dir: pathlib.Path) -> list:
  """Every protobuf Record of an offline run's ``run-*.wandb`` file."""
  (path,) = glob.glob(str(run_dir / "run-*.wandb"))
  data = pathlib.Path(path).read_bytes()
  assert data[:4] == b":W&B"
  out, pos, part = [], 7, b""
  while pos + 7 <= len(data):
    if _BLOCK - pos % _BLOCK < 7:  # a block's tail too short for a header is padding
      pos += _BLOCK - pos % _BLOCK
      continue
    _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
    if pos + 7 + length > len(data):  # a chunk still being written
      break
    chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
    if kind == 0:
      break
    part = chunk if kind in (1, 2) else part + chunk  # full / first / middle / last
    if kind in (1, 4):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(part)
      out.append(record)
  return out


def _records_once_written(run_dir: pathlib.Path, tags: set[str], timeout_s: float = 60.0) -> list:
  """The run file's records once its history holds ``tags`` (W&B's service may still be writing
  the file when ``finish`` returns), or as they are after ``timeout_s``."""
  deadline = time.monotonic() + timeout_s
  while True:
    records = _records(run_dir)
    if tags <= set(_history(records)) or time.monotonic() > deadline:
      return records
    time.sleep(0.5)


def _history(records) -> dict[str, list]:
  """tag → [(step, value)] of the history records (W&B's own keys left out)."""
  out = {}
  for r in records:
    if r.WhichOneof("record_type") != "history":
      continue
    items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
    for k, v in items.items():
      if not k.startswith("_"):
        out.setdefault(k, []).append((items["_step"], v))
  return out


def _run_record(records):
  return next(r.run for r in records if r.WhichOneof("record_type") == "run")


def test_a_run_logs_tensorboards_scalars_and_its_config_offline(small_corpus, store_root,
                                                                 tmp_path, monkeypatch):
  from chinchax import train as train_lib
  monkeypatch.setenv("WANDB_MODE", "offline")
  c = config_lib.get_variant("tiny")
  c.workdir = str(tmp_path / "run")
  c.data.update(source="files", paths=str(small_corpus / "*.txt"), store_root=str(store_root),
                val_fraction=0.1)
  c.budget.steps = 10
  c.train.update(eval_every=5, log_every=5, checkpoint_every=10, wandb=True,
                 wandb_project="chinchax-test", wandb_mode="offline", wandb_group="g1")
  c.mesh.num_cpu_devices = 0
  train_lib.train(c, devices=jax.devices()[:1], verbose=False)
  workdir = pathlib.Path(c.workdir)
  acc = event_accumulator.EventAccumulator(str(workdir / tblog.TB_DIR))
  acc.Reload()
  tb = {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
  (run_dir,) = (workdir / "wandb").glob("offline-run-*")
  records = _records_once_written(run_dir, set(tb))
  got = _history(records)
  assert {"train/loss", "eval/loss", "train/lr", "perf/mfu"} <= set(tb)
  assert set(got) == set(tb)
  for tag, points in tb.items():
    assert [s for s, _ in got[tag]] == [s for s, _ in points], tag
    assert [v for _, v in got[tag]] == pytest.approx([v for _, v in points], rel=1e-6), tag
  run = _run_record(records)
  assert (run.project, run.display_name, run.run_group) == ("chinchax-test", "run", "g1")
  assert run.run_id == wandblog.run_id("chinchax-test", str(workdir))
  config = {i.key: json.loads(i.value_json) for i in run.config.update}
  assert config["train"]["seq_len"] == 32 and config["model"]["d_model"] == 32


def test_bad_knobs_are_one_config_error(monkeypatch):
  c = config_lib.get_variant("tiny")
  c.train.update(wandb=True, wandb_mode="sometimes")
  with pytest.raises(config_lib.ConfigError, match="train.wandb_mode='sometimes'"):
    config_lib.validate(c)
  c.train.update(wandb_mode="offline", wandb_project=" ")
  with pytest.raises(config_lib.ConfigError, match="wandb_project is empty"):
    config_lib.validate(c)
  c.train.wandb_project = "p"
  monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
  with pytest.raises(config_lib.ConfigError, match=r"pip install 'chinchax\[wandb\]'"):
    config_lib.validate(c)


def test_a_ladder_is_one_group_and_its_fit_a_run_with_the_figures(tmp_path, monkeypatch):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  monkeypatch.setenv("WANDB_MODE", "offline")
  ladder = config_lib.get_ladder_variant("tiny")
  ladder.workdir = str(tmp_path / "my-ladder")
  ladder.train_config.train.update(wandb=True, wandb_project="p", wandb_mode="offline")
  run_cfg = config_lib.get_variant("tiny")
  run_cfg.train.update(wandb=True, wandb_name="ignored")
  wandblog.name_ladder_run(run_cfg, ladder.workdir, "C1e10_N1000")
  assert (run_cfg.train.wandb_group, run_cfg.train.wandb_name) == ("my-ladder", "C1e10_N1000")
  fit = tmp_path / "my-ladder" / "fit"
  fit.mkdir(parents=True)
  plt.plot([1, 2], [3, 4])
  plt.savefig(fit / "isoflop.png")
  (fit / "fit.json").write_text(json.dumps({"approach3": {"A": 406.4, "alpha": 0.34},
                                            "note": "text", "points": [1, 2]}))
  assert wandblog.log_fit(ladder, fit)
  (run_dir,) = (fit / "wandb").glob("offline-run-*")
  records = _records_once_written(run_dir, {"fit/approach3/A", "fit/isoflop/_type"})
  got = _history(records)
  assert got["fit/approach3/A"] == [(0, 406.4)] and got["fit/approach3/alpha"] == [(0, 0.34)]
  assert got["fit/isoflop/_type"] == [(0, "image-file")]  # the figure, as an image file
  run = _run_record(records)
  assert (run.display_name, run.run_group, run.job_type) == ("fit", "my-ladder", "fit")
