#!/usr/bin/env bash
# Wall time of one ladder with 1 and K local workers, back to back, in fresh workdirs
# (the token store is built before the first timing), with the load average before each.
#
#   benchmarks/ladder_workers.sh [--workers K] [--k-first] [--out DIR] [--] [ladder flags...]
#
#   --workers K  the parallel case (default 2)
#   --k-first    time K workers first, then 1 (a drifting machine load then biases the other way)
#   --out DIR    workdirs and logs (default /tmp/chinchax-ladder-workers; emptied first)
#
# Example (the default ladder's first two budgets, no fit):
#   benchmarks/ladder_workers.sh -- --config.ladder.n_budgets=2 --config.ladder.c_max=1.077e11
set -euo pipefail

usage() { awk 'NR == 1 {next} /^#/ {sub(/^# ?/, ""); print; next} {exit}' "$0"; }

k=2 out=/tmp/chinchax-ladder-workers k_first=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --workers) k="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --k-first) k_first=1; shift ;;
    --) shift; break ;;
    *) break ;;
  esac
done
rm -rf "$out"
mkdir -p "$out"
common=(--config.ladder.fit=False --config.ladder.progress=False
        --config.train_config.data.store_root="$out/stores" "$@")
# Build the token store (the grid's data check) before anything is timed.
python -c 'import sys
from chinchax import ladder
from chinchax.cli import flags
ladder.prepare(flags.parse_config(sys.argv[1:], flags.config_file("ladder.py"), "ladder"))' \
  "${common[@]}" --config.workdir="$out/warm"
cases=(1 "$k")
if ((k_first)); then cases=("$k" 1); fi
for n in "${cases[@]}"; do
  load="$(cut -d' ' -f1-3 /proc/loadavg)"
  t0=$(date +%s%N)
  # A fresh XLA compilation cache per case: both pay the compiles of a first ladder.
  chinchax ladder "${common[@]}" --config.workdir="$out/w$n" --config.ladder.workers="$n" \
    --config.train_config.compile_cache_dir="$out/xla-cache-$n" > "$out/w$n.log" 2>&1
  t1=$(date +%s%N)
  printf 'workers=%s wall=%ss loadavg_before=%s loadavg_after=%s %s\n' "$n" \
    "$(( (t1 - t0) / 1000000000 ))" "$load" "$(cut -d' ' -f1-3 /proc/loadavg)" \
    "$(grep -h 'ladder  finished' "$out/w$n.log" | tail -n 1)"
done
