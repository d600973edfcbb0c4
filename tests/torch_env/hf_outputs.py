"""What transformers 5 with PyTorch makes of bertjax exports.

  .venv-torch/bin/python tests/torch_env/hf_outputs.py SPEC.json INPUTS.npz OUT_DIR

runs in the environment tests/torch_env/make.sh creates (no JAX, no
bertjax). SPEC.json names
  "tokenizers": {name: {"dir": export, "texts": [...]}} and
  "models": {name: {"dir": export, "auto": "AutoModelFor...", "outputs": [...]}},
with each model's inputs in INPUTS.npz as "name/input_ids", "name/attention_mask"
and "name/token_type_ids". It loads each directory as it is, offline, with
that Auto class and AutoTokenizer, and writes OUT_DIR/outputs.npz
("name/output" in float32) and OUT_DIR/results.json: per tokenizer its class
and the ids of each text (special tokens added); per model its class and
transformers' loading report (missing, unexpected and mismatched weights).
tests/test_export_torch.py compares them with bertjax.
"""

import json
import os
import sys

import numpy as np
import torch
import transformers


def run_tokenizer(spec: dict) -> dict:
  tok = transformers.AutoTokenizer.from_pretrained(spec["dir"])
  return {"class": type(tok).__name__,
          "ids": [tok(text)["input_ids"] for text in spec["texts"]],
          "mask_token_id": tok.mask_token_id, "pad_token_id": tok.pad_token_id}


def run_model(spec: dict, inputs: dict[str, np.ndarray]) -> tuple[dict, dict]:
  auto = getattr(transformers, spec["auto"])
  model, info = auto.from_pretrained(spec["dir"], output_loading_info=True)
  model.eval()
  with torch.no_grad():
    got = model(**{k: torch.from_numpy(v.astype(np.int64)) for k, v in inputs.items()})
  report = {"class": type(model).__name__,
            "loading": {k: sorted(map(str, v)) for k, v in info.items()
                        if k in ("missing_keys", "unexpected_keys", "mismatched_keys")}}
  return report, {name: getattr(got, name).float().numpy() for name in spec["outputs"]}


def main(spec_path: str, inputs_path: str, out_dir: str) -> None:
  with open(spec_path) as f:
    spec = json.load(f)
  arrays = dict(np.load(inputs_path))
  results = {"torch": torch.__version__, "transformers": transformers.__version__,
             "tokenizers": {n: run_tokenizer(s) for n, s in spec["tokenizers"].items()},
             "models": {}}
  outputs = {}
  for name, model_spec in spec["models"].items():
    prefix = name + "/"
    inputs = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
    results["models"][name], got = run_model(model_spec, inputs)
    outputs.update({prefix + k: v for k, v in got.items()})
  os.makedirs(out_dir, exist_ok=True)
  np.savez(os.path.join(out_dir, "outputs.npz"), **outputs)
  with open(os.path.join(out_dir, "results.json"), "w") as f:
    json.dump(results, f, indent=1)


if __name__ == "__main__":
  if len(sys.argv) != 4:
    sys.exit(__doc__)
  main(*sys.argv[1:])
