# gcloud steps for Cloud TPU VMs, sourced by launch/tpu_pod.sh and launch/tpu_ladder.sh.
# They read the caller's settings: dry_run (1: print the commands), where (--zone/--project
# flags), accel, version, spot, dir and skip_compile; tpu_pack sets archive.
# shellcheck disable=SC2154  # the settings come from the sourcing script

# Runs a command, or prints it (`+ cmd args`, shell-quoted) under --dry-run.
tpu_run() {
  if ((dry_run)); then
    printf '+'; printf ' %q' "$@"; printf '\n'
  else
    "$@"
  fi
}

# tpu_precompile [FLAGS...]: before anything is created, compiles the run for $accel with
# `chinchax compile --topology $accel --no-eval --require-fit FLAGS` (here, no TPU needed;
# $CHINCHAX names the binary) and exits with its status when the program does not fit or does
# not compile. skip_compile=1 skips it; under --dry-run it is printed. With slices > 1 it
# compiles for that many slices (--slices).
tpu_precompile() {
  if ((skip_compile)); then return 0; fi
  if [[ -z "$accel" ]]; then
    echo "error: the pre-launch compile needs --accelerator-type (e.g. v5p-32), or pass" \
         "--skip-compile" >&2
    exit 2
  fi
  local cmd=("${CHINCHAX:-chinchax}" compile --topology "$accel" --no-eval --require-fit "$@")
  if ((${slices:-1} > 1)); then cmd+=(--slices "$slices"); fi
  if ((dry_run)); then
    printf '+'; printf ' %q' "${cmd[@]}"; printf '\n'
    return 0
  fi
  echo "compiling the run for $accel before launching (--skip-compile to skip)" >&2
  local status=0
  "${cmd[@]}" || status=$?
  if ((status != 0)); then
    echo "error: chinchax compile for $accel stopped the launch (exit status $status);" \
         "nothing was created or started" >&2
    exit "$status"
  fi
}

# tpu_on_all_workers VM COMMAND: runs COMMAND on every worker (host) of VM.
tpu_on_all_workers() {
  tpu_run gcloud compute tpus tpu-vm ssh "$1" "${where[@]}" --worker=all --command="$2"
}

# tpu_create VM create|queued: creates VM directly or through a queued resource; with
# slices > 1 the queued resource holds that many slices, named VM-0 … VM-<slices-1>.
tpu_create() {
  local extra=()
  if ((spot)); then extra+=(--spot); fi
  if [[ "$2" == create ]]; then
    tpu_run gcloud compute tpus tpu-vm create "$1" "${where[@]}" \
      --accelerator-type="$accel" --version="$version" "${extra[@]}"
  else
    local nodes=(--node-id="$1")
    if ((${slices:-1} > 1)); then nodes=(--node-count="$slices" --node-prefix="$1"); fi
    tpu_run gcloud compute tpus queued-resources create "$1" "${where[@]}" "${nodes[@]}" \
      --accelerator-type="$accel" --runtime-version="$version" "${extra[@]}"
  fi
}

# tpu_wait_active VM: waits until VM's queued resource is ACTIVE (nothing under --dry-run).
tpu_wait_active() {
  if ((dry_run)); then return 0; fi
  until [[ "$(gcloud compute tpus queued-resources describe "$1" "${where[@]}" \
              --format='value(state.state)')" == "ACTIVE" ]]; do
    echo "waiting for queued resource $1 to become ACTIVE..." >&2
    sleep 30
  done
}

# tpu_pack: tars this checkout (without .git, .venv, runs/) into the file named by $archive.
tpu_pack() {
  local repo
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  archive="${TMPDIR:-/tmp}/chinchax-$$.tar.gz"
  tpu_run tar -C "$repo" --exclude=.git --exclude=.venv --exclude=runs --exclude='*.egg-info' \
    -czf "$archive" .
}

# tpu_sync VM: unpacks $archive (tpu_pack) into dir on every worker of VM.
tpu_sync() {
  tpu_run gcloud compute tpus tpu-vm scp "$archive" "$1:chinchax.tar.gz" "${where[@]}" --worker=all
  tpu_on_all_workers "$1" "mkdir -p $dir && tar -xzf chinchax.tar.gz -C $dir && rm chinchax.tar.gz"
}

# tpu_setup VM: makes dir/.venv with chinchax[tpu] on every worker of VM.
tpu_setup() {
  tpu_on_all_workers "$1" "cd $dir && python3 -m venv .venv && .venv/bin/pip install -q -e '.[tpu]'"
}
