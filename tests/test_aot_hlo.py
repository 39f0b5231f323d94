"""The compile report's collective count on literal HLO, slice membership of compile-only TPU
devices, and attention=auto's choice (with a splash program compiled by libtpu).

The HLO snippets are the forms XLA prints: TPU async-collective fusions (start, continuation
and done fusions holding copies of one all-gather under one channel_id), generic
``async-start``/``async-done`` wrappers, and GPU ``all-reduce-start`` in the older (results
only) and newer ((operands, results, contexts)) print formats.
"""

import json
import subprocess
import sys

import pytest

from chinchax.aot import hlo
from chinchax.aot import search as search_lib
from chinchax.aot import topology
from chinchax import config as config_lib
from chinchax.model import attention as attention_lib

needs_libtpu = pytest.mark.skipif(not topology.libtpu_available(),
                                  reason="libtpu not installed (pip install -e '.[tpu]')")

# One FSDP all-gather (bf16[256,2,128] = 131,072 B gathered over 4 devices) as libtpu
# schedules it inside a scanned layer loop of 12: start, two continuations, done.
_TPU_ASYNC = """HloModule tpu, num_partitions=4

%fused_start (param_0.1: bf16[64,2,128]) -> (bf16[64,2,128], bf16[256,2,128], u32[]) {
  %param_0.1 = bf16[64,2,128]{2,0,1:T(8,128)(2,1)} parameter(0)
  %all-gather.1 = bf16[256,2,128]{2,0,1:T(8,128)(2,1)} all-gather(%param_0.1), channel_id=8, replica_groups=mesh['axis_0'=4,'axis_1'=1] {'axis_0'}, dimensions={0}, use_global_device_ids=true
  ROOT %custom-call.5 = (bf16[64,2,128]{2,0,1:T(8,128)(2,1)S(1)}, bf16[256,2,128]{2,0,1:T(8,128)(2,1)S(1)}, u32[]{:S(2)}) custom-call(%all-gather.1), custom_call_target="AsyncCollectiveStart"
}

%fused_cont (param_0.2: bf16[64,2,128]) -> (f32[2,32,2,128], bf16[256,2,128]) {
  %param_0.2 = bf16[64,2,128]{2,0,1:T(8,128)(2,1)} parameter(0)
  %all-gather.2 = bf16[256,2,128]{2,0,1:T(8,128)(2,1)S(1)} all-gather(%param_0.2), channel_id=8, replica_groups=mesh['axis_0'=4,'axis_1'=1] {'axis_0'}, dimensions={0}, use_global_device_ids=true
  ROOT %tuple.9 = (f32[2,32,2,128]{3,1,2,0:T(8,128)S(1)}, bf16[256,2,128]{2,0,1:T(8,128)(2,1)S(1)}) tuple(%convert, %all-gather.2)
}

%fused_cont.1 (param_0.3: bf16[64,2,128]) -> (f32[2,32,2,128], bf16[256,2,128]) {
  %param_0.3 = bf16[64,2,128]{2,0,1:T(8,128)(2,1)} parameter(0)
  %all-gather.3 = bf16[256,2,128]{2,0,1:T(8,128)(2,1)S(1)} all-gather(%param_0.3), channel_id=8, replica_groups=mesh['axis_0'=4,'axis_1'=1] {'axis_0'}, dimensions={0}, use_global_device_ids=true
  ROOT %tuple.10 = (f32[2,32,2,128]{3,1,2,0:T(8,128)S(1)}, bf16[256,2,128]{2,0,1:T(8,128)(2,1)S(1)}) tuple(%convert, %all-gather.3)
}

%fused_done (param_0.4: bf16[64,2,128]) -> bf16[256,2,128] {
  %param_0.4 = bf16[64,2,128]{2,0,1:T(8,128)(2,1)} parameter(0)
  %all-gather.4 = bf16[256,2,128]{2,0,1:T(8,128)(2,1)} all-gather(%param_0.4), channel_id=8, replica_groups=mesh['axis_0'=4,'axis_1'=1] {'axis_0'}, dimensions={0}, use_global_device_ids=true
  ROOT %custom-call.7 = bf16[256,2,128]{2,0,1:T(8,128)(2,1)S(1)} custom-call(%param_0.4, %all-gather.4), custom_call_target="AsyncCollectiveDone"
}

%body (p: (s32[], bf16[64,2,128])) -> (s32[], bf16[64,2,128]) {
  %p = (s32[], bf16[64,2,128]) parameter(0)
  %s = (bf16[64,2,128], bf16[256,2,128], u32[]) fusion(%w), kind=kCustom, calls=%fused_start
  %c1 = (f32[2,32,2,128], bf16[256,2,128]) fusion(%s), kind=kCustom, calls=%fused_cont
  %c2 = (f32[2,32,2,128], bf16[256,2,128]) fusion(%c1), kind=kCustom, calls=%fused_cont.1
  %d = bf16[256,2,128]{2,0,1} fusion(%c2), kind=kCustom, calls=%fused_done
  %cp = (bf16[4]{0}, bf16[4]{0}, u32[], u32[]) collective-permute-start(%b), channel_id=9, source_target_pairs={{0,1},{1,0}}
  %cpd = bf16[4]{0} collective-permute-done(%cp)
  ROOT %t = (s32[], bf16[64,2,128]) tuple(%i, %w)
}

%cond (p: (s32[], bf16[64,2,128])) -> pred[] {
  ROOT %lt = pred[] compare(%a, %b), direction=LT
}

ENTRY %main (a: bf16[64,2,128]) -> bf16[64,2,128] {
  %w = (s32[], bf16[64,2,128]) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"12"}}
  ROOT %r = bf16[64,2,128]{2,0,1} copy(%a)
}
"""


def test_tpu_async_collective_fusions_count_once():
  s = hlo.collectives(_TPU_ASYNC, n_devices=4)
  size = 256 * 2 * 128 * 2
  assert s.count["all-gather"] == 12  # one per layer, not one per start/continuation/done
  assert s.operand_bytes["all-gather"] == 12 * size / 4
  assert s.wire_bytes["all-gather"] == 12 * size * 3 / 4
  assert s.count["collective-permute"] == 12 and s.operand_bytes["collective-permute"] == 12 * 8


def test_a_channel_counts_again_in_another_loop_iteration_and_computation():
  """The once-per-channel rule holds within one run of a computation: the loop body's
  collective still counts per iteration, and two loops calling copies count apart."""
  text = _TPU_ASYNC.replace(
      '  ROOT %r = bf16[64,2,128]{2,0,1} copy(%a)',
      '  %w2 = (s32[], bf16[64,2,128]) while(%w), condition=%cond, body=%body, '
      'backend_config={"known_trip_count":{"n":"2"}}\n  ROOT %r = bf16[64,2,128]{2,0,1} copy(%a)')
  assert hlo.collectives(text, n_devices=4).count["all-gather"] == 14


_GENERIC_ASYNC = """HloModule gpu, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  ROOT %s = f32[] add(%x, %y)
}

%wrapped_rs (p0: f32[64,8]) -> f32[8,8] {
  %p0 = f32[64,8]{1,0} parameter(0)
  ROOT %rs = f32[8,8]{1,0} reduce-scatter(%p0), channel_id=3, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}, to_apply=%add
}

ENTRY %main (a: f32[64,8]) -> f32[8,8] {
  %a = f32[64,8]{1,0} parameter(0)
  %rs-start = ((f32[64,8]{1,0}), f32[8,8]{1,0}, u32[]) async-start(%a), calls=%wrapped_rs
  %rs-update = ((f32[64,8]{1,0}), f32[8,8]{1,0}, u32[]) async-update(%rs-start), calls=%wrapped_rs
  ROOT %rs-done = f32[8,8]{1,0} async-done(%rs-update), calls=%wrapped_rs
}
"""


def test_generic_async_wrapper_counts_once():
  s = hlo.collectives(_GENERIC_ASYNC, n_devices=8)
  assert s.count["reduce-scatter"] == 1
  assert s.operand_bytes["reduce-scatter"] == 8 * 8 * 4 * 8  # result × group = the operand
  assert s.wire_bytes["reduce-scatter"] == 8 * 8 * 4 * 7


_ALL_REDUCE = """HloModule gpu, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  ROOT %s = f32[] add(%x, %y)
}

ENTRY %main (a: f32[1024], b: f32[256]) -> f32[1024] {
  %a = f32[1024]{0} parameter(0)
  %b = f32[256]{0} parameter(1)
  STARTS
  ROOT %r = f32[1024]{0} copy(%a)
}
"""


@pytest.mark.parametrize("starts, nbytes", [
    # older format: the start's shape is its results
    ("%s = f32[1024]{0} all-reduce-start(%a), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, "
     "to_apply=%add\n  %d = f32[1024]{0} all-reduce-done(%s)", 4096),
    ("%s = (f32[1024]{0}, f32[256]{0}) all-reduce-start(%a, %b), channel_id=1, "
     "replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add\n"
     "  %d = (f32[1024]{0}, f32[256]{0}) all-reduce-done(%s)", 5120),
    # newer format: (operands, results, context scalars)
    ("%s = (f32[1024]{0}, f32[1024]{0}, u32[], u32[]) all-reduce-start(%a), channel_id=1, "
     "replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add\n  %d = f32[1024]{0} all-reduce-done(%s)",
     4096),
    ("%s = (f32[1024]{0}, f32[256]{0}, f32[1024]{0}, f32[256]{0}, u32[], u32[]) "
     "all-reduce-start(%a, %b), channel_id=1, replica_groups=[1,8]<=[8], to_apply=%add\n"
     "  %d = (f32[1024]{0}, f32[256]{0}) all-reduce-done(%s)", 5120),
])
def test_gpu_all_reduce_start_bytes_in_both_print_formats(starts, nbytes):
  s = hlo.collectives(_ALL_REDUCE.replace("STARTS", starts), n_devices=8)
  assert s.count["all-reduce"] == 1
  assert s.operand_bytes["all-reduce"] == nbytes
  assert s.wire_bytes["all-reduce"] == 2 * nbytes * 7 / 8


def test_start_result_bytes_forms():
  assert hlo.start_result_bytes("((bf16[4]{0}, bf16[4]{0}), (bf16[16]{0}, bf16[16]{0}))", 2) == 64
  assert hlo.start_result_bytes("(bf16[4]{0}, bf16[16]{0})", 1) == 32  # all-gather-start
  assert hlo.start_result_bytes("(bf16[4]{0}, bf16[4]{0}, u32[]{:S(2)}, u32[]{:S(2)})", 1) == 8


def _slice_keys(spec: str, slices: int) -> list[int]:
  """slice_key of each compile-only device of a target, in a child process (libtpu's lock)."""
  code = ("import json; from chinchax.aot import topology as t; "
          "from chinchax.model import sharding as s; "
          f"d = t.compile_devices(t.parse_target({spec!r}, num_slices={slices})); "
          "print(json.dumps([[s.slice_key(x) for x in d], [x.process_index for x in d]]))")
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-2000:]
  return json.loads(r.stdout.strip().splitlines()[-1])


@needs_libtpu
def test_compile_only_tpu_devices_take_their_slice_from_the_topology():
  keys, hosts = _slice_keys("v5e-16", 1)
  assert len(set(hosts)) == 4  # v5e-16 sits on 4 hosts of 4 chips ...
  assert set(keys) == {0}  # ... of one slice: nothing between them crosses the DCN
  keys, hosts = _slice_keys("v5e-8", 2)
  assert keys == [0] * 8 + [1] * 8 and len(set(hosts)) == 4


@pytest.mark.parametrize("impl, backend, dtype, seq_len, want", [
    ("auto", "tpu", "bfloat16", 1024, "splash"), ("auto", "tpu", "bfloat16", 96, "xla"),
    ("auto", "tpu", "float32", 2048, "splash"), ("auto", "tpu", "bfloat16", 1000, "xla"),
    ("auto", "gpu", "bfloat16", 1024, "cudnn"), ("auto", "gpu", "float32", 1024, "xla"),
    ("auto", "cpu", "float32", 1024, "xla"), ("auto", "cpu", "bfloat16", 1024, "xla"),
    ("splash", "tpu", "bfloat16", 1000, "xla"), ("xla", "tpu", "bfloat16", 1024, "xla"),
])
def test_auto_attention_per_backend_and_seq_len(impl, backend, dtype, seq_len, want):
  pytest.importorskip("jax.experimental.pallas.ops.tpu.splash_attention")
  assert attention_lib.resolve_impl(impl, backend, dtype, seq_len=seq_len) == want
  assert attention_lib.resolve_impl("auto", "tpu", "bfloat16", document_mask=True) == "xla"


def test_splash_blocks_follow_seq_len():
  assert [attention_lib.splash_block(t) for t in (64, 128, 384, 512, 1536, 2048, 1000)] == [
      None, 128, 128, 512, 512, 512, None]
  assert attention_lib.splash_block(768) == 256


@needs_libtpu
def test_auto_attention_compiles_splash_for_a_tpu(tmp_path):
  c = config_lib.get_variant("tiny")
  c.model.update(d_model=256, n_heads=2, d_ff=512)
  c.train.seq_len = 512
  c.mesh.update(data=2, fsdp=2, tensor=1)
  rep, _ = search_lib.compile_cached(c, topology.parse_target("v5e-4"), eval_step=False,
                                     cache_dir=tmp_path)
  assert rep["run"]["attention"] == "splash"
  assert rep["fits"], rep["train_step"]
  c.model.attention = "xla"
  xla, _ = search_lib.compile_cached(c, topology.parse_target("v5e-4"), eval_step=False,
                                     cache_dir=tmp_path)
  assert xla["run"]["attention"] == "xla" and xla["fits"]
  # another program: the kernel in place of the einsum attention (at this size its block
  # buffers outweigh the [B, H, T, T] probabilities it does not keep, so no order is asserted)
  assert rep["train_step"]["memory"] != xla["train_step"]["memory"]
