"""chinchax prepare: file / parquet / HF sources, UTF-8 policy, parallel and resumable builds."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from chinchax import cli
from chinchax.data import builder, scancache, shards, sources, store, tokenizers

CORPORA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "corpora"


def _texts(n=300, seed=0):
  """n short English-like documents (from tinyshakespeare when present, else stdlib text)."""
  path = CORPORA / "tinyshakespeare" / "input.txt"
  if path.exists():
    paras = [p for p in path.read_text().split("\n\n") if p.strip()]
  else:
    import sysconfig
    paras = (pathlib.Path(sysconfig.get_paths()["stdlib"]) / "os.py").read_text().split("\n\n")
  picks = np.random.default_rng(seed).integers(0, len(paras), size=(n, 3))
  return ["\n\n".join(paras[i] for i in row) for row in picks]


def _jsonl(path, texts, field="body"):
  path.write_text("".join(json.dumps({field: t, "id": i}) + "\n" for i, t in enumerate(texts)))
  return path


def _manifest(d):
  return json.loads((pathlib.Path(d) / "manifest.json").read_text())


def _docs(d, tok):
  """Every stored document's decoded bytes, per split."""
  out = {}
  for split in store.SPLITS:
    ts = store.TokenSplit(d, split)
    starts = np.load(pathlib.Path(d) / f"{split}_docs.npy")
    ends = list(starts[1:]) + [ts.n_tokens]
    out[split] = [tok.decode(ts.read(int(s), int(e - s))[:-1]) for s, e in zip(starts, ends)]
  return out


def test_jsonl_and_parquet_with_custom_field_give_the_same_store(tmp_path):
  pa = pytest.importorskip("pyarrow")
  pq = pytest.importorskip("pyarrow.parquet")
  texts = _texts(120)
  _jsonl(tmp_path / "c.jsonl", texts, field="body")
  pq.write_table(pa.table({"body": texts, "n": list(range(len(texts)))}), tmp_path / "c.parquet")
  tok = tokenizers.ByteTokenizer()
  d1 = builder.build(sources.FileSource(str(tmp_path / "c.jsonl"), "body"), tok,
                           str(tmp_path / "s"), 0.1)
  d2 = builder.build(sources.FileSource(str(tmp_path / "c.parquet"), "body"), tok,
                           str(tmp_path / "s"), 0.1)
  m1, m2 = _manifest(d1), _manifest(d2)
  assert d1 != d2 and m1["content_sha256"] == m2["content_sha256"]
  assert m1["documents"]["kept"] == 120 and m1["splits"]["val"]["documents"] >= 1
  docs = _docs(d1, tok)
  assert sorted(docs["train"] + docs["val"]) == sorted(t.encode() for t in texts)
  assert store.content_hash(d1) == m1["content_sha256"]


def test_invalid_utf8_and_empty_documents(tmp_path):
  pa = pytest.importorskip("pyarrow")
  pq = pytest.importorskip("pyarrow.parquet")
  bad = b"caf\xe9 au lait \xff\xfe end"  # latin-1 bytes: not UTF-8
  (tmp_path / "bad.txt").write_bytes(bad)
  (tmp_path / "empty.txt").write_bytes(b"")
  (tmp_path / "good.txt").write_text("a perfectly good document " * 20)
  # jsonl: an undecodable raw byte inside a string, an empty text, a null text, a lone surrogate.
  (tmp_path / "c.jsonl").write_bytes(b'{"text": "raw \xff byte"}\n{"text": ""}\n{"text": null}\n'
                                     b'{"text": "lone \\udc80 surrogate"}\n\n'
                                     b'{"text": "fine line of text"}\n')
  pq.write_table(pa.table({"text": pa.array([b"pq \xc3( bad", b"", b"pq good"], pa.binary())}),
                 tmp_path / "c.parquet")
  src = sources.FileSource(",".join(str(tmp_path / p) for p in ("*.txt", "*.jsonl", "*.parquet")))
  tok = tokenizers.ByteTokenizer()
  d = builder.build(src, tok, str(tmp_path / "s"), 0.3)
  m = _manifest(d)["documents"]
  assert m == {"read": 11, "kept": 7, "empty_skipped": 4, "invalid_utf8_replaced": 4,
               "invalid_utf8_skipped": 0}
  docs = _docs(d, tok)
  kept = docs["train"] + docs["val"]
  assert "caf\ufffd au lait \ufffd\ufffd end".encode() in kept
  assert all(k.decode("utf-8") for k in kept)  # everything stored is valid UTF-8
  d_skip = builder.build(src, tok, str(tmp_path / "s"), 0.3, decode_errors="skip")
  with pytest.raises(sources.DataError, match="no document is left after skipping 1 empty and 1"):
    builder.build(sources.FileSource(f"{tmp_path}/bad.txt,{tmp_path}/empty.txt"), tok,
                  str(tmp_path / "s"), 0.3, decode_errors="skip")
  assert not [p for p in (tmp_path / "s").iterdir() if p.name.startswith(".")]
  m = _manifest(d_skip)["documents"]
  assert d_skip != d and m["kept"] == 3 and m["invalid_utf8_skipped"] == 4 and m["empty_skipped"] == 4
  # BPE (which needs text) works on the same corpus.
  d_bpe = builder.build(src, tokenizers.BPESpec(300), str(tmp_path / "s"), 0.3)
  assert _manifest(d_bpe)["documents"]["invalid_utf8_replaced"] == 4


def test_hf_dataset_directory_gives_the_same_tokens_as_files(tmp_path):
  datasets = pytest.importorskip("datasets")
  texts = _texts(150, seed=1)
  _jsonl(tmp_path / "c.jsonl", texts, field="body")
  datasets.Dataset.from_dict({"body": texts, "id": list(range(150))}).save_to_disk(
      str(tmp_path / "saved"))
  datasets.DatasetDict({"train": datasets.Dataset.from_dict({"body": texts})}).save_to_disk(
      str(tmp_path / "saved_dict"))
  (tmp_path / "raw").mkdir()
  _jsonl(tmp_path / "raw" / "part.jsonl", texts, field="body")
  tok = tokenizers.BPESpec(400)
  ref = builder.build(sources.FileSource(str(tmp_path / "c.jsonl"), "body"), tok,
                      str(tmp_path / "s"), 0.1)
  want = _manifest(ref)["content_sha256"]
  tok_file = ref / "tokenizer.json"
  bpe = tokenizers.HFTokenizer.from_file(str(tok_file), name="bpe400", kind="bpe")
  for name, streaming in ((tmp_path / "saved", False), (tmp_path / "saved_dict", True),
                          (tmp_path / "raw", True)):
    src = sources.HFSource(str(name), split="train", text_field="body", streaming=streaming)
    d = builder.build(src, bpe, str(tmp_path / "s"), 0.1, workers=2, shard_mb=0.02)
    m = _manifest(d)
    assert m["source"]["kind"] == "hf" and m["content_sha256"] == want, name
  with pytest.raises(sources.DataError, match=r"no field 'text'.*fields: \['body', 'id'\]"):
    sources.HFSource(str(tmp_path / "saved"), text_field="text")
  with pytest.raises(sources.DataError, match="no split 'test'"):
    sources.HFSource(str(tmp_path / "saved_dict"), split="test", text_field="body")


def test_store_does_not_depend_on_workers_or_shard_size_and_dtype_follows_vocab(tmp_path):
  texts = _texts(200, seed=2)
  src = sources.FileSource(str(_jsonl(tmp_path / "c.jsonl", texts)), "body")
  tok = tokenizers.ByteTokenizer()
  a = builder.build(src, tok, str(tmp_path / "a"), 0.1, workers=1, shard_mb=1.0)
  b = builder.build(src, tok, str(tmp_path / "b"), 0.1, workers=2, shard_mb=0.01)
  assert _manifest(b)["shards"]["count"] > 5 and _manifest(b)["workers"] == 2
  assert _manifest(a)["content_sha256"] == _manifest(b)["content_sha256"] == store.content_hash(b)
  assert _manifest(a)["dtype"] == "uint16"
  assert tokenizers.ids_dtype(65536) == np.uint16 and tokenizers.ids_dtype(65537) == np.uint32


def test_uint32_store_for_a_vocab_above_65536(tmp_path):
  tk = pytest.importorskip("tokenizers")
  vocab = {chr(ord("a") + i): i for i in range(26)}
  vocab.update({"<|endoftext|>": 70000, "[UNK]": 70001})
  t = tk.Tokenizer(tk.models.WordLevel(vocab, unk_token="[UNK]"))
  t.pre_tokenizer = tk.pre_tokenizers.Split("", "isolated")
  t.save(str(tmp_path / "tokenizer.json"))
  tok = tokenizers.HFTokenizer.from_file(str(tmp_path / "tokenizer.json"))
  assert tok.vocab_size == 70002 and tok.dtype == np.uint32 and tok.eos_id == 70000
  _jsonl(tmp_path / "c.jsonl", ["abc", "xyz Q", "hello"], field="text")
  d = builder.build(sources.FileSource(str(tmp_path / "c.jsonl")), tok, str(tmp_path / "s"), 0.3)
  assert _manifest(d)["dtype"] == "uint32"
  toks = np.concatenate([store.TokenSplit(d, s).all_tokens() for s in store.SPLITS])
  assert toks.dtype == np.uint32 and 70000 in toks and 70001 in toks


def test_interrupted_build_resumes_to_the_identical_store(tmp_path, monkeypatch):
  """An interrupt after 3 shards keeps them; the rerun reuses them and ends identical."""
  src = sources.FileSource(str(_jsonl(tmp_path / "c.jsonl", _texts(200, seed=3))), "body")
  tok = tokenizers.ByteTokenizer()
  real = shards.tokenize_shard
  calls = []

  def flaky(path, *args, **kw):
    calls.append(path)
    if len(calls) == 4:
      raise KeyboardInterrupt
    return real(path, *args, **kw)

  monkeypatch.setattr(shards, "tokenize_shard", flaky)
  with pytest.raises(KeyboardInterrupt):
    builder.build(src, tok, str(tmp_path / "s"), 0.1, workers=1, shard_mb=0.02)
  partial = [p for p in (tmp_path / "s").iterdir() if p.name != scancache.CACHE_DIR]
  assert len(partial) == 1 and partial[0].name.endswith(".partial")  # nothing looks complete
  assert len(list((partial[0] / "shards").glob("*.npz"))) == 3
  monkeypatch.setattr(shards, "tokenize_shard", real)
  # Resume with other settings: the recorded shard size wins, the workers do not matter.
  d = builder.build(src, tok, str(tmp_path / "s"), 0.1, workers=2, shard_mb=5.0)
  m = _manifest(d)
  assert m["shards"]["reused"] == 3 and m["shards"]["bytes_per_shard"] == 20000
  assert not [p for p in (tmp_path / "s").iterdir() if p.name.startswith(".")]
  fresh = builder.build(src, tok, str(tmp_path / "fresh"), 0.1)
  assert _manifest(fresh)["content_sha256"] == m["content_sha256"] == store.content_hash(d)


def _prepare_cmd(root, corpus, *extra):
  return [sys.executable, "-m", "chinchax.cli", "prepare", "--config.data.source=files",
          f"--config.data.paths={corpus}", "--config.data.text_field=body",
          f"--config.data.store_root={root}", "--config.data.tokenizer=bpe",
          "--config.data.bpe_vocab_size=400", *extra]


def test_cli_sigint_then_rerun_gives_the_uninterrupted_store(tmp_path):
  corpus = _jsonl(tmp_path / "c.jsonl", _texts(6000, seed=4))  # ~2.7 MB: seconds of tokenizing for the SIGINT to land in
  root = tmp_path / "s"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.Popen(_prepare_cmd(root, corpus, "--config.data.shard_mb=0.01",
                                       "--config.data.prepare_workers=1"),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                          # as from a shell: SIGINT at its default, whatever an earlier test in
                          # this process left it at (an ignored SIGINT is inherited by children)
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  deadline = time.time() + 120
  shards = []
  while time.time() < deadline and proc.poll() is None:
    shards = list(root.glob(".*.partial/shards/*.npz"))
    if len(shards) >= 2:
      break
    time.sleep(0.02)
  assert proc.poll() is None, proc.communicate()
  proc.send_signal(signal.SIGINT)
  out, err = proc.communicate(timeout=60)
  assert proc.returncode == 130, err.decode()[-2000:]
  lines = [l for l in err.decode().splitlines() if l.startswith("interrupted")]
  assert len(lines) == 1 and "finished shard(s) kept in" in lines[0], err.decode()[-2000:]
  assert lines[0].endswith("rerun the same command to resume")
  assert not list(root.glob("bpe*/manifest.json"))  # no store looks complete
  again = subprocess.run(_prepare_cmd(root, corpus), capture_output=True, env=env, timeout=300)
  assert again.returncode == 0, again.stderr.decode()[-2000:]
  (d,) = root.glob("bpe400-*")
  m = _manifest(d)
  assert 2 <= m["shards"]["reused"] < m["shards"]["count"]
  assert b"bytes/tok" in again.stdout and m["content_sha256"].encode() in again.stdout
  src = sources.FileSource(str(corpus), "body")
  fresh = builder.build(src, tokenizers.BPESpec(400), str(tmp_path / "fresh"), 0.05)
  assert _manifest(fresh)["content_sha256"] == m["content_sha256"]
  assert (fresh / "tokenizer.json").read_text() == (d / "tokenizer.json").read_text()


def test_bad_fields_are_named_before_any_work(tmp_path, capsys):
  pa = pytest.importorskip("pyarrow")
  pq = pytest.importorskip("pyarrow.parquet")
  _jsonl(tmp_path / "c.jsonl", ["one", "two"], field="body")
  pq.write_table(pa.table({"content": ["x"]}), tmp_path / "c.parquet")
  with pytest.raises(sources.DataError, match=r"c.jsonl:1 has no field 'text'.*\['body', 'id'\]"):
    sources.FileSource(str(tmp_path / "c.jsonl"))
  with pytest.raises(sources.DataError, match=r"c.parquet has no field 'body'.*\['content'\]"):
    sources.FileSource(str(tmp_path / "c.parquet"), "body")
  rc = cli.main(["prepare", "--config.data.source=files", f"--config.data.paths={tmp_path}/c.jsonl",
                 f"--config.data.store_root={tmp_path}/s"])
  assert rc == 2 and "has no field 'text'" in capsys.readouterr().err
  assert not (tmp_path / "s").exists()
  rc = cli.main(["prepare", "--config.data.source=hf"])
  assert rc == 2 and "needs data.hf_name" in capsys.readouterr().err


def test_binary_file_read_as_text_warns(tmp_path, capsys):
  """A binary file among .txt documents: the store is built, with one warning naming the share."""
  from chinchax import config as config_lib
  from chinchax.data import builder
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  for i in range(5):
    (corpus / f"text{i}.txt").write_text("plain readable text, line after line.\n" * 40)
  (corpus / "image.txt").write_bytes(bytes(range(128, 256)) * 40)
  c = config_lib.get_variant("tiny").data
  c.update(source="files", paths=str(corpus / "*.txt"), store_root=str(tmp_path / "stores"),
           val_fraction=0.2, prepare_workers=1)
  d = builder.prepare(c)
  err = capsys.readouterr().err
  assert err.count("warning:") == 1 and "U+FFFD replacement characters" in err, err
  assert store.replacement_share(_manifest(d)) > 0.3
  (corpus / "image.txt").unlink()
  builder.prepare(c)
  assert "warning:" not in capsys.readouterr().err
