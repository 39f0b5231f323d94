"""Parallel, resumable token-store builder (``chinchax prepare`` and the trainer).

:func:`build` makes the store of :mod:`chinchax.data.store` in four steps:

1. **Scan** the source once: its fingerprint (which names the store) and
   counts. A corpus without a non-empty document is refused here, before
   anything is written. For files the scan is recorded with their stat
   signature and reused while that is unchanged (:mod:`chinchax.data.scancache`),
   so a start on an existing store reads no corpus byte.
2. **Tokenizer**: for ``tokenizer=bpe`` a byte-level BPE is trained on the
   training documents (never the validation ones) and saved as
   ``<store_root>/tokenizers/bpe<V>-<fingerprint[:16]>-val<f>-<policy>.json``;
   a later build of the same corpus reuses it. A copy goes into the store.
3. **Tokenize**: documents, in source order, are cut into shards of at least
   ``shard_mb`` MB (boundaries depend only on the documents and the shard
   size). Each shard is repaired (UTF-8 policy), assigned to splits and
   tokenized in batch by one of ``workers`` processes, then written atomically
   to ``.<store>.partial/shards/<k>.npz`` (:mod:`chinchax.data.shards`).
4. **Assemble**: the shards, in order, become the two splits' zarr arrays
   (chunk-aligned asynchronous writes, the content hash computed on another
   thread, the next shard read ahead) and document offsets; each shard file is
   deleted as soon as its tokens are taken, so the build needs about the
   store's size on disk, not twice it. The manifest is written last and the
   directory renamed into place.

**Documents.** Empty documents are skipped and counted. Invalid UTF-8 follows
``decode_errors``: ``replace`` turns each invalid sequence into U+FFFD (EF BF BD)
and keeps the document, ``skip`` drops it; both are counted in the manifest,
whose byte counts are of the repaired text.

**Resuming.** Interrupted (Ctrl-C, kill, crash), a build leaves only the hidden
``.partial`` directory, which never looks like a store. Rerunning the same
build tokenizes just the missing shards (with the shard size recorded in the
partial directory, whatever ``shard_mb`` says now). The store is identical —
same content hash — to an uninterrupted build, and does not depend on the
number of workers or the shard size.
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import json
import os
import pathlib
import shutil
import time

import numpy as np

from chinchax import console
from chinchax.storage import diskfull
from chinchax.storage import paths as paths_lib
from chinchax.data import remote as remote_lib
from chinchax.data import scancache as scancache_lib
from chinchax.data import shards as shards_lib
from chinchax.data import sources as sources_lib
from chinchax.data import store as store_lib
from chinchax.data import tokenizers as tokenizers_lib
from chinchax.runtime import watchdog

# Chunk writes a writer keeps in flight before it waits for the oldest.
_WRITES_IN_FLIGHT = 4


class _ArrayWriter:
  """Appends tokens to a pre-sized zarr array in whole chunks, hashing them on the way.

  Writes are issued asynchronously (tensorstore's threads, up to
  :data:`_WRITES_IN_FLIGHT` chunks) and hashing runs on ``hasher`` (a
  one-thread executor: updates run in the order they were added), so copying,
  hashing and writing overlap.
  """

  def __init__(self, path: pathlib.Path, dtype, n_tokens: int, hasher):
    self.arr = store_lib.open_array(path, dtype=dtype, n_tokens=n_tokens)
    self.n, self.dtype = n_tokens, np.dtype(dtype).newbyteorder("<")
    self.parts, self.buffered, self.pos = [], 0, 0
    self.hash, self.hasher = hashlib.sha256(), hasher
    self.hashed = None
    self.writes = collections.deque()

  def add(self, x: np.ndarray) -> None:
    if not len(x):
      return
    x = np.ascontiguousarray(x.astype(self.dtype, copy=False))
    self.hashed = self.hasher.submit(self.hash.update, x)
    self.parts.append(x)
    self.buffered += len(x)
    if self.buffered >= store_lib.CHUNK:
      self._flush(final=False)

  def _flush(self, final: bool) -> None:
    data = np.concatenate(self.parts) if len(self.parts) > 1 else self.parts[0]
    m = len(data) if final else len(data) // store_lib.CHUNK * store_lib.CHUNK
    if m:
      self.writes.append(self.arr[self.pos:self.pos + m].write(data[:m]))
      self.pos += m
      while len(self.writes) > _WRITES_IN_FLIGHT:
        self.writes.popleft().result()
    rest = data[m:]
    self.parts, self.buffered = ([rest] if len(rest) else []), len(rest)

  def close(self) -> str:
    if self.buffered:
      self._flush(final=True)
    while self.writes:
      self.writes.popleft().result()
    if self.hashed is not None:
      self.hashed.result()
    if self.pos != self.n:
      raise RuntimeError(f"wrote {self.pos} tokens into an array of {self.n}")
    return self.hash.hexdigest()


def _load_tokens(path: pathlib.Path) -> np.ndarray:
  with np.load(path) as z:
    return z["tokens"]


def trained_bpe(source, spec, store_root: pathlib.Path, fp: str, val_fraction: float,
                decode_errors: str, progress: bool = False):
  """The byte-level BPE for (corpus, vocab size, split): loaded if saved, else trained and saved.

  Trained on the repaired, non-empty documents that the split rule sends to
  training, in source order.
  """
  path = (store_root / "tokenizers"
          / f"{spec.name}-{fp[:16]}-val{val_fraction:g}-{decode_errors}.json")
  if path.is_file():
    return tokenizers_lib.HFTokenizer.from_file(str(path), tokenizers_lib.BPE_EOS,
                                                name=spec.name, kind="bpe")

  def texts():
    for _, data in source:
      text, _ = sources_lib.normalize(data, decode_errors) if data else (None, "")
      if text is not None and not store_lib.is_val(text, val_fraction):
        yield text.decode("utf-8")

  tok = tokenizers_lib.train_bpe(texts(), spec.vocab_size, progress=progress)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
  tmp.write_text(tok.to_json())
  os.replace(tmp, path)
  tok.origin = str(path)
  return tok


def build(source, tokenizer, store_root: str, val_fraction: float, *,
          decode_errors: str = "replace", workers: int = 1, shard_mb: float = 4.0,
          progress: bool = False, on_scan=None) -> pathlib.Path:
  """Builds (or finds, or resumes) the token store for (source, tokenizer).

  Args:
    source: a source of ``chinchax.data.sources``.
    tokenizer: a tokenizer of ``chinchax.data.tokenizers``, or a ``BPESpec``
      (the BPE is trained first).
    store_root: directory holding stores (``~`` expanded).
    val_fraction: share of documents held out (``store.SPLIT_RULE``).
    decode_errors: invalid UTF-8 policy, "replace" | "skip".
    workers: tokenizer processes; 1 tokenizes here, 0 = :func:`chinchax.data.shards.default_workers`.
    shard_mb: MB of text per shard (the unit of parallel work and of resuming).
    progress: show tqdm progress bars (stderr).
    on_scan: called with the corpus fingerprint after the scan, before a
      tokenizer is trained or anything is written (the trainer's resume check).
  Returns:
    the store directory (complete: it has a manifest).
  Raises:
    DataError: the corpus has no non-empty document, or (TokenizerError) the
      tokenizer cannot be used.
    KeyboardInterrupt: interrupted; finished shards are kept for a rerun.
  """
  if decode_errors not in ("replace", "skip"):
    raise ValueError(f"decode_errors={decode_errors!r} is not 'replace' or 'skip'")
  t0 = time.perf_counter()
  url_root = str(store_root) if paths_lib.is_url(store_root) else None  # built in a stage
  root = (remote_lib.staging_root(url_root) if url_root
          else pathlib.Path(os.path.expanduser(store_root)))
  info, _ = scancache_lib.scan(source, root)  # a full read only when the files changed
  if not info.nonempty:
    raise sources_lib.DataError(f"corpus {source.in_words()} has no non-empty document "
                                f"({info.documents} documents read)")
  fp = info.fingerprint
  if on_scan is not None:
    on_scan(fp)
  timings = {"scan_s": time.perf_counter() - t0, "tokenizer_train_s": 0.0}
  if isinstance(tokenizer, tokenizers_lib.BPESpec):
    t = time.perf_counter()
    if url_root:
      remote_lib.sync_tokenizers(url_root, root, up=False)
    tokenizer = trained_bpe(source, tokenizer, root, fp, val_fraction, decode_errors, progress)
    if url_root:
      remote_lib.sync_tokenizers(url_root, root, up=True)
    timings["tokenizer_train_s"] = time.perf_counter() - t
  final = store_lib.store_dir(str(root), fp, tokenizer, val_fraction, decode_errors)
  if url_root:  # chinchax.data.remote: build here unless the bucket has it, then upload
    remote = store_lib.store_dir(url_root, fp, tokenizer, val_fraction, decode_errors)
    if not store_lib.is_complete(remote):
      if not store_lib.is_complete(final):
        build(source, tokenizer, str(root), val_fraction, decode_errors=decode_errors,
              workers=workers, shard_mb=shard_mb, progress=progress)
      remote_lib.upload(final, remote)
    return remote
  if store_lib.is_complete(final):
    return final
  partial = final.with_name(f".{final.name}.partial")
  try:
    with watchdog.raising():  # a command's SIGINT/SIGTERM: the pool and partial files cleaned up
      return _build_into(source, tokenizer, info, final, partial, val_fraction, decode_errors,
                         workers or shards_lib.default_workers(), int(shard_mb * 1e6), progress,
                         timings, t0)
  except KeyboardInterrupt:
    raise
  except sources_lib.DataError:  # deterministic: a rerun would fail the same way
    shutil.rmtree(partial, ignore_errors=True)
    raise
  except Exception as e:
    if diskfull.is_disk_full(e):  # finished shards are kept: a rerun resumes after them
      raise diskfull.disk_full(
          "building the token store", partial, 2 * info.bytes,
          then="the shards tokenized so far are kept (at most 2 bytes per byte of text are "
               "needed)") from None
    if store_lib.is_complete(final):  # another process finished the same store meanwhile
      return final
    raise


def _build_into(source, tokenizer, info, final, partial, val_fraction, decode_errors, workers,
                shard_bytes, progress, timings, t0) -> pathlib.Path:
  shard_dir = partial / "shards"
  shard_dir.mkdir(parents=True, exist_ok=True)
  plan_path = partial / "build.json"
  plan = {"fingerprint": info.fingerprint, "tokenizer_sha256": tokenizer.digest,
          "val_fraction": val_fraction, "decode_errors": decode_errors,
          "shard_bytes": max(shard_bytes, 1)}
  if plan_path.is_file():
    saved = json.loads(plan_path.read_text())
    if {k: v for k, v in saved.items() if k != "shard_bytes"} == {
        k: v for k, v in plan.items() if k != "shard_bytes"}:
      plan["shard_bytes"] = saved["shard_bytes"]
    else:  # a different build under a colliding name: start over
      shutil.rmtree(shard_dir, ignore_errors=True)
      shard_dir.mkdir(parents=True)
  tmp_plan = plan_path.with_name(f"build.json.tmp-{os.getpid()}")
  tmp_plan.write_text(json.dumps(plan, indent=2))
  os.replace(tmp_plan, plan_path)
  for stray in shard_dir.glob("*.tmp-*"):
    stray.unlink(missing_ok=True)

  t = time.perf_counter()
  n_shards, reused = shards_lib.tokenize_all(source, tokenizer, info, shard_dir, plan["shard_bytes"],
                               val_fraction, decode_errors, workers, progress, partial)
  timings["tokenize_s"] = time.perf_counter() - t
  t = time.perf_counter()
  assembly = partial / f"store-{os.getpid()}"
  shutil.rmtree(assembly, ignore_errors=True)
  assembly.mkdir()
  counts, documents, digest = _assemble(shard_dir, n_shards, tokenizer, assembly)
  replacement_chars = documents.pop("replacement_chars")
  timings["assemble_s"] = time.perf_counter() - t
  timings["total_s"] = time.perf_counter() - t0
  tokenizer.save(assembly)
  described = tokenizer.describe()
  if "file" in described and not (assembly / described["file"]).exists():
    described.pop("file")
  manifest = {
      "format": store_lib.FORMAT,
      "source": source.describe(),
      "fingerprint": info.fingerprint,
      "tokenizer": described,
      "dtype": np.dtype(tokenizer.dtype).name,
      "val_fraction": val_fraction,
      "split_rule": store_lib.SPLIT_RULE,
      "decode_errors": decode_errors,
      "documents": documents,
      "replacement_chars": replacement_chars,
      "empty_documents_skipped": documents["empty_skipped"],
      "splits": counts,
      "content_sha256": digest,
      "shards": {"count": n_shards, "bytes_per_shard": plan["shard_bytes"], "reused": reused},
      "workers": workers,
      "source_bytes": info.bytes,
      "timings": {k: round(v, 3) for k, v in timings.items()},
      "build_seconds": round(timings["total_s"], 3),
  }
  (assembly / store_lib.MANIFEST).write_text(json.dumps(manifest, indent=2))
  final.parent.mkdir(parents=True, exist_ok=True)
  try:
    os.rename(assembly, final)
  except OSError:  # another process finished the same store first
    if not store_lib.is_complete(final):
      raise
  shutil.rmtree(partial, ignore_errors=True)
  return final


def _assemble(shard_dir: pathlib.Path, n_shards: int, tokenizer, out: pathlib.Path):
  """Concatenates shards 0..n_shards-1 into ``out``; returns (split counts, document counts, hash)."""
  metas, stats, replacement_chars = [], np.zeros(len(shards_lib.STATS), np.int64), 0
  for k in range(n_shards):
    with np.load(shard_dir / f"{k:06d}.npz") as z:
      metas.append({"doc_tokens": z["doc_tokens"], "doc_bytes": z["doc_bytes"],
                    "doc_val": z["doc_val"].copy()})
      stats += z["stats"]
      replacement_chars += int(z["replacement_chars"]) if "replacement_chars" in z else 0
  with_docs = [m for m in metas if len(m["doc_val"])]
  n_kept = sum(len(m["doc_val"]) for m in metas)
  n_val = sum(int(m["doc_val"].sum()) for m in metas)
  if n_kept == 0:
    raise sources_lib.DataError(
        f"no document is left after skipping {int(stats[1])} empty and {int(stats[3])} "
        f"invalid-UTF-8 documents (data.decode_errors='skip'?)")
  if n_val == 0:  # at least one validation document
    with_docs[-1]["doc_val"][-1] = True
    n_val = 1
  if n_val == n_kept:  # and one training document (a one-document corpus trains on it)
    with_docs[0]["doc_val"][0] = False
  counts = {}
  for split in store_lib.SPLITS:
    want = split == "val"
    counts[split] = {
        "tokens": int(sum(m["doc_tokens"][m["doc_val"] == want].sum() for m in metas)),
        "documents": int(sum((m["doc_val"] == want).sum() for m in metas)),
        "bytes": int(sum(m["doc_bytes"][m["doc_val"] == want].sum() for m in metas))}
  lengths = {s: [] for s in store_lib.SPLITS}
  # One thread hashes (in order), one reads the next shard while this one is split and written;
  # a shard's file is deleted once its tokens are taken (an interrupted assembly tokenizes the
  # deleted shards again on the rerun, to the same tokens).
  with concurrent.futures.ThreadPoolExecutor(1) as hasher, \
       concurrent.futures.ThreadPoolExecutor(1) as loader:
    writers = {s: _ArrayWriter(out / f"{s}.zarr", tokenizer.dtype, counts[s]["tokens"], hasher)
               for s in store_lib.SPLITS}
    ahead = loader.submit(_load_tokens, shard_dir / f"{0:06d}.npz") if metas else None
    for k, m in enumerate(metas):
      tokens = ahead.result()
      if k + 1 < len(metas):
        ahead = loader.submit(_load_tokens, shard_dir / f"{k + 1:06d}.npz")
      on_val = np.repeat(m["doc_val"], m["doc_tokens"])
      writers["val"].add(tokens[on_val])
      writers["train"].add(tokens[~on_val])
      del tokens
      (shard_dir / f"{k:06d}.npz").unlink(missing_ok=True)
      lengths["val"].append(m["doc_tokens"][m["doc_val"]])
      lengths["train"].append(m["doc_tokens"][~m["doc_val"]])
    hexes = {split: writers[split].close() for split in store_lib.SPLITS}
  parts = {}
  for split in store_lib.SPLITS:
    token_hex = hexes[split]
    lens = np.concatenate(lengths[split]) if lengths[split] else np.zeros(0, np.int64)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64) if len(lens) else lens
    np.save(out / f"{split}_docs.npy", starts)
    parts[split] = (counts[split]["tokens"], token_hex,
                    hashlib.sha256(starts.astype("<i8").tobytes()).hexdigest())
  documents = {"replacement_chars": replacement_chars, "read": int(stats[0]), "kept": n_kept,
               "empty_skipped": int(stats[1]), "invalid_utf8_replaced": int(stats[2]), "invalid_utf8_skipped": int(stats[3])}
  return counts, documents, store_lib.hash_parts(tokenizer.dtype, parts)


def prepare(data_cfg, *, progress: bool = False, on_scan=None) -> pathlib.Path:
  """Builds (or finds) the store ``config.data`` describes; returns its directory.

  ``on_scan``: see :func:`build`.

  Raises:
    DataError: bad source, field, tokenizer file or empty corpus (before tokenizing).
    PathError: ``data.store_root`` cannot be written, or a corpus file read (before the scan).
  """
  paths_lib.check_writable_dir(data_cfg.store_root, "data.store_root")
  source = sources_lib.make_source(data_cfg)
  tokenizer = tokenizers_lib.make_tokenizer(data_cfg)
  directory = build(source, tokenizer, data_cfg.store_root, data_cfg.val_fraction,
                    decode_errors=data_cfg.decode_errors, workers=data_cfg.prepare_workers,
                    shard_mb=data_cfg.shard_mb, progress=progress, on_scan=on_scan)
  store_lib.warn_replacement_share(directory)
  return directory


def report(directory: pathlib.Path) -> str:
  """A human summary of a store's manifest: counts, bytes per token, time, throughput."""
  directory = paths_lib.as_path(directory)
  m = json.loads((directory / store_lib.MANIFEST).read_text())
  sp, docs, tok, t = m["splits"], m["documents"], m["tokenizer"], m["timings"]
  tokens = sp["train"]["tokens"] + sp["val"]["tokens"]
  text_bytes = sp["train"]["bytes"] + sp["val"]["bytes"]
  text_tokens = tokens - docs["kept"]  # EOS excluded
  mb = m["source_bytes"] / 1e6
  lines = [
      f"store      {directory}",
      f"source     {m['source']['kind']}, {mb:.2f} MB, fingerprint {m['fingerprint'][:16]}",
      f"tokenizer  {tok['name']} ({tok['kind']}), vocab {tok['vocab_size']:,}, eos id "
      f"{tok['eos_id']}, sha256 {tok['sha256'][:16]}, ids stored as {m['dtype']}"
      + (f"; adds {tok['added_tokens']}" if tok.get("added_tokens") else ""),
      f"documents  {docs['read']:,} read, {docs['kept']:,} kept; {docs['empty_skipped']:,} empty "
      f"skipped; invalid UTF-8: {docs['invalid_utf8_replaced']:,} replaced, "
      f"{docs['invalid_utf8_skipped']:,} skipped ({m['decode_errors']})",
      f"tokens     {tokens:,} (train {sp['train']['tokens']:,} in {sp['train']['documents']:,} "
      f"docs, val {sp['val']['tokens']:,} in {sp['val']['documents']:,} docs; EOS included)",
      f"bytes/tok  {text_bytes / max(text_tokens, 1):.3f} bytes of text per token (EOS excluded)",
      f"time       {t['total_s']:.1f}s total: scan {t['scan_s']:.1f}s, tokenizer training "
      f"{t['tokenizer_train_s']:.1f}s, tokenize {t['tokenize_s']:.1f}s, assemble "
      f"{t['assemble_s']:.1f}s; {mb / max(t['total_s'], 1e-9):.2f} MB/s overall, "
      f"{mb / max(t['tokenize_s'], 1e-9):.2f} MB/s tokenizing ({m['workers']} worker(s); "
      f"{m['shards']['reused']} of {m['shards']['count']} shards reused from an earlier run)",
      f"content    sha256 {m['content_sha256']}",
  ]
  return "\n".join(lines)


def run_prepare(config) -> pathlib.Path:
  """``chinchax prepare``: builds (or finds) the store of ``config.data`` and prints its report."""
  started = time.time()
  directory = prepare(config.data, progress=True)
  st = (directory / store_lib.MANIFEST).stat()
  if getattr(st, "st_mtime", getattr(st, "mtime", started)) < started:  # local | gs:// (epath)
    console.say("store already complete (built earlier; times below are from that build)")
  console.say(report(directory))
  sp = json.loads((directory / store_lib.MANIFEST).read_text())["splits"]
  if not sp["val"]["documents"] or not sp["train"]["documents"]:
    empty = "validation" if not sp["val"]["documents"] else "training"
    console.warn(f"the {empty} split is empty ({sp['train']['documents']:,} train, "
                 f"{sp['val']['documents']:,} val documents): chinchax train cannot use this "
                 f"store; split the corpus into more documents (files, or lines of a .jsonl)")
  return directory
