"""The tokenizer an export ships: the run's own (by sha256), chinchax's ids, loadable by HF."""

import json
import shutil

import jax
import pytest

tk = pytest.importorskip("tokenizers")
pytest.importorskip("safetensors.numpy")

from chinchax import cli  # noqa: E402
from chinchax.export import writer as export  # noqa: E402
from chinchax import train as train_lib  # noqa: E402
from chinchax.data import tokenizers as tokenizers_lib  # noqa: E402
from chinchax.export import tokenizer_files  # noqa: E402

# Mixed UTF-8: ASCII, Latin-1 and other accents, CJK, an emoji, controls, NUL, runs of spaces,
# and the EOS token's text inside a document.
TEXT = ("def f(x):\n\treturn x  # naïve café, Zürich\r\n日本語のテキスト 🦙 \x00\x7f"
        "  end.<|endoftext|>next doc ½ ÿ\u0100")


def _hf_ids(out, text, split: bool = True):
  """ids of ``text`` with the exported files, as transformers' PreTrainedTokenizerFast encodes:
  tokenizer.json, ``split_special_tokens`` of tokenizer_config.json, no added tokens; with
  ``split`` false, as the ``tokenizers`` library alone reads tokenizer.json."""
  tok = tk.Tokenizer.from_file(str(out / "tokenizer.json"))
  if split:
    tok.encode_special_tokens = json.loads((out / "tokenizer_config.json").read_text())[
        "split_special_tokens"]
  return tok.encode(text, add_special_tokens=False).ids


def _transformers_ids(out, text):
  """ids of ``text`` from transformers' AutoTokenizer on the export, or None without it."""
  try:
    import transformers
  except ImportError:
    return None
  tok = transformers.AutoTokenizer.from_pretrained(str(out))
  ids = tok(text)["input_ids"]
  assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == text
  return ids


@pytest.fixture
def interrupted_bpe_run(bpe_run, tmp_path):
  """A copy of the BPE run as an interrupted run leaves it: config.json and checkpoints, no
  summary.json; its stores copied too (config.json's data.store_root points at the copy)."""
  c, _ = bpe_run
  run, stores = tmp_path / "run", tmp_path / "stores"
  shutil.copytree(c.workdir, run, ignore=shutil.ignore_patterns("export", "summary.json"))
  shutil.copytree(c.data.store_root, stores)
  cfg = json.loads((run / "config.json").read_text())
  cfg["config"]["data"]["store_root"] = str(stores)
  (run / "config.json").write_text(json.dumps(cfg))
  return run, stores, cfg["data_signature"]["tokenizer_sha256"]


def test_an_interrupted_bpe_run_exports_its_own_tokenizer(interrupted_bpe_run, tmp_path, capsys):
  """No summary.json: the tokenizer is found from the store fingerprint in config.json (the
  store, else the BPE saved for the corpus), checked by sha256; none found → one line."""
  run, stores, sha = interrupted_bpe_run
  (store,) = [p for p in stores.iterdir() if p.name.startswith("bpe512-")]
  (saved,) = (stores / "tokenizers").glob("bpe512-*.json")
  text = (store / "tokenizer.json").read_text()
  for name in ("a", "b"):
    out = tmp_path / name
    assert cli.main(["export", str(run), "--out", str(out)]) == 0
    # The store's tokenizer, its special tokens kept in the model's vocabulary only.
    got, want = json.loads((out / "tokenizer.json").read_text()), json.loads(text)
    assert got["model"] == want["model"] and got["added_tokens"] == []
    assert {t["content"]: t["id"] for t in want["added_tokens"]} == {"<|endoftext|>": 0}
    hf, gen = (json.loads((out / f).read_text()) for f in ("config.json", "generation_config.json"))
    assert hf["eos_token_id"] == hf["bos_token_id"] == gen["eos_token_id"] == gen["pad_token_id"] == 0
    info = json.loads((out / "export_info.json").read_text())["tokenizer"]
    assert info["sha256"] == sha and info["eos_id"] == 0
    assert info["found_at"] == str(store / "tokenizer.json" if name == "a" else saved)
    if name == "a":  # second pass: the store's copy damaged, the BPE saved for the corpus
      (store / "tokenizer.json").write_text('{"version": "1.0", "trunc')
  saved.unlink()
  shutil.rmtree(store)
  assert cli.main(["export", str(run), "--out", str(tmp_path / "c")]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: the run's bpe tokenizer (sha256 " + sha[:16]) and err.count("\n") == 1
  assert str(saved) in err and "pass it with --tokenizer PATH" in err
  assert not (tmp_path / "c").exists()


def test_the_runs_tokenizer_is_accepted_by_tokenizer_flag(interrupted_bpe_run, tmp_path):
  run, stores, sha = interrupted_bpe_run
  (saved,) = (stores / "tokenizers").glob("bpe512-*.json")
  out = export.export(run, tmp_path / "e", tokenizer_path=str(saved))
  assert json.loads((out / "export_info.json").read_text())["tokenizer"]["sha256"] == sha


def test_bpe_export_matches_chinchax_for_hf(bpe_run, tmp_path):
  """tokenizer_config.json: no token_type_ids, no length limit (trained seq_len in
  export_info.json), and a literal <|endoftext|> is text in both chinchax and the export."""
  c, _ = bpe_run
  out = export.export(c.workdir, tmp_path / "hf")
  cfg = json.loads((out / "tokenizer_config.json").read_text())
  assert cfg["model_input_names"] == ["input_ids", "attention_mask"]
  assert cfg["model_max_length"] >= 10**30 and cfg["split_special_tokens"] is True
  assert cfg["eos_token"] == "<|endoftext|>" and cfg["clean_up_tokenization_spaces"] is False
  assert json.loads((out / "export_info.json").read_text())["trained_seq_len"] == c.train.seq_len
  ours = tokenizers_lib.HFTokenizer.from_file(str(out / "tokenizer.json"), "<|endoftext|>")
  want = ours.encode(TEXT.encode("utf-8")).tolist()
  assert _hf_ids(out, TEXT) == want and 0 not in want  # EOS (id 0) only ever appended
  # The tokenizers library alone (no split_special_tokens) reads the literal as text too,
  # and EOS keeps its id; transformers (where installed) agrees.
  assert _hf_ids(out, TEXT, split=False) == want
  loaded = tk.Tokenizer.from_file(str(out / "tokenizer.json"))
  assert loaded.token_to_id("<|endoftext|>") == 0 and loaded.decode(want) == TEXT
  assert ours.decode(want + [0]).decode("utf-8") == TEXT
  assert _transformers_ids(out, TEXT) in (None, want)


def test_byte_level_tokenizer_file_gives_chinchax_ids(tmp_path):
  """The byte-level tokenizer.json: id b = byte b, 256 = EOS, on mixed UTF-8 text."""
  symbols = tokenizer_files.byte_symbols()
  assert sorted(symbols.values()) == sorted(tk.pre_tokenizers.ByteLevel.alphabet())
  out = tmp_path / "bytes"
  out.mkdir()
  run = {"config": {"data": {"tokenizer": "bytes"}},
         "data_signature": {"tokenizer_sha256": tokenizers_lib.ByteTokenizer.digest}}
  tok = tokenizer_files.find(tmp_path, run)
  (out / "tokenizer.json").write_text(tok.json_text)
  (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_files.tokenizer_config(
      tok.eos_token)))
  data = TEXT.encode("utf-8")
  want = tokenizers_lib.ByteTokenizer().encode(data).tolist()
  assert len(want) == len(data) and _hf_ids(out, TEXT) == want
  assert _hf_ids(out, TEXT, split=False) == want and _transformers_ids(out, TEXT) in (None, want)
  every_byte = bytes(range(256)).decode("latin-1")  # 256 characters, 384 UTF-8 bytes
  assert _hf_ids(out, every_byte) == list(every_byte.encode("utf-8"))
  loaded = tk.Tokenizer.from_file(str(out / "tokenizer.json"))
  assert loaded.token_to_id("<|endoftext|>") == tok.eos_id == 256
  assert loaded.get_vocab_size(with_added_tokens=True) == 257
  assert loaded.decode(want) == TEXT


def test_a_byte_level_run_exports_a_tokenizer(tiny_config, tmp_path, capsys):
  """A trained bytes run: tokenizer.json + tokenizer_config.json, EOS 256 everywhere;
  --tokenizer with another tokenizer is refused (its sha256 is not the run's)."""
  c = tiny_config
  c.budget.steps = 2
  c.train.update(eval_every=2, log_every=1, checkpoint_every=2)
  train_lib.train(c, devices=jax.devices()[:1], verbose=False)
  out = export.export(c.workdir, tmp_path / "hf")
  assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
  hf = json.loads((out / "config.json").read_text())
  assert hf["vocab_size"] == 257 and hf["eos_token_id"] == 256
  assert _hf_ids(out, TEXT) == list(TEXT.encode("utf-8"))
  other = tmp_path / "other.json"
  other.write_text(tk.Tokenizer(tk.models.WordLevel({"a": 0, "<|endoftext|>": 1}, unk_token="a")).to_str())
  assert cli.main(["export", c.workdir, "--out", str(tmp_path / "x"), "--tokenizer", str(other)]) == 2
  err = capsys.readouterr().err
  assert "is not the tokenizer this run was trained with" in err
  assert tokenizers_lib.ByteTokenizer.digest[:16] in err and not (tmp_path / "x").exists()
