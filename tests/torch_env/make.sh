#!/usr/bin/env bash
# Creates the PyTorch + transformers 5 environment that
# tests/test_export_torch.py runs its half in: ./.venv-torch, or the path given.
set -euo pipefail
cd "$(dirname "$0")/../.."
env_dir="${1:-.venv-torch}"
python3 -m venv "$env_dir"
# One retry: an unreachable PyTorch index costs a second per package, not minutes.
"$env_dir/bin/pip" install -q --retries 1 -r tests/torch_env/requirements.txt \
  > "$env_dir/install.log" 2>&1 || { cat "$env_dir/install.log"; exit 1; }
"$env_dir/bin/python" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'in $env_dir')"
