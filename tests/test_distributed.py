"""Multi-process start-up, per-process rows, preemption, restore onto other meshes, bad input.

In one process over the 8 virtual CPU devices, plus short subprocesses for start-up
failures. The real two-process runs are in test_distributed_multiprocess.py.
"""

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time
import types

import jax
import numpy as np
import pytest

from chinchax import checkpoint as checkpoint_lib
from chinchax import cli
from chinchax import config as config_lib
from chinchax.runtime import distributed as distributed_lib
from chinchax.model import sharding as sharding_lib
from chinchax import train as train_lib

REPO = pathlib.Path(__file__).resolve().parent.parent


def _losses(workdir):
  rows = [json.loads(l) for l in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]
  return {r["step"]: r["loss"] for r in rows}


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _snapshot(root: pathlib.Path) -> dict:
  """Every file under ``root`` with its size, mtime and content."""
  return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes())
          for p in sorted(root.rglob("*")) if p.is_file()}


# --- config and start-up plan ------------------------------------------------------------------

@pytest.mark.parametrize("overrides, needle", [
    ({"num_processes": 2, "process_id": 2}, "distributed.process_id=2 is out of range for "
                                            "distributed.num_processes=2; use 0..1"),
    ({"num_processes": 4, "process_id": 7}, "distributed.process_id=7 is out of range"),
    ({"process_id": -3}, "distributed.process_id=-3"),
    ({"num_processes": -1}, "distributed.num_processes=-1"),
    ({"mode": "mpi"}, "distributed.mode='mpi' is not one of"),
    ({"coordinator_address": "localhost"}, "distributed.coordinator_address='localhost' must be "
                                           "host:port"),
    ({"coordinator_address": "10.0.0.2:70000", "num_processes": 2, "process_id": 0},
     "port in 1..65535"),
    ({"mode": "explicit"}, "needs distributed.coordinator_address"),
    ({"coordinator_address": "127.0.0.1:1234", "process_id": 0}, "distributed.num_processes=0"),
    ({"coordinator_address": "127.0.0.1:1234", "num_processes": 2}, "distributed.process_id=-1 "
                                                                     "must be set (0..1)"),
    ({"initialization_timeout_s": 0}, "distributed.initialization_timeout_s=0"),
    ({"local_device_ids": "0,x"}, "distributed.local_device_ids='0,x'"),
    ({"cpu_collectives": "nccl"}, "distributed.cpu_collectives='nccl'"),
])
def test_bad_distributed_values_name_themselves(overrides, needle):
  c = config_lib.get_variant("tiny")
  c.distributed.update(**overrides)
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(c)
  assert needle in str(e.value)


def test_process_id_out_of_range_on_the_command_line(capsys, tmp_path):
  rc = cli.main(["train", f"--config={REPO}/configs/train.py:tiny", f"--config.workdir={tmp_path}/run",
                 "--config.mesh.num_cpu_devices=0", "--config.distributed.coordinator_address=127.0.0.1:9",
                 "--config.distributed.num_processes=2", "--config.distributed.process_id=2"])
  err = capsys.readouterr().err.strip().splitlines()
  assert rc == 2 and len(err) == 1, err
  assert err[0].startswith("error: distributed.process_id=2 is out of range"), err
  assert not (tmp_path / "run").exists()


def test_startup_plan_from_config_and_environment():
  d = config_lib.get_variant("tiny").distributed
  assert distributed_lib.plan_startup(d, environ={}).method == "single"
  slurm = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "gpu[01-02]", "SLURM_NTASKS": "16",
           "SLURM_PROCID": "3", "SLURM_LOCALID": "3"}
  assert distributed_lib.plan_startup(d, environ=slurm).method == "slurm"
  assert distributed_lib.plan_startup(d, environ=dict(slurm, SLURM_NTASKS="1")).method == "single"
  assert distributed_lib.plan_startup(d, environ={"TPU_WORKER_HOSTNAMES": "a,b"}).method == "tpu"
  d.mode = "off"
  assert distributed_lib.plan_startup(d, environ=slurm).method == "single"
  d.mode = "slurm"
  with pytest.raises(distributed_lib.DistributedError, match="not a SLURM job step"):
    distributed_lib.plan_startup(d, environ={})
  d.update(mode="auto", coordinator_address="10.1.2.3:4567", num_processes=4, process_id=1,
           local_device_ids="0,1", initialization_timeout_s=9)
  plan = distributed_lib.plan_startup(d, environ=slurm)
  assert plan == distributed_lib.StartupPlan("explicit", "10.1.2.3:4567", 4, 1, (0, 1), 9)


def test_unreachable_coordinator_fails_fast_in_process():
  t0 = time.monotonic()
  with pytest.raises(distributed_lib.DistributedError) as e:
    distributed_lib.wait_for_coordinator(f"127.0.0.1:{_free_port()}", 0.5)
  assert time.monotonic() - t0 < 3
  assert "cannot reach the coordinator" in str(e.value)
  assert "initialization_timeout_s=0.5 s" in str(e.value)


def test_startup_failures_end_with_one_error_line_within_the_timeout(tmp_path):
  """Process 1 with no coordinator, and process 0 whose peer never comes: exit 2 in ~2 s."""
  port = _free_port()
  env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")

  def start(pid):
    return subprocess.Popen(
        [sys.executable, "-m", "chinchax.cli", "train", f"--config={REPO}/configs/train.py:tiny",
         f"--config.workdir={tmp_path}/run{pid}", "--config.mesh.num_cpu_devices=4",
         f"--config.distributed.coordinator_address=127.0.0.1:{port}",
         "--config.distributed.num_processes=2", f"--config.distributed.process_id={pid}",
         "--config.distributed.initialization_timeout_s=2"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

  t0 = time.monotonic()
  lonely = start(1)  # nobody listens on the port
  out, err = lonely.communicate(timeout=60)
  assert lonely.returncode == 2, err[-2000:]
  lines = [l for l in err.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: cannot reach the coordinator at "
                                                 f"distributed.coordinator_address='127.0.0.1:{port}'"), err
  assert "initialization_timeout_s=2 s" in lines[0]

  waiting = start(0)  # starts the coordinator, but process 1 never joins
  out, err = waiting.communicate(timeout=60)
  assert waiting.returncode == 2, err[-2000:]
  errors = [l for l in err.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and "did not complete within distributed.initialization_timeout_s=2 s" in \
      errors[0] and "process 0 of 2" in errors[0], err
  assert time.monotonic() - t0 < 50
  assert not (tmp_path / "run0").exists() and not (tmp_path / "run1").exists()


# --- rows per process and mesh order -----------------------------------------------------------

def _fake_devices(process_of):
  return [types.SimpleNamespace(id=i, process_index=p) for i, p in enumerate(process_of)]


def test_each_process_holds_one_contiguous_block_of_batch_rows():
  devs = _fake_devices([0, 0, 0, 0, 1, 1, 1, 1])
  assert sharding_lib.batch_rows_contiguous(np.asarray(devs, dtype=object).reshape(2, 4, 1))
  assert sharding_lib.batch_rows_contiguous(np.asarray(devs, dtype=object).reshape(1, 4, 2))
  assert sharding_lib.batch_rows_contiguous(np.asarray(devs, dtype=object).reshape(1, 1, 8))
  interleaved = _fake_devices([0, 1, 0, 1, 0, 1, 0, 1])
  assert not sharding_lib.batch_rows_contiguous(np.asarray(interleaved, dtype=object).reshape(1, 8, 1))
  # One process owns every row of the batch.
  mesh = sharding_lib.make_mesh({"data": 2, "fsdp": 4, "tensor": 1})
  assert distributed_lib.process_row_range(sharding_lib.batch_sharding(mesh), 16) == (0, 16)


# --- preemption (single process) and mismatched checkpoints ------------------------------------

@pytest.fixture(scope="module")
def preempted_run(small_corpus, store_root, tmp_path_factory):
  """A tiny run on 8 devices that gets SIGTERM before it starts: it stops after step 1."""
  c = config_lib.get_variant("tiny")
  c.workdir = str(tmp_path_factory.mktemp("preempted") / "run")
  c.data.update(source="files", paths=str(small_corpus / "*.txt"), store_root=str(store_root),
                val_fraction=0.1)
  c.mesh.num_cpu_devices = 0
  c.train.update(log_every=1, peak_flops_per_device=1e9)
  previous = signal.getsignal(signal.SIGTERM)
  try:
    assert distributed_lib.install_sigterm_handler()
    os.kill(os.getpid(), signal.SIGTERM)
    assert distributed_lib.reached_preemption(0)
    with pytest.raises(distributed_lib.Preempted) as e:
      train_lib.train(c, verbose=False)
  finally:
    signal.signal(signal.SIGTERM, previous)
    distributed_lib._sigterm_received.clear()
  return c, e.value


def test_sigterm_checkpoints_at_the_next_step_and_exits(preempted_run):
  c, preempted = preempted_run
  workdir = pathlib.Path(c.workdir)
  assert preempted.step == 1 and "relaunch the same command" in str(preempted)
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == ["1"]
  assert max(_losses(workdir)) == 1
  assert not (workdir / "summary.json").exists()
  assert not distributed_lib.reached_preemption(2)


@pytest.mark.parametrize("drop_config_json, override, needle", [
    (False, ("d_model", 64), "model.d_model=32, but the config says model.d_model=64"),
    (True, ("d_ff", 96), "params/blocks/0/mlp/"),
    (True, ("n_layers", 3), "has no array params/blocks/2/"),
])
def test_mismatched_checkpoint_is_refused_and_nothing_is_overwritten(
    preempted_run, tmp_path, drop_config_json, override, needle):
  c0, _ = preempted_run
  c = c0.copy_and_resolve_references()
  c.workdir = str(tmp_path / "copy")
  shutil.copytree(c0.workdir, c.workdir)
  if drop_config_json:  # a checkpoint copied without its config.json: the array shapes decide
    (pathlib.Path(c.workdir) / "config.json").unlink()
  before = _snapshot(pathlib.Path(c.workdir))
  c.model[override[0]] = override[1]
  with pytest.raises(checkpoint_lib.CheckpointError) as e:
    train_lib.train(c, verbose=False)
  assert needle in str(e.value), str(e.value)
  if drop_config_json:
    assert "shape" in str(e.value) or "has no array" in str(e.value)
  assert _snapshot(pathlib.Path(c.workdir)) == before


# --- restore onto another mesh and device count ------------------------------------------------

def _restore(config, workdir, devices):
  spec = train_lib.resolve(config, len(devices))
  mesh = sharding_lib.make_mesh(spec.mesh, devices)
  program = train_lib.build_program(config, spec, mesh)
  abs_state, shardings = program.abstract_state, program.shardings
  ckpt = checkpoint_lib.Checkpointer(pathlib.Path(workdir) / "checkpoints", 10, 2)
  state = ckpt.restore_latest(abs_state, shardings)
  ckpt.wait_and_close()
  for leaf, sh in zip(jax.tree.leaves(state), jax.tree.leaves(shardings)):
    assert leaf.sharding.is_equivalent_to(sh, leaf.ndim)
  return jax.tree.map(np.asarray, jax.device_get(state))


def test_checkpoint_restores_onto_other_meshes_and_device_counts(tiny_config, tmp_path):
  """(data=2, fsdp=4) on 8 devices → (fsdp=4) on 4 devices and → 1 device: same state, same losses."""
  c = tiny_config
  c.train.update(log_every=1, checkpoint_every=10, peak_flops_per_device=1e9)
  c.mesh.update(data=2, fsdp=4, tensor=1)
  devices = jax.devices()
  train_lib.train(c, devices=devices[:8], verbose=False)
  original = _losses(c.workdir)
  assert sorted(original) == list(range(1, 21))

  ref_state = None
  for name, mesh, n in [("orig", (2, 4, 1), 8), ("fsdp4", (1, 4, 1), 4), ("one", (1, 1, 1), 1)]:
    cc = c.copy_and_resolve_references()
    cc.workdir = str(tmp_path / name)
    cc.mesh.update(data=mesh[0], fsdp=mesh[1], tensor=mesh[2])
    shutil.copytree(c.workdir, cc.workdir)
    shutil.rmtree(pathlib.Path(cc.workdir) / "checkpoints" / "20")  # resume from step 10
    state = _restore(cc, cc.workdir, devices[:n])
    assert int(state["step"]) == 10
    if ref_state is None:
      ref_state = state
    else:  # parameters, optimizer state and step exactly as saved
      jax.tree.map(np.testing.assert_array_equal, state, ref_state)
    if name == "orig":
      continue
    summary = train_lib.train(cc, devices=devices[:n], verbose=False)
    assert summary["resumed"] and summary["steps"] == 20
    resumed = _losses(cc.workdir)
    for s in range(11, 21):
      assert resumed[s] == pytest.approx(original[s], rel=1e-5, abs=1e-5), (name, s)


def test_fsdp8_state_is_sharded_not_replicated():
  """Per-device bytes of params + optimizer state ≤ total / 8 + what is replicated on purpose:
  scalars and the norm scales (d_model each, with their Adam moments: replicated so that fsdp
  neither gathers them at each use nor reduces their gradients alone; model.sharding)."""
  c = config_lib.get_variant("tiny")
  spec = train_lib.resolve(c, 8)
  mesh = sharding_lib.make_mesh({"data": 1, "fsdp": 8, "tensor": 1})
  state = train_lib.build_program(c, spec, mesh).init_state()
  dev0 = jax.devices()[0]
  total = per_device = replicated = 0
  replicated_leaves = []
  for path, leaf in jax.tree_util.tree_flatten_with_path({"params": state["params"],
                                                          "opt_state": state["opt_state"]})[0]:
    on_dev0 = sum(s.data.nbytes for s in leaf.addressable_shards if s.device == dev0)
    total += leaf.nbytes
    per_device += on_dev0
    if on_dev0 == leaf.nbytes:
      replicated += leaf.nbytes
      replicated_leaves.append((jax.tree_util.keystr(path), leaf.shape))
    else:
      assert on_dev0 * 8 == leaf.nbytes, (jax.tree_util.keystr(path), leaf.shape)
  d = c.model.d_model
  scales = [p for p, shape in replicated_leaves if shape == (d,)]
  assert all(shape == () or (shape == (d,) and "norm" in p and "scale" in p)
             for p, shape in replicated_leaves), replicated_leaves
  n_norms = 2 * c.model.n_layers + 1  # two per block and the final one
  assert len(scales) == 3 * n_norms, scales  # the params, Adam's mu and nu
  assert replicated <= 64 + 4 * d * len(scales)
  assert per_device <= total / 8 + replicated
  assert total > 3 * 4 * spec.counts.total * 0.99  # params + Adam mu + nu, float32
