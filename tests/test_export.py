"""chinchax export: HF Llama safetensors whose numpy forward pass reproduces chinchax's logits."""

import dataclasses
import json
import pathlib
import shutil

import jax
import numpy as np
import pytest

st = pytest.importorskip("safetensors.numpy")

from chinchax import cli  # noqa: E402
from chinchax.export import writer as export  # noqa: E402
from chinchax.model import transformer as model_lib
from chinchax.data import tokenizers as tokenizers_lib  # noqa: E402


def _tokens(vocab, B=2, T=24, seed=0):
  return np.random.default_rng(seed).integers(0, vocab, size=(B, T))


def test_export_round_trip_of_a_trained_run(bpe_run, tmp_path, capsys):
  """Acceptance 6: numpy forward on the exported tensors matches chinchax within 1e-4."""
  c, _ = bpe_run
  out = tmp_path / "hf"
  assert cli.main(["export", c.workdir, "--format", "safetensors", "--out", str(out)]) == 0
  assert "LlamaForCausalLM" in capsys.readouterr().out
  assert {p.name for p in out.iterdir()} == {
      "model.safetensors", "config.json", "generation_config.json", "export_info.json",
      "tokenizer.json", "tokenizer_config.json"}
  hf = json.loads((out / "config.json").read_text())
  assert hf["architectures"] == ["LlamaForCausalLM"] and hf["model_type"] == "llama"
  assert (hf["vocab_size"], hf["hidden_size"], hf["num_hidden_layers"], hf["num_attention_heads"],
          hf["num_key_value_heads"], hf["intermediate_size"], hf["head_dim"]) == (512, 32, 2, 2, 2, 64, 16)
  assert hf["tie_word_embeddings"] is False and hf["eos_token_id"] == 0
  assert hf["rms_norm_eps"] == c.model.norm_eps and hf["rope_theta"] == c.model.rope_theta
  tensors = st.load_file(str(out / "model.safetensors"))
  names = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"} | {
      f"model.layers.{i}.{n}.weight" for i in range(2) for n in (
          "input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
          "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
  assert set(tensors) == names
  assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (32, 32)
  assert tensors["model.layers.1.mlp.down_proj.weight"].shape == (32, 64)
  assert tensors["lm_head.weight"].shape == (512, 32)
  params, step = export.load_params(c.workdir)
  assert step == 10
  tokens = _tokens(512)
  ref = export.chinchax_logits(params, export.model_config(export.load_run(c.workdir)), tokens)
  got = export.numpy_forward(tensors, hf, tokens)
  assert np.abs(got - ref).max() < 1e-4
  tok = json.loads((out / "tokenizer_config.json").read_text())
  assert tok["eos_token"] == "<|endoftext|>"


@pytest.mark.parametrize("tied", [True, False])
def test_mapping_with_large_random_weights(tied):
  """Weights large enough that attention is far from uniform: a wrong q/k layout would show."""
  cfg = model_lib.ModelConfig(vocab_size=97, d_model=48, n_layers=2, n_heads=3, d_ff=80,
                              tie_embeddings=tied, rope_theta=500.0, norm_eps=1e-5)
  rng = np.random.default_rng(1)
  D, H, K, F, V = 48, 3, 16, 80, 97
  r = lambda *s: rng.normal(0, 0.35, size=s).astype(np.float32)
  block = lambda: {"attn_norm": {"scale": 1 + r(D)}, "mlp_norm": {"scale": 1 + r(D)},
                   "attn": {"wq_DHK": r(D, H, K), "wk_DHK": r(D, H, K), "wv_DHK": r(D, H, K),
                            "wo_HKD": r(H, K, D)},
                   "mlp": {"w_gate_DF": r(D, F), "w_up_DF": r(D, F), "w_down_FD": r(F, D)}}
  params = {"embed_VD": r(V, D), "blocks": {"0": block(), "1": block()},
            "final_norm": {"scale": 1 + r(D)}}
  if not tied:
    params["head_DV"] = r(D, V)
  run = {"config": {"train": {"seq_len": 32}}}
  hf = export.llama_config(cfg, run, eos_id=0, dtype="float32")
  tensors = export.to_llama(params, cfg)
  assert ("lm_head.weight" in tensors) is not tied
  tokens = _tokens(V, T=32, seed=2)
  ref = export.chinchax_logits(params, cfg, tokens)
  got = export.numpy_forward(tensors, hf, tokens)
  assert ref.std() > 1.0 and np.abs(got - ref).max() < 1e-4
  # A model.scan_layers run stores the blocks stacked [n_layers, ...]: same tensors, same model.
  stacked = dict(params, blocks=jax.tree.map(lambda *xs: np.stack(xs), params["blocks"]["0"],
                                              params["blocks"]["1"]))
  tensors_stacked = export.to_llama(stacked, cfg)
  assert tensors_stacked.keys() == tensors.keys()
  for k in tensors:
    np.testing.assert_array_equal(tensors_stacked[k], tensors[k])
  scan_cfg = dataclasses.replace(cfg, scan_layers=True)
  np.testing.assert_allclose(export.chinchax_logits(stacked, scan_cfg, tokens), ref, atol=1e-4)
  # Interleaved-pair RoPE (the layout HF's Meta conversion permutes for) would not match.
  perm = np.concatenate([np.arange(0, K, 2), np.arange(1, K, 2)])
  wrong = dict(tensors)
  for i in range(2):
    for n in ("q_proj", "k_proj"):
      w = tensors[f"model.layers.{i}.self_attn.{n}.weight"].reshape(H, K, D)
      wrong[f"model.layers.{i}.self_attn.{n}.weight"] = w[:, perm].reshape(H * K, D)
  assert np.abs(export.numpy_forward(wrong, hf, tokens) - ref).max() > 1e-2


def test_export_options_and_errors(bpe_run, tmp_path, capsys, monkeypatch):
  c, _ = bpe_run
  out = tmp_path / "bf16"
  path = export.export(c.workdir, out, dtype="bfloat16")
  t = st.load_file(str(path / "model.safetensors"))
  assert str(t["model.embed_tokens.weight"].dtype) == "bfloat16"
  assert json.loads((path / "export_info.json").read_text())["step"] == 10
  for argv, needle in [
      ([str(tmp_path / "nowhere")], "run directory '" + str(tmp_path / "nowhere") + "' does not exist"),
      ([c.workdir, "--out", str(out)], "holds an earlier export; pass --overwrite"),
      ([c.workdir, "--format", "gguf", "--out", str(tmp_path / "x")], "--format 'gguf'"),
      ([c.workdir, "--step", "7", "--out", str(tmp_path / "x")], "no checkpoint at step 7"),
      ([c.workdir, "--tokenizer", str(tmp_path / "none.json"), "--out", str(tmp_path / "x")],
       "does not exist")]:
    assert cli.main(["export", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and needle in err, (argv, err)
  assert not (tmp_path / "x").exists()
  # A tokenizer with more ids than the checkpoint's embedding rows is refused.
  tk = pytest.importorskip("tokenizers")
  vocab = {f"w{i}": i for i in range(599)} | {"<|endoftext|>": 599}
  tk.Tokenizer(tk.models.WordLevel(vocab, unk_token="w0")).save(str(tmp_path / "big.json"))
  run_sha = export.load_run(c.workdir)["data_signature"]["tokenizer_sha256"]
  big_sha = tokenizers_lib.HFTokenizer.from_file(str(tmp_path / "big.json")).digest
  assert cli.main(["export", c.workdir, "--out", str(tmp_path / "y"),
                   "--tokenizer", str(tmp_path / "big.json")]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and f"--tokenizer {tmp_path / 'big.json'} is not the tokenizer" in err
  assert f"its sha256 is {big_sha[:16]}…, the run's (config.json tokenizer_sha256) is {run_sha[:16]}…" in err
  assert not (tmp_path / "y").exists()
  # A run whose config.json predates data_signature: the vocab size still catches it.
  monkeypatch.setattr(export, "load_run", lambda w: {
      k: v for k, v in json.loads((pathlib.Path(w) / "config.json").read_text()).items()
      if k != "data_signature"})
  with pytest.raises(export.ExportError, match="has 600 ids but the checkpoint's model has vocab_size=512"):
    export.export(c.workdir, tmp_path / "y", tokenizer_path=str(tmp_path / "big.json"))
  assert not (tmp_path / "y").exists()


def test_a_directory_that_is_not_a_run_is_one_error_line(tmp_path, capsys):
  """An HF export's directory (its config.json is HF's) or an unreadable config.json, given to
  export or sample as the run: one error line naming it, never a traceback."""
  hf, junk = tmp_path / "hf", tmp_path / "junk"
  hf.mkdir(), junk.mkdir()
  (hf / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 32}))
  (junk / "config.json").write_text("{oops")
  for verb in (["export"], ["sample"]):
    for d, needle in [(hf, f"is not a chinchax run: its config.json has no 'config' and "
                           f"'model_signature' (an HF checkpoint's config.json: start a run "
                           f"from it with --config.train.init_from=hf:{hf})"),
                      (junk, f"'{junk / 'config.json'}' cannot be read as JSON")]:
      assert cli.main([*verb, str(d)]) == 2
      err = capsys.readouterr().err
      assert err.startswith("error:") and err.count("\n") == 1 and needle in err, (verb, err)


@pytest.mark.parametrize("umask", [0o002, 0o022, 0o077])
def test_export_files_follow_the_users_umask(bpe_run, tmp_path, umask):
  """A shared model directory: every exported file gets 0o666 & ~umask (safetensors alone writes
  0o600), the directory 0o777 & ~umask, as `touch` and `mkdir` would give them."""
  import os
  import stat
  c, _ = bpe_run
  old = os.umask(umask)
  try:
    out = export.export(c.workdir, tmp_path / "shared")
  finally:
    os.umask(old)
  modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in out.iterdir()}
  assert "model.safetensors" in modes and "tokenizer.json" in modes, modes
  assert set(modes.values()) == {0o666 & ~umask}, {k: oct(v) for k, v in modes.items()}
  assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask


def _files(root):
  """{relative path: bytes} of every file under ``root``."""
  return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def runs(bpe_run, tmp_path):
  """runs/x and runs/y (copies of the trained run) and runs/notes.txt, a user's file."""
  c, _ = bpe_run
  root = tmp_path / "runs"
  for name in ("x", "y"):
    shutil.copytree(c.workdir, root / name, ignore=shutil.ignore_patterns("export"))
  (root / "notes.txt").write_text("my notes")
  return root


def test_overwrite_never_deletes_what_an_export_did_not_write(runs, tmp_path, capsys, monkeypatch):
  """--out at the run, its parent, a sibling run, the run's checkpoints or a user's directory:
  refused with one line, before any checkpoint is read, and every file is left as it was."""
  mine = tmp_path / "mine"
  mine.mkdir()
  (mine / "thesis.tex").write_text("keep me")
  (mine / "config.json").write_text("{}")
  before = _files(tmp_path)

  def no_checkpoint_read(*args, **kwargs):
    raise AssertionError("a checkpoint was read before --out was refused")
  monkeypatch.setattr(export, "load_params", no_checkpoint_read)
  for out, needle in [
      (runs / "x", "is the run directory itself"),
      (runs, f"holds the run {runs / 'x'}"),
      (tmp_path, f"holds the run {runs / 'x'}"),
      (runs / "y", "is a chinchax run directory"),
      (runs / "x" / "checkpoints", f"is the checkpoints directory of the run {runs / 'x'}"),
      (runs / "x" / "checkpoints" / "10" / "hf", "belongs to the run"),
      (runs / "y" / "checkpoints" / "new", "belongs to the run"),
      (mine, "is not empty and is not an earlier export (it holds thesis.tex)"),
      (runs / "notes.txt", "is a file")]:
    assert cli.main(["export", str(runs / "x"), "--out", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1, (out, err)
    assert f"--out {out} " in err and needle in err and "export" in err, (out, err)
  assert _files(tmp_path) == before


def test_an_earlier_export_is_replaced_atomically(runs, capsys, monkeypatch):
  """An export may be overwritten by a new export (only with --overwrite); an interrupted
  replacement leaves the earlier export as it was and no temporary directory."""
  run, out = runs / "x", runs / "x" / "hf"
  assert cli.main(["export", str(run), "--out", str(out)]) == 0
  first = _files(out)
  assert json.loads(first["export_info.json"])["dtype"] == "float32"
  assert cli.main(["export", str(run), "--out", str(out), "--dtype", "bfloat16"]) == 2
  assert "holds an earlier export; pass --overwrite" in capsys.readouterr().err
  assert _files(out) == first

  def interrupted(directory):
    raise KeyboardInterrupt
  with monkeypatch.context() as m:
    m.setattr(export.outdir, "apply_umask", interrupted)
    with pytest.raises(KeyboardInterrupt):
      export.export(run, out, dtype="bfloat16", overwrite=True)
  assert _files(out) == first and sorted(p.name for p in run.iterdir() if p.name.startswith("."))  == []
  assert cli.main(["export", str(run), "--out", str(out), "--dtype", "bfloat16",
                   "--overwrite"]) == 0
  assert json.loads((out / "export_info.json").read_text())["dtype"] == "bfloat16"
  assert {p.name for p in out.iterdir()} == set(first)
  assert sorted(p.name for p in run.iterdir()) == sorted(["checkpoints", "config.json", "hf"] + [
      p.name for p in (runs / "y").iterdir() if p.name not in ("checkpoints", "config.json")])
  # An export directory with anything else in it is no longer only an export's.
  (out / "my_eval.txt").write_text("scores")
  assert cli.main(["export", str(run), "--out", str(out), "--overwrite"]) == 2
  assert "is not an earlier export (it holds my_eval.txt)" in capsys.readouterr().err
  assert (out / "my_eval.txt").read_text() == "scores"
