#!/usr/bin/env bash
# The device suite on one GPU machine, in one command of under 8 minutes, from
# the repository's root:
#
#   bash bertjax/benchmarks/device_suite.sh [device_suite flags, e.g. --rows=large128,peer_large128]
#   FLASH_CHECK_S=0 bash bertjax/benchmarks/device_suite.sh --variants=base128
#
# First the GPU flash kernels' compile check (bertjax/benchmarks/flash_gpu_check.py,
# stopped after FLASH_CHECK_S seconds, 90 by default; 0 leaves it out), then the
# suite (bertjax/benchmarks/device_suite.py) with what is left of TOTAL_S (465 s by
# default) less 10 s for the wrap-up as its --budget_s (a --budget_s given here wins).
# The machine's python3 needs JAX, flax, optax, torch and transformers; where it
# lacks ml_collections, the script installs it from a wheel in .whl/ (made beforehand
# where pip can reach the index: `pip download --no-deps ml_collections==1.1.0 -d .whl`;
# the folder is kept out of git by .git/info/exclude and goes to the GPU machine with
# the working tree).
#
# Writes into $OUT (default /tmp/device_suite) seven files and no folders:
# device_suite.json, device_suite.md, profile_summary.md, rows.log and
# traces.tar.gz from the suite, flash_gpu_check.tar.gz (the check's rows and the
# stack dumps of those it stopped) and device_suite.log (everything printed).
set -uo pipefail
OUT="${OUT:-/tmp/device_suite}"
TOTAL_S="${TOTAL_S:-465}"
FLASH_CHECK_S="${FLASH_CHECK_S:-90}"
mkdir -p "$OUT"
start=$SECONDS
if ! python3 -c "import ml_collections" 2>/dev/null; then
  shopt -s nullglob
  wheels=(.whl/ml_collections-*.whl)
  if [ ${#wheels[@]} -eq 0 ]; then
    echo "ml_collections is not installed and .whl/ holds no wheel of it: run" \
         "'pip download --no-deps ml_collections==1.1.0 -d .whl' where pip reaches the index," \
         "and copy .whl/ to this machine with the working tree" >&2
    exit 2
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "${wheels[@]}" || exit 2
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
{
  if [ "$FLASH_CHECK_S" -gt 0 ]; then
    check_dir=$(mktemp -d)
    echo "flash_gpu_check: up to ${FLASH_CHECK_S} s, a row at most 25 s to compile and run"
    # The whole kernel's gradient first: where it compiles, the rest only confirm it.
    timeout --kill-after=5 "$FLASH_CHECK_S" python3 -m bertjax.benchmarks.flash_gpu_check \
        --out="$check_dir" --timeout_s=25 \
        --rows=grad,forward,dkv,dq,reference,grad_p0,forward_p0,dkv_p0,dq_p0
    code=$?
    [ $code -eq 124 ] && echo "flash_gpu_check: stopped after ${FLASH_CHECK_S} s (FLASH_CHECK_S)"
    tar -czf "$OUT/flash_gpu_check.tar.gz" -C "$check_dir" flash_gpu_check
  fi
  budget=$((TOTAL_S - (SECONDS - start) - 10))
  echo "device_suite: --budget_s=$budget"
  python3 -m bertjax.benchmarks.device_suite --out_dir="$OUT" --budget_s="$budget" "$@"
} 2>&1 | tee "$OUT/device_suite.log"
