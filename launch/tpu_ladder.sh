#!/usr/bin/env bash
# Runs a `chinchax ladder` on N single-host Cloud TPU VMs (queued and/or spot): every VM runs
# one ladder worker that claims runs from a shared workdir until none is left.
#
#   launch/tpu_ladder.sh --name PREFIX --zone ZONE --count N [--project PROJECT]
#                        [--accelerator-type TYPE] [--create | --queued] [--spot]
#                        [--version VERSION] [--sync] [--setup] [--dir DIR] [--dry-run]
#                        [--] [chinchax ladder flags...]
#
#   --name PREFIX            the VMs are PREFIX-0 ... PREFIX-(N-1)
#   --zone ZONE              zone, e.g. us-east5-b
#   --count N                number of VMs, one worker each (default 1)
#   --project PROJECT        GCP project (default: gcloud's configured project)
#   --accelerator-type TYPE  single-host slice for --create / --queued, e.g. v5litepod-8, v6e-8
#   --version VERSION        TPU software version (default: tpu-ubuntu2204-base)
#   --create                 create the VMs first (tpu-vm create)
#   --queued                 create them through queued resources and wait until each is ACTIVE
#   --spot                   spot (preemptible) capacity, with --create / --queued
#   --sync                   copy this checkout (without .git, .venv, runs/) to DIR on every VM
#   --setup                  make DIR/.venv and pip install -e "DIR[tpu]" on every VM
#   --dir DIR                code directory on the VMs (default: chinchax, under $HOME)
#   --dry-run                print the gcloud commands instead of running them
#   --skip-compile           do not compile the ladder's programs for the VMs first: by default
#                            `chinchax compile --ladder --topology TYPE` (here, no TPU needed)
#                            compiles every distinct program of the ladder (each in its own
#                            process, through the compile cache) and stops the launch before
#                            anything is created when one does not fit (exit 3)
#
# Each VM starts, detached (nohup, log in DIR/ladder-worker.log), a loop around
# `chinchax ladder --config.ladder.worker=True FLAGS` that starts the worker again after a
# preemption notice (exit status 75: checkpoint saved, lease released). Give --config.workdir
# and the store root as gs:// URLs (docs/storage.md): leases (created with ifGenerationMatch=0),
# checkpoints, rows and the fit live in the bucket; the VMs share no disk. A VM that is reclaimed (spot) leaves a lease that expires after
# ladder.lease_expiry_s; another worker resumes that run from its checkpoint. Running this
# script again (with --create / --queued for the lost VMs) adds workers; finished runs are
# never run twice. The worker that records the last run fits the table.
#
# Example:
#   launch/tpu_ladder.sh --name ladder --zone us-east5-b --count 8 --accelerator-type v6e-8 \
#     --queued --spot --sync --setup -- --config=configs/ladder.py:gutenberg \
#     --config.workdir=gs://my-bucket/runs/ladder \
#     --config.train_config.data.store_root=gs://my-bucket/stores
set -euo pipefail

usage() { awk 'NR == 1 || /^#SBATCH/ {next} /^#/ {sub(/^# ?/, ""); print; next} {exit}' "$0"; }

name="" zone="" project="" accel="" version="tpu-ubuntu2204-base" dir="chinchax" count=1
create=0 queued=0 spot=0 sync=0 setup=0 dry_run=0 skip_compile=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --name) name="$2"; shift 2 ;;
    --zone) zone="$2"; shift 2 ;;
    --count) count="$2"; shift 2 ;;
    --project) project="$2"; shift 2 ;;
    --accelerator-type) accel="$2"; shift 2 ;;
    --version) version="$2"; shift 2 ;;
    --dir) dir="$2"; shift 2 ;;
    --create) create=1; shift ;;
    --queued) queued=1; shift ;;
    --spot) spot=1; shift ;;
    --sync) sync=1; shift ;;
    --setup) setup=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    --skip-compile) skip_compile=1; shift ;;
    --) shift; break ;;
    *) break ;;
  esac
done
if [[ -z "$name" || -z "$zone" ]]; then
  echo "error: --name and --zone are required (see --help)" >&2
  exit 2
fi
if ! [[ "$count" =~ ^[1-9][0-9]*$ ]]; then
  echo "error: --count must be a positive integer, got '$count'" >&2
  exit 2
fi
if [[ $((create + queued)) -gt 0 && -z "$accel" ]]; then
  echo "error: --create / --queued need --accelerator-type, e.g. v6e-8" >&2
  exit 2
fi

where=(--zone="$zone")
if [[ -n "$project" ]]; then where+=(--project="$project"); fi
# shellcheck source=launch/tpu_common.bash
source "$(dirname "${BASH_SOURCE[0]}")/tpu_common.bash"

tpu_precompile --ladder "$@"

vms=()
for ((i = 0; i < count; i++)); do vms+=("$name-$i"); done
for vm in "${vms[@]}"; do
  if ((create)); then tpu_create "$vm" create; elif ((queued)); then tpu_create "$vm" queued; fi
done
if ((queued)); then
  for vm in "${vms[@]}"; do tpu_wait_active "$vm"; done
fi
if ((sync)); then
  tpu_pack
  for vm in "${vms[@]}"; do tpu_sync "$vm"; done
fi
if ((setup)); then
  for vm in "${vms[@]}"; do tpu_setup "$vm"; done
fi

flags=""
if [[ $# -gt 0 ]]; then flags="$(printf ' %q' "$@")"; fi
worker="while :; do .venv/bin/chinchax ladder${flags} --config.ladder.worker=True; rc=\$?;"
worker+=" [ \$rc -eq 75 ] || exit \$rc; done"
for vm in "${vms[@]}"; do
  tpu_on_all_workers "$vm" "cd $dir && nohup bash -c '$worker' >> ladder-worker.log 2>&1 < /dev/null &"
done
