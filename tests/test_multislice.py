"""Multi-slice meshes (``mesh.dcn_data``): layout, bad input, a TPU compile's DCN traffic, and
two CPU processes as two slices training like one process.

The TPU compiles use libtpu's compile-only description of two v5e-16 slices (no TPU present),
each in its own process (``chinchax.aot.search``); the two-process run goes through
``launch/local_multiprocess.sh`` with gloo collectives.
"""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import jax
import pytest

from chinchax import config as config_lib
from chinchax.model import sharding
from chinchax import train as train_lib
from chinchax.aot import hlo
from chinchax.aot import program as program_lib
from chinchax.aot import report as report_lib
from chinchax.aot import search as search_lib
from chinchax.aot import topology

REPO = pathlib.Path(__file__).resolve().parent.parent
LAUNCHER = REPO / "launch" / "local_multiprocess.sh"
needs_libtpu = pytest.mark.skipif(not topology.libtpu_available(),
                                  reason="libtpu not installed (pip install -e '.[tpu]')")


@dataclasses.dataclass(frozen=True)
class FakeDevice:
  id: int
  process_index: int
  platform: str = "cpu"
  device_kind: str = "cpu"
  slice_index: int | None = None


def test_dcn_data_is_the_major_part_of_data_and_keeps_each_process_whole():
  # 4 processes × 2 devices, listed out of order; dcn_data=2 → groups {0,1} and {2,3}
  devices = [FakeDevice(10 * p + i, p) for p in (3, 1, 0, 2) for i in range(2)]
  grid = sharding.hybrid_grid((4, 2, 1), 2, devices)  # data 4 = 2 across × 2 within, fsdp 2
  assert grid.shape == (4, 2, 1)
  procs = [[d.process_index for d in grid[i].flat] for i in range(4)]
  assert {p for row in procs[:2] for p in row} == {0, 1}  # first half of data: group 0
  assert {p for row in procs[2:] for p in row} == {2, 3}
  assert sharding.batch_rows_contiguous(grid)


def test_slice_groups_follow_tpu_slices_and_refuse_a_count_that_does_not_divide():
  devices = [FakeDevice(i, i // 2, platform="tpu", slice_index=i // 4) for i in range(12)]
  groups = sharding.slice_groups(devices, 3)
  assert [{d.slice_index for d in g} for g in groups] == [{0}, {1}, {2}]
  with pytest.raises(config_lib.ConfigError, match=r"mesh.dcn_data=2 does not divide the 3 "
                     r"TPU slices.*use one of 1, 3"):
    sharding.slice_groups(devices, 2)
  uneven = [FakeDevice(i, 0 if i < 3 else 1) for i in range(4)]
  with pytest.raises(config_lib.ConfigError, match=r"\[3, 1\] devices"):
    sharding.slice_groups(uneven, 2)


def test_one_process_is_one_slice_and_data_must_hold_dcn_data():
  with pytest.raises(config_lib.ConfigError, match=r"dcn_data=2 does not divide the 1 "
                     r"processes.*use one of 1$"):
    sharding.make_mesh({"data": 8, "fsdp": 1, "tensor": 1, "dcn_data": 2})
  c = config_lib.get_variant("tiny")
  c.mesh.update(data=1, fsdp=-1, dcn_data=2)
  with pytest.raises(config_lib.ConfigError, match=r"mesh.data=1 must be a multiple of "
                     r"mesh.dcn_data=2"):
    config_lib.resolve_mesh_shape(c.mesh, 8)
  c.mesh.update(data=2)
  assert config_lib.resolve_mesh_shape(c.mesh, 8) == {"data": 2, "fsdp": 4, "tensor": 1}
  c.mesh.update(dcn_data=3, data=-1, fsdp=1)  # two slices: 3 is not a divisor of 2
  target = topology.parse_target("v5e-16", num_slices=2)
  with pytest.raises(config_lib.ConfigError, match=r"mesh.dcn_data=3 does not divide the 2 "
                     r"slices \(--slices\) of v5e-16 × 2 slices; use one of 1, 2"):
    program_lib.check_config(c, target)


def test_groups_that_span_slices_are_charged_to_the_dcn_by_hand():
  text = """HloModule m, num_partitions=8

ENTRY %main (p: f32[1024]) -> f32[1024] {
  %p = f32[1024]{0} parameter(0)
  %a = f32[1024]{0} all-reduce(%p), replica_groups=[2,4]<=[8], to_apply=%add
  ROOT %b = f32[1024]{0} all-reduce(%a), replica_groups=[4,2]<=[2,4]T(1,0), to_apply=%add
}
"""
  slice_of = [0, 0, 0, 0, 1, 1, 1, 1]
  s = hlo.collectives(text, 8, slice_of=slice_of, num_slices=2)
  # %a reduces within each slice; %b pairs device i with i + 4 (one per slice): g=2, s=2, k=1
  assert s.cross_slice_groups == 1 and set(s.dcn) == {"all-reduce"}
  assert s.dcn["all-reduce"]["wire_bytes"] == 2 * 4096 * (2 - 1) / 2
  assert s.total_wire_bytes == 2 * 4096 * 3 / 4 + 2 * 4096 * 1 / 2  # both stay in the ICI sum
  assert hlo.collectives(text, 8).dcn == {}  # no slices given: nothing is looked for


def _tiny(**mesh):
  c = config_lib.get_variant("tiny")
  c.model.update(d_model=256, n_heads=2, d_ff=512)  # multiples of 128: TPU pads nothing
  c.train.global_batch_size = 32
  c.mesh.update(data=1, fsdp=1, tensor=1)
  c.mesh.update(**mesh)
  return c


@needs_libtpu
def test_two_v5e_slices_send_only_the_gradient_reduction_over_the_dcn():
  target = topology.parse_target("v5e-16", num_slices=2)
  rep, _ = search_lib.compile_cached(_tiny(data=2, fsdp=-1, dcn_data=2), target,
                                     eval_step=False, cache_dir=None)
  assert rep["fits"], rep["train_step"]
  col = rep["train_step"]["collectives"]
  # XLA compiles one slice's program: every ICI replica group lies inside a slice, and what
  # crosses slices is the megascale all-reduce of the gradient's per-device shard.
  assert col["partitions"] == 16 and col["cross_slice_groups"] == 0
  assert set(col["dcn"]) == {"all-reduce"}
  n = rep["run"]["N"]
  sent = col["dcn"]["all-reduce"]["operand_bytes"]
  assert 2 * n / 16 <= sent <= 4 * n / 16 * 1.05  # bf16 .. f32 gradient, 1/16 per device
  ro = rep["roofline"]
  assert ro["dcn_bytes"] == col["dcn_wire_bytes"] == pytest.approx(sent)  # 2 slices: ring = P
  assert ro["dcn_s"] == pytest.approx(sent / 3.125e9)
  text = report_lib.render(rep)
  assert "across slices (DCN): all-reduce" in text and ", DCN " in text
  assert any("cross the data-center network" in n for n in rep["notes"])


@pytest.mark.slow
@needs_libtpu
def test_fsdp_over_two_slices_sends_parameter_gathers_over_the_dcn_too():
  """The contrast (benchmarks/multislice.sh): the same devices with fsdp spanning both slices."""
  target = topology.parse_target("v5e-16", num_slices=2)
  flat, _ = search_lib.compile_cached(_tiny(data=1, fsdp=-1), target, eval_step=False,
                                      cache_dir=None)
  assert "all-gather" in flat["train_step"]["collectives"]["dcn"]
  assert any("mesh.dcn_data=2" in n for n in flat["notes"])


@pytest.mark.parametrize("args, words", [
    (("compile", "--slices", "2", "--topology", "v5e-16", "--config=configs/train.py:tiny",
      "--config.mesh.dcn_data=3"), "mesh.dcn_data=3 does not divide the 2 slices"),
    (("train", "--config=configs/train.py:tiny", "--config.mesh.dcn_data=2"),
     "does not divide the 1 processes"),
])
def test_bad_dcn_data_is_one_line_before_any_compile(args, words, tmp_path):
  r = subprocess.run([sys.executable, "-m", "chinchax.cli", *args,
                      f"--config.workdir={tmp_path / 'run'}"],
                     capture_output=True, text=True, timeout=300, cwd=REPO)
  err = [l for l in r.stderr.splitlines() if l.startswith("error:")]
  assert r.returncode == 2 and len(err) == 1 and words in err[0], r.stderr[-2000:]
  assert "Traceback" not in r.stderr and not (tmp_path / "run" / "metrics.jsonl").exists()


def _losses(workdir):
  rows = [json.loads(l) for l in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()
          if l.strip()]
  return {r["step"]: r["loss"] for r in rows}


@pytest.mark.slow
def test_two_processes_as_two_slices_train_like_one_process(small_corpus, store_root,
                                                           tiny_config, tmp_path):
  """mesh data=2 (dcn_data=2: one per process) × fsdp=4 (within a process) over gloo.

  Slow (2–3 minutes on 2 shared cores): ``benchmarks/multislice.sh`` runs it.
  """
  env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu", PYTHON=sys.executable)
  steps = 6
  flags = [f"--config={REPO}/configs/train.py:tiny", f"--config.workdir={tmp_path / 'two'}",
           f"--config.data.store_root={store_root}", "--config.data.source=files",
           f"--config.data.paths={small_corpus}/*.txt", "--config.data.val_fraction=0.1",
           "--config.mesh.data=2", "--config.mesh.fsdp=4", "--config.mesh.dcn_data=2",
           f"--config.budget.steps={steps}", "--config.train.log_every=1",
           "--config.train.peak_flops_per_device=1e9",
           "--config.distributed.initialization_timeout_s=60"]
  proc = subprocess.run(["bash", str(LAUNCHER), "--processes", "2", "--devices", "4",
                         "--log-dir", str(tmp_path / "logs"), "--", *flags],
                        env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
  logs = {p.name: p.read_text() for p in (tmp_path / "logs").glob("*.log")}
  assert proc.returncode == 0, (proc.stderr[-2000:], {k: v[-3000:] for k, v in logs.items()})
  assert "'dcn_data': 2" in logs["process_0.log"]
  two = _losses(tmp_path / "two")
  c = tiny_config.copy_and_resolve_references()
  c.workdir = str(tmp_path / "one")
  c.mesh.update(data=2, fsdp=4, tensor=1)
  c.budget.steps = steps
  c.train.update(log_every=1, peak_flops_per_device=1e9)
  train_lib.train(c, devices=jax.devices()[:8], verbose=False)
  one = _losses(c.workdir)
  assert sorted(one) == sorted(two) == list(range(1, steps + 1))
  worst = max(abs(one[s] - two[s]) / abs(one[s]) for s in one)
  print(f"two processes as two slices vs one process: max relative loss difference {worst:.2e}")
  assert worst <= 1e-5, (one, two)


def test_tpu_pod_launches_every_slice_of_a_multislice_queued_resource():
  def pod(*args):
    return subprocess.run(["bash", str(REPO / "launch" / "tpu_pod.sh"), "--name", "ms",
                           "--zone", "z", "--accelerator-type", "v5e-16", *args],
                          capture_output=True, text=True, timeout=60)

  r = pod("--slices", "2", "--queued", "--dry-run", "--", "--config.mesh.dcn_data=2")
  assert r.returncode == 0, r.stderr
  lines = r.stdout.splitlines()
  assert lines[0].endswith("--config.mesh.dcn_data=2 --slices 2")  # the pre-launch compile
  assert "--node-count=2 --node-prefix=ms" in lines[1]
  runs = [l.split()[6] for l in lines if "chinchax\\ train" in l]
  assert runs == ["ms-0", "ms-1"]
  r = pod("--slices", "2", "--create")
  assert r.returncode == 2 and "use --queued" in r.stderr
