"""The store read path and the cheaper prepare: batches equal to the window-by-window reference,
raw chunk files read like tensorstore reads them, a held gs:// split read once byte for byte,
the existing-store start without a scan,
shards deleted during assembly, huge documents encoded in pieces to the same ids."""

import json
import os
import shutil

import numpy as np
import pytest
import tensorstore as ts

from gcs_server import gcs, gcs_url  # noqa: F401

from chinchax.data import builder, pipeline, reader, scancache, sources, store, tokenizers


@pytest.fixture(scope="module")
def byte_store(small_corpus, tmp_path_factory):
  src = sources.FileSource(str(small_corpus / "*.txt"))
  return builder.build(src, tokenizers.ByteTokenizer(), str(tmp_path_factory.mktemp("s")), 0.1)


@pytest.mark.parametrize("kind", ["mmap", "ranged", "tensorstore", "memory"])
def test_batches_equal_the_window_by_window_reference(byte_store, kind):
  # The reference: each window read by itself through tensorstore, no cache (earlier versions).
  ref = store.TokenSplit(byte_store, "train", reader="tensorstore", cache_mb=0)
  split = store.TokenSplit(byte_store, "train", reader=kind)
  assert split.reader.kind == kind
  a = pipeline.TrainBatches(ref, 64, 16, steps=30, seed=5)
  b = pipeline.TrainBatches(split, 64, 16, steps=30, seed=5, rows=(4, 12))
  for step in (0, 7, 29):
    want = a.batch_rowwise(step)
    got = b.batch(step)
    assert got.dtype == want.dtype == np.int32
    np.testing.assert_array_equal(got, want[4:12])
    np.testing.assert_array_equal(b.batch_rowwise(step), got)
  for step, got in b.iterator(25, num_threads=2, prefetch=3):
    np.testing.assert_array_equal(got, a.batch_rowwise(step)[4:12])
  val_ref = pipeline.WindowSource(store.TokenSplit(byte_store, "val", reader="tensorstore"), 32)
  val = store.TokenSplit(byte_store, "val", reader=kind)
  w = pipeline.eval_windows(val, 32, 10, 4, rows=(1, 3))
  for c, chunk in enumerate(w.chunks):
    ids = [w.window_ids[min(c * 4 + r, 9)] for r in (1, 2)]
    np.testing.assert_array_equal(chunk, np.stack([val_ref[int(i)] for i in ids]))


def _array(path, data, chunk, codecs=None):
  spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}
  kw = {"codecs": codecs} if codecs else {}
  arr = ts.open({**spec, "metadata": {"chunk_grid": {"name": "regular", "configuration": {
      "chunk_shape": [chunk]}}, **kw}}, create=True, dtype=ts.dtype(data.dtype.name),
      shape=[len(data)]).result()
  arr.write(data).result()
  return arr


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_chunk_files_read_as_tensorstore_reads_them(tmp_path, dtype):
  data = np.random.default_rng(0).integers(1, 60000, 10_500).astype(dtype)
  arr = _array(tmp_path / "a.zarr", data, 1000)  # the last chunk is partial
  (tmp_path / "a.zarr" / "c" / "3").unlink()  # a chunk never written reads as the fill value
  mm = reader.ChunkFileReader.open(tmp_path / "a.zarr")
  ranged = reader.RangeReader.open(tmp_path / "a.zarr")
  tsr = reader.TensorstoreReader(store.open_array(tmp_path / "a.zarr"))
  assert mm is not None and np.all(tsr.read(3000, 1000) == 0)
  starts = np.array([0, 990, 2950, 3999, 5000, 10_500 - 2100, 7, 10_500 - 2103])
  want = tsr.read_windows(starts, 2100)
  np.testing.assert_array_equal(mm.read_windows(starts, 2100), want)
  np.testing.assert_array_equal(ranged.read_windows(starts, 2100), want)
  np.testing.assert_array_equal(mm.read(0, 10_500), np.asarray(arr.read().result()))
  with pytest.raises(IndexError, match="leaves the array"):
    mm.read_windows([10_000], 600)
  # Compressed chunks cannot be mapped: the split falls back to tensorstore.
  _array(tmp_path / "z.zarr", data, 1000, [{"name": "bytes"}, {"name": "zstd"}])
  assert reader.ChunkFileReader.open(tmp_path / "z.zarr") is None
  assert reader.RangeReader.open(tmp_path / "z.zarr") is None


def test_gcs_store_reads_the_same_batches(byte_store, gcs_url, tmp_path):
  from chinchax.data import remote
  copy = tmp_path / byte_store.name
  shutil.copytree(byte_store, copy)
  remote.upload(copy, gcs_url)
  ref = pipeline.TrainBatches(store.TokenSplit(byte_store, "train", reader="tensorstore",
                                               cache_mb=0), 64, 16, steps=30, seed=2)
  for kind in ("auto", "ranged", "tensorstore"):
    split = store.TokenSplit(gcs_url, "train", reader=kind)
    assert split.reader.kind == {"auto": "memory"}.get(kind, kind)  # a small split is held
    got = pipeline.TrainBatches(split, 64, 16, steps=30, seed=2)
    for step in (0, 11):
      np.testing.assert_array_equal(got.batch(step), ref.batch_rowwise(step))


def test_gcs_split_held_in_memory_reads_each_token_byte_once(gcs, tmp_path):
  # Counted on the wire (a proxy in front of the fake server): a held split costs its tokens'
  # bytes, not the padding of its partial last chunk, and gives the tokens written.
  import gcs_proxy
  import gcs_server
  from chinchax.data import remote
  data = np.random.default_rng(3).integers(1, 60000, 10_500).astype(np.uint16)
  local = tmp_path / "st"
  for name, codecs in (("train", None), ("val", [{"name": "bytes"}, {"name": "zstd"}])):
    _array(local / f"{name}.zarr", data, 1000, codecs)  # 11 chunks, the last one partial
  (local / store.MANIFEST).write_text(json.dumps({"splits": {
      s: {"tokens": len(data), "bytes": len(data)} for s in store.SPLITS}}))
  url = f"gs://{gcs_server.BUCKET}/held-{tmp_path.name}"
  remote.upload(local, url)
  proxy = gcs_proxy.CountingProxy(gcs.url)
  gcs_server.point_clients_at(proxy.url)
  try:
    before = proxy.snapshot()
    split = store.TokenSplit(url, "train")
    got = proxy.since(before)
    held_zstd = store.TokenSplit(url, "val")  # compressed chunks: whole chunks, no cache kept
  finally:
    gcs_server.point_clients_at(gcs.url)
    proxy.close()
  assert split.reader.kind == held_zstd.reader.kind == "memory"
  np.testing.assert_array_equal(split.all_tokens(), data)
  np.testing.assert_array_equal(held_zstd.all_tokens(), data)
  chunks = [(path, n) for method, path, n in got.log if "train.zarr/c/" in path]
  assert sorted(p.split("train.zarr/c/")[1].split("?")[0] for p, _ in chunks) == sorted(
      str(i) for i in range(11))  # each chunk object read once
  assert sum(n for _, n in chunks) == data.nbytes  # 21,000 bytes, not 11 x 2,000


class _CountingSource(sources.FileSource):
  reads = 0

  def __iter__(self):
    type(self).reads += 1
    return super().__iter__()


def test_existing_store_start_reads_no_corpus_but_a_changed_file_is_rescanned(tmp_path):
  for i in range(3):
    (tmp_path / f"d{i}.txt").write_text(f"document {i} " * 200)
  tok = tokenizers.ByteTokenizer()

  def build():
    _CountingSource.reads = 0
    src = _CountingSource(str(tmp_path / "*.txt"))
    return builder.build(src, tok, str(tmp_path / "s"), 0.4), _CountingSource.reads

  first, reads = build()
  assert reads == 2  # the scan, then the tokenizer
  again, reads = build()
  assert again == first and reads == 0
  # Same size, modification time put back: the change time still gives it away.
  f = tmp_path / "d1.txt"
  st = f.stat()
  f.write_text(f.read_text().replace("document 1", "DOCUMENT 1"))
  os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
  assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
  changed, reads = build()
  assert changed != first and reads == 2
  fresh = sources.fingerprint(sources.FileSource(str(tmp_path / "*.txt")))
  assert store.store_dir(str(tmp_path / "s"), fresh, tok, 0.4) == changed
  _, reads = build()
  assert reads == 0
  assert len(list((tmp_path / "s" / scancache.CACHE_DIR).glob("*.json"))) == 1


def test_assembly_deletes_each_shard_once_taken(tmp_path, monkeypatch):
  for i in range(12):
    (tmp_path / f"d{i:02d}.txt").write_text(f"text of document {i}\n" * 600)
  seen = []
  real = builder._load_tokens

  def load(path):
    k = int(path.stem)
    seen.append((k, sorted(int(p.stem) for p in path.parent.glob("*.npz"))))
    return real(path)

  monkeypatch.setattr(builder, "_load_tokens", load)
  d = builder.build(sources.FileSource(str(tmp_path / "*.txt")), tokenizers.ByteTokenizer(),
                    str(tmp_path / "s"), 0.2, shard_mb=0.02)
  assert len(seen) >= 6
  for k, present in seen:  # shards before the one being taken (and the one read ahead) are gone
    assert all(j >= k - 1 for j in present), (k, present)
  full = builder.build(sources.FileSource(str(tmp_path / "*.txt")), tokenizers.ByteTokenizer(),
                       str(tmp_path / "t"), 0.2, shard_mb=100)
  assert store.content_hash(d) == store.content_hash(full)


def _text(rng, n_lines):
  words = ["hello", "world", "the", "é", "日本語", "123", "4.5", "it's", "(a)", "don't", "x"]
  seps = ["\n", "\n\n", " \n", "\n ", "\r\n", ".\n", "\t\n", "  "]
  return "".join(" ".join(rng.choice(words, rng.integers(1, 9))) + str(rng.choice(seps))
                 for _ in range(n_lines)).encode()


def test_huge_document_is_encoded_in_pieces_to_the_same_ids(monkeypatch):
  rng = np.random.default_rng(0)
  tok = tokenizers.train_bpe([_text(rng, 3000).decode() for _ in range(2)], 500)
  assert tok.splittable
  doc = _text(rng, 5000)
  pieces = tokenizers.split_document(doc, 2048)
  assert len(pieces) > 20 and b"".join(pieces) == doc
  assert max(map(len, pieces)) <= 2048
  whole = np.asarray(tok._tok.encode(doc.decode(), add_special_tokens=False).ids)
  monkeypatch.setattr(tokenizers, "PIECE_BYTES", 2048)
  monkeypatch.setattr(tokenizers, "ENCODE_GROUP_BYTES", 5000)
  got = tok.encode_batch([b"short", doc, doc[:777]])
  np.testing.assert_array_equal(got[1], whole)
  np.testing.assert_array_equal(
      got[2], tok._tok.encode(doc[:777].decode(), add_special_tokens=False).ids)
  # The check has teeth: cuts at every 4096th byte (mid-word, mid-character) change the ids.
  cut = [doc[i:i + 4096].decode("utf-8", "ignore") for i in range(0, len(doc), 4096)]
  naive = np.concatenate([tok._tok.encode(c, add_special_tokens=False).ids for c in cut])
  assert not np.array_equal(naive, whole)
  # A pre-tokenisation that adds a prefix space is not cut.
  prefixed = tokenizers._hf().Tokenizer.from_str(tok.to_json().replace(
      '"add_prefix_space":false', '"add_prefix_space":true'))
  assert not tokenizers.HFTokenizer(prefixed, name="p").splittable
