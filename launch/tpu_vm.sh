#!/usr/bin/env bash
# Pretrains BERT on a Cloud TPU VM slice (one process per host, all hosts at once).
#
#   export TPU_NAME=bert-large ZONE=us-central2-b PROJECT=my-project
#   export ACCELERATOR=v4-64 RUNTIME=tpu-ubuntu2204-base BUCKET=gs://my-bucket
#   launch/tpu_vm.sh create                      # book the slice
#   launch/tpu_vm.sh setup                       # install bertjax on every host
#   launch/tpu_vm.sh train configs/large.py gs://my-bucket/runs/large \
#       --config.phases.seq128.train_files="$BUCKET/data/train_128/*.tfrecord" \
#       --config.phases.seq512.train_files="$BUCKET/data/train_512/*.tfrecord"
#   launch/tpu_vm.sh delete
#
# The run resumes from its workdir, so `train` after a preemption (or with
# --reserved/--spot slices that get recreated) picks up where it stopped.
set -euo pipefail

: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}" "${PROJECT:?set PROJECT}"
REPO_URL="${REPO_URL:-$(git config --get remote.origin.url || true)}"
BRANCH="${BRANCH:-main}"

tpu() { gcloud compute tpus tpu-vm "$@" --zone="$ZONE" --project="$PROJECT"; }
on_all_hosts() { tpu ssh "$TPU_NAME" --worker=all --command="$1"; }

case "${1:-}" in
  create)
    : "${ACCELERATOR:?set ACCELERATOR, e.g. v4-16 for BASE, v4-64 for LARGE}"
    tpu create "$TPU_NAME" --accelerator-type="$ACCELERATOR" \
        --version="${RUNTIME:-tpu-ubuntu2204-base}" ${SPOT:+--spot}
    ;;
  setup)
    : "${REPO_URL:?set REPO_URL to the git URL of bertjax}"
    on_all_hosts "set -e; sudo apt-get -qq update && sudo apt-get -qq install -y python3-venv git;
      rm -rf bertjax && git clone -q --branch $BRANCH $REPO_URL bertjax && cd bertjax &&
      python3 -m venv .venv && .venv/bin/pip install -q -e '.[tpu]'"
    ;;
  train)
    config="${2:?config file}"; workdir="${3:?workdir (gs:// for pods)}"; shift 3
    # Quoted for the remote shell, so that globs in overrides reach bertjax intact.
    overrides=$(printf ' %q' "$@")
    # jax.distributed.initialize() finds the other hosts from the TPU metadata.
    on_all_hosts "cd bertjax && .venv/bin/python -m bertjax.main --config=$(printf %q "$config") \
        --workdir=$(printf %q "$workdir") --distributed=on $overrides 2>&1 | tee -a train.log"
    ;;
  delete)
    tpu delete "$TPU_NAME" --quiet
    ;;
  *)
    sed -n '2,16p' "$0"; exit 2
    ;;
esac
