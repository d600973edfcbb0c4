"""The layering rules: model, train step and fit check import without TensorFlow, and
lower layers never import higher ones."""

import ast
import os
import subprocess
import sys

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Each package and the bertjax packages it may import. Data creation (text ->
# records, offline) and training input (records -> batches, online) share only
# the record contract below them; the training loop never builds data.
_ALLOWED = {
    "records": {"records"},
    "text": {"records", "text"},
    "create": {"records", "text", "create"},
    "corpus": {"records", "text", "corpus"},
    "input": {"records", "input"},
    "model": {"model"},
    "train": {"records", "input", "model", "train"},
    "tasks": {"records", "text", "input", "model", "train", "tasks"},
    "convert": {"records", "text", "model", "train", "convert"},
}
# The tools above the layers, side by side, each importing any layer but not
# one another: the fit check, the speed benchmarks and the recipe studies
# (which also run the fine-tuning step that bertjax/downstream.py gives the demo).
_LAYERS = set(_ALLOWED)
_ALLOWED.update({
    "fit": _LAYERS | {"fit"},
    "benchmarks": _LAYERS | {"benchmarks"},
    "studies": _LAYERS | {"studies", "downstream"},
})


def test_model_and_train_step_import_without_tensorflow():
  code = ("import sys\n"
          "import bertjax.model.bert, bertjax.train.step, bertjax.train.state\n"
          "import bertjax.train.loop, bertjax.benchmarks.step_bench, bertjax.fit.check\n"
          "import bertjax.model.heads, bertjax.tasks.step\n"
          "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
          "('tensorflow', 'tensorflow_datasets'))\n"
          "print(bad[:5]); sys.exit(1 if bad else 0)\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=_ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stdout + result.stderr


def _imports(path, package):
  """Every module `path` (a file of `package`) imports, as a dotted name:
  `from bertjax import hostmem` and `from . import x` name the module they
  bring in, not only the package it is taken from."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom):
      parts = package.split(".")
      base = parts[:len(parts) - node.level + 1] if node.level else []
      module = ".".join(base + ([node.module] if node.module else []))
      yield module
      yield from (f"{module}.{alias.name}" for alias in node.names)
    elif isinstance(node, ast.Import):
      yield from (alias.name for alias in node.names)


def test_imports_names_the_modules_taken_from_a_package(tmp_path):
  path = tmp_path / "m.py"
  path.write_text("from bertjax import hostmem\nimport bertjax.main\n"
                  "from .. import downstream\nfrom ..records import schema\n"
                  "from . import pipeline\n")
  found = set(_imports(str(path), "bertjax.input"))
  assert {"bertjax.hostmem", "bertjax.main", "bertjax.downstream",
          "bertjax.records.schema", "bertjax.input.pipeline"} <= found


def test_every_package_has_a_layer():
  packages = {name for name in os.listdir(os.path.join(_ROOT, "bertjax"))
              if os.path.exists(os.path.join(_ROOT, "bertjax", name, "__init__.py"))}
  assert packages == set(_ALLOWED)


@pytest.mark.parametrize("layer", sorted(_ALLOWED))
def test_layers_import_only_downward(layer):
  allowed = _ALLOWED[layer]
  directory = os.path.join(_ROOT, "bertjax", layer)
  bad = []
  for name in sorted(os.listdir(directory)):
    if not name.endswith(".py"):
      continue
    for module in _imports(os.path.join(directory, name), f"bertjax.{layer}"):
      parts = module.split(".")
      if parts[0] == "bertjax" and len(parts) > 1 and parts[1] not in allowed:
        bad.append(f"bertjax/{layer}/{name} imports {module}")
  assert not bad, bad
