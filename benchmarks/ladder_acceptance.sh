#!/usr/bin/env bash
# Times one ladder from an empty workdir (token store built first, untimed) and prints its
# figures against the targets (benchmarks/ladder_acceptance.py): span, wall time, throughput
# as a share of the host's matmul peak, agreement and intervals of a, E, parabola residuals
# and the validation run's error.
#
#   benchmarks/ladder_acceptance.sh [--variant NAME] [--out DIR] [--] [ladder flags...]
#
#   --variant NAME  configs/ladder.py variant: default (stdlib bytes) or gutenberg (BPE)
#   --out DIR       workdir, log and figures (default /tmp/chinchax-ladder-acceptance-NAME)
#
# Examples:
#   benchmarks/ladder_acceptance.sh                         # the README's main job
#   benchmarks/ladder_acceptance.sh --variant gutenberg     # BPE on ../shared/corpora/gutenberg-en
#   benchmarks/ladder_acceptance.sh -- --config.ladder.schedule=wsd
set -euo pipefail

usage() { awk 'NR == 1 {next} /^#/ {sub(/^# ?/, ""); print; next} {exit}' "$0"; }

variant=default out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --variant) variant="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
out=${out:-/tmp/chinchax-ladder-acceptance-$variant}
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$out"
mkdir -p "$out"
cfg=(--config "$here/../configs/ladder.py:$variant" --config.workdir="$out/ladder" "$@")
# Build (or find) the token store before anything is timed.
python -c 'import sys
from chinchax import ladder
from chinchax.cli import flags
ladder.prepare(flags.parse_config(sys.argv[1:], flags.config_file("ladder.py"), "ladder"))' \
  "${cfg[@]}" --config.workdir="$out/warm" > /dev/null
rm -rf "$out/warm"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
t0=$(date +%s.%N)
chinchax ladder "${cfg[@]}" --config.ladder.progress=False > "$out/ladder.log" 2>&1
t1=$(date +%s.%N)
wall=$(python -c "print($t1 - $t0)")
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg); wall ${wall}s; log $out/ladder.log"
target=15
[[ $variant == gutenberg ]] && target=45
python "$here/ladder_acceptance.py" "$out/ladder" --wall-s "$wall" --wall-target-min "$target" \
  --json "$out/figures.json"
