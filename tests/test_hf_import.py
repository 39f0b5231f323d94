"""train.init_from=hf:DIR: HF Llama safetensors checkpoints into chinchax, the inverse of export.

HF directories are written by ``chinchax export`` itself and by hand with the real
``safetensors`` library (``safetensors.numpy.save_file``), single-file and sharded.
"""

import json
import pathlib

import jax
import ml_dtypes
import numpy as np
import pytest

st = pytest.importorskip("safetensors.numpy")

from chinchax import cli  # noqa: E402
from chinchax import config as config_lib  # noqa: E402
from chinchax.export import writer as export  # noqa: E402
from chinchax.model import sharding as sharding_lib
from chinchax import train as train_lib  # noqa: E402
from chinchax.export import hf_load, hf_source  # noqa: E402
from chinchax.export.error import HFCheckpointError  # noqa: E402
from chinchax.train import spec as spec_lib  # noqa: E402
from chinchax.train import step as step_lib  # noqa: E402
from chinchax.train.rundata import prepare_data  # noqa: E402


def _config(small_corpus, store_root, workdir, init_from=""):
  """The default model knobs (so an HF checkpoint may set them), a 2-step tiny-sized run."""
  c = config_lib.get_variant("default")
  c.workdir = str(workdir)
  c.data.update(source="files", paths=str(small_corpus / "*.txt"), store_root=str(store_root),
                val_fraction=0.1)
  c.train.update(global_batch_size=8, seq_len=32, warmup_steps=1, eval_every=2, eval_batches=1,
                 log_every=1, checkpoint_every=2, init_from=init_from)
  c.budget.update(mode="steps", steps=2)
  c.mesh.num_cpu_devices = 0
  return c


def _hand_tensors(D=32, H=4, G=2, F=48, V=300, L=2, tied=False, seed=0):
  """Random HF Llama tensors with the shapes written out by hand (K = D / H)."""
  rng = np.random.default_rng(seed)
  K = D // H
  r = lambda *s: rng.normal(0, 0.3, size=s).astype(np.float32)  # noqa: E731
  out = {"model.embed_tokens.weight": r(V, D), "model.norm.weight": 1 + r(D)}
  for i in range(L):
    p = f"model.layers.{i}."
    out.update({p + "input_layernorm.weight": 1 + r(D),
                p + "post_attention_layernorm.weight": 1 + r(D),
                p + "self_attn.q_proj.weight": r(H * K, D),
                p + "self_attn.k_proj.weight": r(G * K, D),
                p + "self_attn.v_proj.weight": r(G * K, D),
                p + "self_attn.o_proj.weight": r(D, H * K),
                p + "mlp.gate_proj.weight": r(F, D), p + "mlp.up_proj.weight": r(F, D),
                p + "mlp.down_proj.weight": r(D, F)})
  if not tied:
    out["lm_head.weight"] = r(V, D)
  return out


def _hand_config(D=32, H=4, G=2, F=48, V=300, L=2, tied=False, **extra):
  return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": D,
          "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": G,
          "intermediate_size": F, "vocab_size": V, "tie_word_embeddings": tied,
          "rope_theta": 500.0, "rms_norm_eps": 1e-5, "hidden_act": "silu", "rope_scaling": None,
          "attention_bias": False, "mlp_bias": False, **extra}


def _write_hf(directory: pathlib.Path, tensors: dict, config: dict, shards: int = 1):
  """An HF directory: config.json and model.safetensors, or ``shards`` files with an index."""
  directory.mkdir(parents=True, exist_ok=True)
  (directory / "config.json").write_text(json.dumps(config))
  if shards == 1:
    st.save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory
  names = list(tensors)
  weight_map = {}
  for k in range(shards):
    part = names[k::shards]
    f = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
    st.save_file({n: tensors[n] for n in part}, str(directory / f), metadata={"format": "pt"})
    weight_map.update({n: f for n in part})
  (directory / "model.safetensors.index.json").write_text(json.dumps(
      {"metadata": {"total_size": sum(v.nbytes for v in tensors.values())},
       "weight_map": weight_map}))
  return directory


def _load(c, devices=None):
  """(params as numpy nested dicts, the program): open_source + the run's program + load."""
  src = hf_source.open_source(c)
  devices = devices or jax.devices()
  spec = spec_lib.resolve(c, len(devices))
  program = step_lib.build_program(c, spec, sharding_lib.make_mesh(spec.mesh, devices))
  params = hf_load.load_params(src, program.abstract_state["params"],
                               program.shardings["params"], spec.model.n_layers)
  return params, program


def _numpy(params) -> dict:
  from flax import nnx
  return jax.tree.map(np.asarray, nnx.to_pure_dict(params))


def _flat(tree) -> dict:
  """{"blocks.0.attn.wq_DHK": array} of a nested params dict (int or str layer keys)."""
  return {".".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
          for path, v in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.fixture(scope="module")
def gqa_export(small_corpus, tmp_path_factory):
  """A 2-step byte-level GQA run (H=4, G=2, tied) and its `chinchax export` directory."""
  root = tmp_path_factory.mktemp("gqa_src")
  c = _config(small_corpus, root / "stores", root / "run")
  c.model.update(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, rope_theta=500.0)
  train_lib.train(c, verbose=False)
  assert cli.main(["export", c.workdir, "--out", str(root / "hf")]) == 0
  return c, root / "hf"


def test_export_then_import_gives_the_runs_params_bitwise_and_trains_on(
    gqa_export, small_corpus, store_root, tmp_path):
  src_cfg, hf = gqa_export
  source, step = export.load_params(src_cfg.workdir)
  assert step == 2
  c = _config(small_corpus, store_root, tmp_path / "cont", init_from=f"hf:{hf}")
  params, program = _load(c, jax.devices())
  # The HF config set the shape (model knobs were at their defaults) and the tokenizer.
  m = c.model
  assert (m.d_model, m.n_layers, m.n_heads, m.n_kv_heads, m.d_ff, m.vocab_size,
          m.tie_embeddings, m.rope_theta) == (32, 2, 4, 2, 64, 257, True, 500.0)
  assert c.data.tokenizer == "hf" and c.data.tokenizer_path == str(hf / "tokenizer.json")
  assert c.data.eos_token == "<|endoftext|>"  # the export's tokenizer_config.json
  got = _numpy(params)
  flat_src, flat_got = _flat(source), _flat(got)
  assert flat_src.keys() == flat_got.keys()
  for k, v in flat_src.items():
    np.testing.assert_array_equal(flat_got[k], v, err_msg=k)
    assert flat_got[k].dtype == np.float32
  # Placed on the run's own shardings (8 devices).
  for arr, sh in zip(jax.tree.leaves(params), jax.tree.leaves(program.shardings["params"])):
    assert arr.sharding == sh
  # The run itself: starts at step 0 from these params with a fresh optimizer, trains 2 steps.
  c = _config(small_corpus, store_root, tmp_path / "cont", init_from=f"hf:{hf}")
  train_lib.train(c, verbose=False)
  run = json.loads((tmp_path / "cont" / "config.json").read_text())
  assert run["model_signature"]["n_kv_heads"] == 2 and run["model_signature"]["d_model"] == 32
  rows = [json.loads(x) for x in (tmp_path / "cont" / "metrics.jsonl").read_text().splitlines()]
  rows = [r for r in rows if "loss" in r]
  assert [r["step"] for r in rows][:2] == [1, 2]
  # Step 1's loss is the source model's mean cross-entropy on the run's first batch.
  data = prepare_data(c, spec_lib.resolve(c, len(jax.devices())))
  _, batch = next(iter(data.batches.iterator(0, num_threads=1)))
  logits = export.chinchax_logits(source, export.model_config(export.load_run(src_cfg.workdir)),
                                  np.asarray(batch)[:, :-1]).astype(np.float64)
  top = logits.max(-1, keepdims=True)
  logz = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
  target = np.take_along_axis(logits, np.asarray(batch)[:, 1:, None], -1)[..., 0]
  np.testing.assert_allclose(rows[0]["loss"], np.mean(logz - target), rtol=1e-5)


def test_scan_layers_import_stacks_the_layers(gqa_export, small_corpus, store_root, tmp_path):
  src_cfg, hf = gqa_export
  source, _ = export.load_params(src_cfg.workdir)
  c = _config(small_corpus, store_root, tmp_path / "scan", init_from=f"hf:{hf}")
  c.model.scan_layers = True
  params, _ = _load(c)
  got = _numpy(params)
  for part in ("attn", "mlp"):
    for name, v in got["blocks"][part].items():
      want = np.stack([source["blocks"][str(i)][part][name] for i in range(2)])
      np.testing.assert_array_equal(v, want)
  np.testing.assert_array_equal(got["blocks"]["attn_norm"]["scale"],
                                np.stack([source["blocks"][str(i)]["attn_norm"]["scale"]
                                          for i in range(2)]))


@pytest.mark.parametrize("tied,dtype,shards", [(False, np.float32, 3), (True, "bfloat16", 1)])
def test_import_then_export_gives_the_files_tensors_bitwise(tied, dtype, shards, small_corpus,
                                                            store_root, tmp_path):
  tensors = _hand_tensors(tied=tied)
  if dtype == "bfloat16":
    tensors = {k: v.astype(ml_dtypes.bfloat16) for k, v in tensors.items()}
  hf = _write_hf(tmp_path / "hf", tensors, _hand_config(tied=tied), shards=shards)
  c = _config(small_corpus, store_root, tmp_path / "run", init_from=f"hf:{hf}")
  params, program = _load(c)
  back = export.to_llama(_numpy(params), program.spec.model)
  assert back.keys() == tensors.keys()
  for k, v in tensors.items():
    np.testing.assert_array_equal(back[k].astype(v.dtype), v, err_msg=k)
    if dtype == "bfloat16":  # widened exactly: narrowing gives the same bits back
      assert (back[k].astype(v.dtype).view(np.uint16) == v.view(np.uint16)).all()


def _refusal(c) -> str:
  with pytest.raises(HFCheckpointError) as e:
    hf_source.open_source(c)
  msg = str(e.value)
  assert "\n" not in msg
  return msg


@pytest.mark.parametrize("extra,key", [
    ({"attention_bias": True}, "attention_bias=true"),
    ({"mlp_bias": True}, "mlp_bias=true"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling="),
    ({"sliding_window": 4096}, "sliding_window=4096"),
    ({"head_dim": 16}, "head_dim=16"),
    ({"hidden_act": "gelu"}, 'hidden_act="gelu"'),
])
def test_unsupported_config_keys_are_refused_by_name(extra, key, small_corpus, store_root,
                                                     tmp_path):
  hf = _write_hf(tmp_path / "hf", _hand_tensors(), _hand_config(**extra))
  msg = _refusal(_config(small_corpus, store_root, tmp_path / "run", f"hf:{hf}"))
  assert key in msg, msg


def test_bad_directories_are_refused_in_one_line(small_corpus, store_root, tmp_path, capsys):
  cfg = lambda d: _config(small_corpus, store_root, tmp_path / "run", f"hf:{d}")  # noqa: E731
  empty = tmp_path / "empty"
  empty.mkdir()
  assert "no config.json" in _refusal(cfg(empty))
  assert "train.init_from='hf:' names no directory" in _refusal(cfg(""))  # not the current one
  gpt2 = _write_hf(tmp_path / "gpt2", _hand_tensors(), _hand_config(
      architectures=["GPT2LMHeadModel"], model_type="gpt2"))
  assert "GPT2LMHeadModel" in _refusal(cfg(gpt2))
  # A tensor of the wrong shape: named, with the expected and the found shape.
  t = _hand_tensors()
  t["model.layers.1.mlp.up_proj.weight"] = np.zeros((47, 32), np.float32)
  msg = _refusal(cfg(_write_hf(tmp_path / "shape", t, _hand_config())))
  assert "model.layers.1.mlp.up_proj.weight" in msg and "[47, 32]" in msg and "[48, 32]" in msg
  # A missing shard: named.
  sharded = _write_hf(tmp_path / "sharded", _hand_tensors(), _hand_config(), shards=2)
  (sharded / "model-00002-of-00002.safetensors").unlink()
  assert "model-00002-of-00002.safetensors is missing" in _refusal(cfg(sharded))
  # A bias tensor chinchax has no place for.
  t = dict(_hand_tensors(), **{"model.layers.0.self_attn.q_proj.bias": np.zeros(32, np.float32)})
  assert "q_proj.bias" in _refusal(cfg(_write_hf(tmp_path / "bias", t, _hand_config())))
  # The run's tokenizer (bytes: 257 ids) does not fit a 200-row embedding.
  small = _write_hf(tmp_path / "small", _hand_tensors(V=200), _hand_config(V=200))
  assert "257 ids" in _refusal(cfg(small)) and "vocab_size is 200" in _refusal(cfg(small))
  # An explicit model knob that differs from the checkpoint's: both values named.
  c = cfg(_write_hf(tmp_path / "ok", _hand_tensors(), _hand_config()))
  c.model.d_model = 128
  msg = _refusal(c)
  assert "model.d_model=32" in msg and "model.d_model=128" in msg
  c.model.n_layers = 5  # two knobs differ: one line names both
  msg = _refusal(c)
  assert ("model.d_model=128 (checkpoint 32), model.n_layers=5 (checkpoint 2); leave them at "
          "their defaults") in msg
  # Through the command line: one `error:` line, exit 2, nothing written.
  rc = cli.main(["train", f"--config.workdir={tmp_path / 'cli'}",
                 f"--config.train.init_from=hf:{gpt2}"])
  err = capsys.readouterr().err.strip().splitlines()
  assert rc == 2 and len(err) == 1 and err[0].startswith("error: ") and "gpt2" in err[0]
  assert not (tmp_path / "cli").exists()


def test_a_typed_model_knob_equal_to_its_default_is_still_checked(tmp_path, capsys):
  """--config.model.d_model=64 is the default's value, but typed: a checkpoint of d_model 32 is
  refused (not silently replaced), before any data is read; typed equal to 32 passes the check."""
  hf = _write_hf(tmp_path / "hf", _hand_tensors(), _hand_config())  # hidden_size 32
  default = config_lib.base_config().model.d_model
  assert default != 32
  rc = cli.main(["train", f"--config.workdir={tmp_path / 'cli'}",
                 f"--config.train.init_from=hf:{hf}", f"--config.model.d_model={default}"])
  err = capsys.readouterr().err.strip().splitlines()
  assert rc == 2 and len(err) == 1 and err[0].startswith("error: "), err
  assert "model.d_model=32" in err[0] and f"the config has model.d_model={default}" in err[0]
  assert "drop --config.model.d_model" in err[0]
  assert not (tmp_path / "cli").exists()
  c = config_lib.base_config()
  c.train.init_from = f"hf:{hf}"
  c.model.update(d_model=32, n_heads=4, n_kv_heads=2)
  hf_source.check_set_knobs(c, {"d_model", "n_heads", "n_kv_heads"})  # the checkpoint's values
  c.model.n_kv_heads = 0  # = n_heads = 4, not the checkpoint's 2
  with pytest.raises(HFCheckpointError, match="drop --config.model.n_kv_heads"):
    hf_source.check_set_knobs(c, {"n_kv_heads"})


def test_a_tokenizer_larger_than_the_vocab_is_refused(small_corpus, store_root, tmp_path):
  from tokenizers import Tokenizer, models
  hf = _write_hf(tmp_path / "hf", _hand_tensors(V=300), _hand_config(V=300))
  vocab = {f"t{i}": i for i in range(400)} | {"</s>": 400}
  Tokenizer(models.WordLevel(vocab, unk_token="t0")).save(str(hf / "tokenizer.json"))
  msg = _refusal(_config(small_corpus, store_root, tmp_path / "run", f"hf:{hf}"))
  assert "tokenizer.json has 401 ids" in msg and "vocab_size is 300" in msg


def test_a_run_from_hf_resumes_without_its_directory(gqa_export, small_corpus, store_root,
                                                     tmp_path, capsys):
  """Once the run has a checkpoint, DIR is not needed: the resume equals an uninterrupted run."""
  import shutil
  _, hf = gqa_export
  src = tmp_path / "hf"
  shutil.copytree(hf, src)

  def cfg(workdir, stop_after_s=0.0):
    c = _config(small_corpus, store_root, workdir, init_from=f"hf:{src}")
    c.budget.steps = 4
    c.train.stop_after_s = stop_after_s
    return c

  def losses(workdir):
    rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}

  train_lib.train(cfg(tmp_path / "ref"), verbose=False)
  first = train_lib.train(cfg(tmp_path / "run", stop_after_s=1e-9), verbose=False)
  assert first["steps"] < 4  # stopped early, with a checkpoint
  shutil.rmtree(src)
  capsys.readouterr()
  train_lib.train(cfg(tmp_path / "run"), verbose=True)
  out = capsys.readouterr()
  notes = [l for l in out.err.splitlines() if l.startswith("note: ")]
  assert len(notes) == 1 and f"holds a run at step {first['steps']} started from " \
      f"train.init_from=hf:{src}, which no longer exists" in notes[0], out.err
  assert "resumed from checkpoint at step" in out.out
  assert losses(tmp_path / "run") == losses(tmp_path / "ref")
  # without a checkpoint, a missing DIR is still the one error line it was
  with pytest.raises(HFCheckpointError, match="is not a directory"):
    train_lib.train(cfg(tmp_path / "fresh"), verbose=False)
