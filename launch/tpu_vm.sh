#!/usr/bin/env bash
# Pretrains BERT on a Cloud TPU VM slice: one detached process per host, all
# hosts at once, re-created and resumed when a spot slice is preempted.
#
#   export TPU_NAME=bert-large ZONE=us-central2-b PROJECT=my-project
#   export ACCELERATOR=v4-64 RUNTIME=tpu-ubuntu2204-base REPO_URL=https://...
#   export SPOT=1              # optional: a spot slice through a queued resource
#   export NUM_SLICES=2        # optional: that many slices joined by the data-center
#                              # network (a queued resource; nodes $TPU_NAME-0 ...)
#   launch/tpu_vm.sh create    # book the slice (queued resource when SPOT or QUEUED)
#   launch/tpu_vm.sh setup     # install bertjax on every host
#   launch/tpu_vm.sh check configs/large.py gs://my-bucket/runs/large
#   launch/tpu_vm.sh train configs/large.py gs://my-bucket/runs/large \
#       --config.phases.seq128.train_files="gs://my-bucket/data/train_128/*.tfrecord" \
#       --config.phases.seq512.train_files="gs://my-bucket/data/train_512/*.tfrecord"
#   launch/tpu_vm.sh status    # slice state, and per host: running / exited with code N
#   launch/tpu_vm.sh logs      # follow host 0's log (WORKER=N another host, SLICE=N another slice, LOG_LINES=N history)
#   launch/tpu_vm.sh stop      # SIGTERM on every host: checkpoint, then exit
#   launch/tpu_vm.sh watch configs/large.py gs://... [overrides]   # keep the run alive
#   launch/tpu_vm.sh delete
#
# `train` runs `check` first, then starts training under tmux on every host and
# returns; tmux keeps it running after the SSH connection closes. Each host logs to
# ~/bertjax_run/train.log and copies the log to WORKDIR/logs/HOST.log every
# LOG_SYNC_SECONDS. `watch` does what `train` does, then polls every
# WATCH_INTERVAL seconds: when the slice is preempted it deletes and re-creates
# it (up to MAX_RECREATIONS times), installs, checks and reruns the same
# command, which resumes from the workdir's latest checkpoint. It returns 0
# when every host's training exited 0 and WORKDIR/summary.json exists, and
# non-zero when a host exits with an error.
#
# With NUM_SLICES=N > 1 one queued resource books N slices of ACCELERATOR
# (--node-count=N --node-prefix=$TPU_NAME: TPU VMs $TPU_NAME-0 ... -N-1) and
# every subcommand acts on every host of every slice. The TPU runtime gives
# such nodes the MEGASCALE_* settings (coordinator, number of slices, each
# slice's id) that join the slices into one JAX job; `check` reads them on
# every host (the tpu-env metadata) and refuses a job whose hosts do not
# name N slices with ids 0 ... N-1. `watch` re-creates the whole queued
# resource when any slice is preempted: a multi-slice job needs all of them.
set -euo pipefail

: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}" "${PROJECT:?set PROJECT}"
REPO_URL="${REPO_URL:-$(git config --get remote.origin.url || true)}"
BRANCH="${BRANCH:-main}"
QR_NAME="${QR_NAME:-$TPU_NAME-qr}"
RUN_DIR='~/bertjax_run'
WATCH_INTERVAL="${WATCH_INTERVAL:-60}"
MAX_RECREATIONS="${MAX_RECREATIONS:-20}"
LOG_SYNC_SECONDS="${LOG_SYNC_SECONDS:-60}"
ACTIVE_TIMEOUT="${ACTIVE_TIMEOUT:-86400}"
NUM_SLICES="${NUM_SLICES:-1}"
[[ "$NUM_SLICES" =~ ^[1-9][0-9]*$ ]] || { echo "tpu_vm.sh: NUM_SLICES=$NUM_SLICES: give a positive number of slices" >&2; exit 1; }

tpu() { gcloud compute tpus tpu-vm "$@" --zone="$ZONE" --project="$PROJECT"; }
qr() { gcloud compute tpus queued-resources "$@" --zone="$ZONE" --project="$PROJECT"; }
multislice() { (( NUM_SLICES > 1 )); }
# The TPU VMs: TPU_NAME, or TPU_NAME-0 ... TPU_NAME-(N-1) for N slices.
nodes() {
  if multislice; then for ((i = 0; i < NUM_SLICES; i++)); do echo "$TPU_NAME-$i"; done
  else echo "$TPU_NAME"; fi
}
# Runs a command on every host of every slice; fails if it failed anywhere.
on_all_hosts() {
  local node code=0
  for node in $(nodes); do tpu ssh "$node" --worker=all --command="$1" || code=$?; done
  return "$code"
}
queued() { [[ -n "${SPOT:-}${QUEUED:-}" ]] || multislice; }
die() { echo "tpu_vm.sh: $*" >&2; exit 1; }

# The job's state: READY when every slice is, else the first other state
# (CREATING, PREEMPTED, ... or MISSING) with the slice's name for several.
slice_state() {
  local node state
  for node in $(nodes); do
    state=$(tpu describe "$node" --format='value(state)' 2>/dev/null || echo MISSING)
    if [[ "$state" != READY ]]; then
      if multislice; then echo "$state ($node)"; else echo "$state"; fi
      return
    fi
  done
  echo READY
}
qr_state() { qr describe "$QR_NAME" --format='value(state.state)' 2>/dev/null || echo MISSING; }
# Hosts of every slice together.
num_hosts() {
  local node endpoints total=0
  for node in $(nodes); do
    endpoints=$(tpu describe "$node" --format='value(networkEndpoints[].ipAddress)')
    total=$((total + $(awk -F';' '{print NF}' <<<"$endpoints")))
  done
  echo "$total"
}

create() {
  : "${ACCELERATOR:?set ACCELERATOR, e.g. v4-16 for BASE, v4-64 for LARGE}"
  local runtime="${RUNTIME:-tpu-ubuntu2204-base}"
  if ! queued; then
    tpu create "$TPU_NAME" --accelerator-type="$ACCELERATOR" --version="$runtime"
    return
  fi
  local nodes_flags=(--node-id="$TPU_NAME")
  if multislice; then nodes_flags=(--node-count="$NUM_SLICES" --node-prefix="$TPU_NAME"); fi
  qr create "$QR_NAME" "${nodes_flags[@]}" --accelerator-type="$ACCELERATOR" \
      --runtime-version="$runtime" ${SPOT:+--spot}
  local waited=0 state
  while state=$(qr_state); [[ "$state" != ACTIVE ]]; do
    case "$state" in
      FAILED|SUSPENDED) die "queued resource $QR_NAME is $state; see: gcloud compute tpus queued-resources describe $QR_NAME --zone=$ZONE" ;;
    esac
    (( waited < ACTIVE_TIMEOUT )) || die "queued resource $QR_NAME not ACTIVE after ${ACTIVE_TIMEOUT}s (state $state)"
    echo "queued resource $QR_NAME: $state; waiting." >&2
    sleep "$WATCH_INTERVAL"; waited=$((waited + WATCH_INTERVAL))
  done
}

delete() {
  if queued; then qr delete "$QR_NAME" --force --quiet; else tpu delete "$TPU_NAME" --quiet; fi
}

setup() {
  : "${REPO_URL:?set REPO_URL to the git URL of bertjax}"
  on_all_hosts "set -e; sudo apt-get -qq update && sudo apt-get -qq install -y python3-venv git tmux;
    rm -rf bertjax && git clone -q --branch $(printf %q "$BRANCH") $(printf %q "$REPO_URL") bertjax &&
    cd bertjax && python3 -m venv .venv && .venv/bin/pip install -q -e '.[tpu]'"
}

# Every host has the same commit and config file, and sees the workdir's bucket.
check() {
  local config="$1" workdir="$2" expected lines
  expected=$(num_hosts)
  local bucket_check=true
  if [[ "$workdir" == gs://* ]]; then
    bucket_check="gcloud storage ls $(printf %q "${workdir%%/*}//$(cut -d/ -f3 <<<"$workdir")") >/dev/null"
  fi
  # The slice id and slice count the TPU runtime gives this host (multi-slice only).
  local megascale=""
  if multislice; then
    megascale="megascale=\$(curl -sf -H Metadata-Flavor:Google \
http://metadata.google.internal/computeMetadata/v1/instance/attributes/tpu-env \
| tr -d \"\\047\" | awk -F': *' '\$1==\"MEGASCALE_SLICE_ID\"{i=\$2} \$1==\"MEGASCALE_NUM_SLICES\"{n=\$2} END{print i\"/\"n}')"
  fi
  lines=$(on_all_hosts "cd bertjax && echo bertjax-check host=\$(hostname) \
commit=\$(git rev-parse HEAD) config=\$(sha256sum < $(printf %q "$config") | cut -c1-16) \
bucket=\$($bucket_check 2>/dev/null && echo ok || echo unreachable) $megascale" | grep '^bertjax-check ' || true)
  local n commits configs
  n=$(grep -c . <<<"$lines" || true)
  [[ "$n" == "$expected" ]] || die "check: $n of $expected hosts answered:"$'\n'"$lines"
  if grep -q 'bucket=unreachable' <<<"$lines"; then
    die "check: these hosts cannot reach ${workdir}'s bucket:"$'\n'"$(grep 'bucket=unreachable' <<<"$lines")"
  fi
  commits=$(grep -o 'commit=[0-9a-f]*' <<<"$lines" | sort -u)
  [[ $(grep -c . <<<"$commits") == 1 ]] || die "check: hosts run different commits:"$'\n'"$lines"
  if [[ -n "${COMMIT:-}" && "$commits" != "commit=$COMMIT"* ]]; then
    die "check: hosts run $commits, not COMMIT=$COMMIT"
  fi
  configs=$(grep -o 'config=[0-9a-f]*' <<<"$lines" | sort -u)
  [[ $(grep -c . <<<"$configs") == 1 && "$configs" != "config=" ]] \
      || die "check: $config differs between hosts or is missing:"$'\n'"$lines"
  if multislice; then
    local ids
    ids=$(grep -o 'megascale=[^ ]*' <<<"$lines" | sort -u)
    [[ "$(grep -o 'megascale=[0-9]*/[0-9]*' <<<"$lines" | sed 's|.*/||' | sort -u)" == "$NUM_SLICES" ]] \
        || die "check: hosts do not all name NUM_SLICES=$NUM_SLICES slices (MEGASCALE_NUM_SLICES in their tpu-env):"$'\n'"$lines"
    [[ "$(grep -o 'megascale=[0-9]*' <<<"$lines" | sed 's/megascale=//' | sort -un | tr '\n' ' ')" \
       == "$(seq -s ' ' 0 $((NUM_SLICES - 1))) " ]] \
        || die "check: the hosts' MEGASCALE_SLICE_IDs are not 0 ... $((NUM_SLICES - 1)):"$'\n'"$lines"
    echo "check: $NUM_SLICES slices joined (slice/slices: $(tr '\n' ' ' <<<"$ids"))." >&2
  fi
  echo "check: $n hosts, $commits, $config $configs, bucket reachable." >&2
}

train() {
  local config="$1" workdir="$2"; shift 2
  check "$config" "$workdir"
  # Quoted for the remote shell, so that globs in overrides reach bertjax intact.
  local cmd
  cmd=".venv/bin/python -m bertjax.main --config=$(printf %q "$config") \
--workdir=$(printf %q "$workdir") --distributed=on"
  if (( $# )); then cmd+=$(printf ' %q' "$@"); fi  # (printf of no arguments would add '')
  # run.sh: the command, its exit code left in RUN_DIR, and for gs:// workdirs
  # a copy of the log in WORKDIR/logs every LOG_SYNC_SECONDS and at the end.
  local copy=":" script
  if [[ "$workdir" == gs://* ]]; then
    copy="gcloud storage cp -q $RUN_DIR/train.log $(printf %q "$workdir")/logs/\$(hostname).log"
  fi
  script="cd ~/bertjax
(trap 'kill \$s 2>/dev/null; exit' TERM; while :; do sleep $LOG_SYNC_SECONDS & s=\$!; wait \$s; $copy; done) & sync=\$!
$cmd >> $RUN_DIR/train.log 2>&1
code=\$?
kill \$sync; $copy
echo \$code > $RUN_DIR/exit_code"
  on_all_hosts "set -e; mkdir -p $RUN_DIR; rm -f $RUN_DIR/exit_code;
    if tmux has-session -t bertjax 2>/dev/null; then echo 'training is already running' >&2; exit 1; fi
    printf '%s\n' $(printf %q "$script") > $RUN_DIR/run.sh
    tmux new-session -d -s bertjax bash $RUN_DIR/run.sh"
  echo "training started on every host; follow it with: $0 logs" >&2
}

# One line per host: 'bertjax-status HOST running', '... exited N' or '... idle'.
host_status() {
  on_all_hosts "if tmux has-session -t bertjax 2>/dev/null && [ ! -f $RUN_DIR/exit_code ]; then
      echo bertjax-status \$(hostname) running;
    elif [ -f $RUN_DIR/exit_code ]; then echo bertjax-status \$(hostname) exited \$(cat $RUN_DIR/exit_code);
    else echo bertjax-status \$(hostname) idle; fi" | grep '^bertjax-status ' || true
}

summary_exists() {
  local out
  out=$(tpu ssh "$(nodes | head -n 1)" --worker=0 --command="cd bertjax && .venv/bin/python -c 'import sys; \
from bertjax.records import fileio; print(\"bertjax-summary\", fileio.exists(sys.argv[1] + \"/summary.json\"))' \
$(printf %q "$1")") || true
  grep -q '^bertjax-summary True' <<<"$out"
}

recreate() {
  echo "slice $TPU_NAME is $1: re-creating it." >&2
  delete || true
  create
  setup
}

# `train` in a subshell: a failed start (hosts going down) is retried at the
# next poll, up to MAX_START_FAILURES times in a row.
start_or_retry() {
  if ( train "$@" ); then START_FAILURES=0; return; fi
  START_FAILURES=$((START_FAILURES + 1))
  (( START_FAILURES < ${MAX_START_FAILURES:-3} )) || die "training did not start $START_FAILURES times in a row"
  echo "tpu_vm.sh: training did not start; trying again in ${WATCH_INTERVAL}s." >&2
}

watch() {
  local workdir="$2" recreations=0 state statuses
  START_FAILURES=0
  state=$(slice_state)
  if [[ "$state" != READY ]]; then recreate "$state"; fi
  start_or_retry "$@"
  while sleep "$WATCH_INTERVAL"; do
    state=$(slice_state)
    if [[ "$state" != READY ]]; then
      (( recreations < MAX_RECREATIONS )) || die "slice $TPU_NAME is $state after $recreations re-creations; giving up"
      recreations=$((recreations + 1))
      recreate "$state"
      start_or_retry "$@"
      continue
    fi
    statuses=$(host_status)
    echo "$statuses" >&2
    grep -q ' running$' <<<"$statuses" && continue
    if grep -q ' exited [1-9]' <<<"$statuses"; then
      die "training failed on a host:"$'\n'"$statuses"$'\n'"see: $0 logs"
    fi
    if grep -q ' exited 0$' <<<"$statuses" && summary_exists "$workdir"; then
      echo "training finished: $workdir/summary.json" >&2
      return 0
    fi
    # Exited 0 without a summary (stopped for a preemption notice), or never
    # started: start again, which resumes from the latest checkpoint.
    start_or_retry "$@"
  done
}

case "${1:-}" in
  create) create ;;
  setup) setup ;;
  check) check "${2:?config file}" "${3:?workdir}" ;;
  train) train "${2:?config file}" "${3:?workdir (gs:// for pods)}" "${@:4}" ;;
  status)
    echo "slice $TPU_NAME$(multislice && echo " ($NUM_SLICES slices)" || true): $(slice_state)"
    if queued; then echo "queued resource $QR_NAME: $(qr_state)"; fi
    host_status
    ;;
  logs) tpu ssh "$(nodes | sed -n "$((${SLICE:-0} + 1))p")" --worker="${WORKER:-0}" --command="tail -n ${LOG_LINES:-100} -F $RUN_DIR/train.log" ;;
  stop) on_all_hosts "pkill -TERM -f 'bertjax.main' || true" ;;
  watch) watch "${2:?config file}" "${3:?workdir}" "${@:4}" ;;
  delete) delete ;;
  *) sed -n '2,40p' "$0"; exit 2 ;;
esac
