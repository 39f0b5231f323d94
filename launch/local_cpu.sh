#!/usr/bin/env bash
# Runs `chinchax train` on this machine as a single process over N virtual CPU devices.
#   launch/local_cpu.sh [--devices N] [chinchax train flags...]
set -euo pipefail
if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then
  sed -n '2,3p' "$0" | sed 's/^# //'
  exit 0
fi
devices=8
if [[ "${1:-}" == "--devices" ]]; then devices="$2"; shift 2; fi
exec chinchax train "$@" "--config.mesh.num_cpu_devices=${devices}"
