#!/usr/bin/env bash
# The device suite (bertjax/benchmarks/device_suite.py) on a GPU machine whose
# Python has JAX, flax and optax but not ml_collections, from the repository's root:
#
#   bash bertjax/benchmarks/device_suite.sh [device_suite flags, e.g. --rows=1,6]
#
# Installs ml_collections from a wheel in .whl/ (made beforehand where pip can
# reach the index: `pip download --no-deps ml_collections==1.1.0 -d .whl`; the
# folder is kept out of git by .git/info/exclude and goes to the GPU machine with
# the working tree), then writes $OUT/device_suite.json, device_suite.md,
# profile_summary.md, device_suite.log and trace/ ($OUT defaults to
# /tmp/device_suite).
set -uo pipefail
OUT="${OUT:-/tmp/device_suite}"
mkdir -p "$OUT"
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
PYTHONUNBUFFERED=1 python3 -m bertjax.benchmarks.device_suite --out_dir="$OUT" "$@" 2>&1 \
    | tee "$OUT/device_suite.log"
