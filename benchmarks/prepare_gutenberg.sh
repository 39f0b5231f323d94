#!/usr/bin/env bash
# `chinchax prepare` on Project Gutenberg English (≈72 MB of .txt) with a trained byte-level BPE.
#
#   benchmarks/prepare_gutenberg.sh [CORPUS_DIR] [WORK_DIR]
#
# 1. Builds the store uninterrupted into WORK_DIR/a and prints its report (tokens, bytes per
#    token, time, MB/s).
# 2. Builds it again into WORK_DIR/b (BPE trained afresh), sends SIGINT once about half of the
#    shards are written, checks that nothing looks complete, reruns the same command, and checks
#    that the resumed store's content hash equals the uninterrupted one (recomputed from disk).
#
# Environment: VOCAB (default 8192), WORKERS (default 0 = min(8, CPUs)), SHARD_MB (default 4).
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then sed -n '2,/^[^#]/p' "$0" | sed '/^[^#]/d; s/^# \{0,1\}//'; exit 0; fi
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
CORPUS=${1:-$REPO/../shared/corpora/gutenberg-en}
WORK=${2:-$(mktemp -d -t chinchax-prepare-XXXXXX)}
VOCAB=${VOCAB:-8192}
WORKERS=${WORKERS:-0}
SHARD_MB=${SHARD_MB:-4}
mkdir -p "$WORK"

args=(--config.data.source=files "--config.data.paths=$CORPUS/*.txt"
      --config.data.tokenizer=bpe "--config.data.bpe_vocab_size=$VOCAB"
      "--config.data.prepare_workers=$WORKERS" "--config.data.shard_mb=$SHARD_MB")

echo "== 1. uninterrupted build into $WORK/a"
start=$(date +%s.%N)
chinchax prepare "${args[@]}" "--config.data.store_root=$WORK/a" 2> "$WORK/a.log"
echo "wall $(echo "$(date +%s.%N) - $start" | bc) s (process start to exit)"

echo "== 2. build into $WORK/b, SIGINT at ~50% of the shards, then rerun"
python - "$WORK" "${args[@]}" <<'EOF'
import glob, json, signal, subprocess, sys, time
work, args = sys.argv[1], sys.argv[2:]
(a,) = glob.glob(f"{work}/a/bpe*/manifest.json")
total = json.load(open(a))["shards"]["count"]
cmd = ["chinchax", "prepare", *args, f"--config.data.store_root={work}/b"]
with open(f"{work}/b1.log", "wb") as log:
  t0 = time.time()
  proc = subprocess.Popen(cmd, stdout=log, stderr=log)
  while proc.poll() is None and len(glob.glob(f"{work}/b/.*.partial/shards/*.npz")) < total // 2:
    time.sleep(0.05)
  kept = len(glob.glob(f"{work}/b/.*.partial/shards/*.npz"))
  proc.send_signal(signal.SIGINT)
  rc = proc.wait()
print(f"interrupted after {time.time() - t0:.1f}s with {kept}/{total} shards written: exit status "
      f"{rc}; complete stores in b: {len(glob.glob(f'{work}/b/bpe*/manifest.json'))}")
t0 = time.time()
out = subprocess.run(cmd, capture_output=True, text=True)
print(f"rerun: exit status {out.returncode} in {time.time() - t0:.1f}s")
print(out.stdout)
EOF

python - "$WORK" <<'EOF'
import glob, json, sys
from chinchax.data import store
work = sys.argv[1]
(a,) = glob.glob(f"{work}/a/bpe*/")
(b,) = glob.glob(f"{work}/b/bpe*/")
ha, hb = store.content_hash(a), store.content_hash(b)
ma, mb = (json.load(open(f"{d}/manifest.json")) for d in (a, b))
print(f"content sha256 uninterrupted {ha}\n               resumed       {hb}")
print(f"manifest hashes agree with the arrays: {ma['content_sha256'] == ha and mb['content_sha256'] == hb}")
print(f"tokenizers identical: {open(a + 'tokenizer.json').read() == open(b + 'tokenizer.json').read()}")
print("IDENTICAL" if ha == hb else "DIFFERENT")
sys.exit(0 if ha == hb else 1)
EOF
