"""launch/colab_demo.ipynb runs top to bottom, in the small mode CI=true selects."""

import os

import nbformat
from nbclient import NotebookClient
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(REPO, "launch", "colab_demo.ipynb")


def test_committed_notebook_has_no_outputs():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(nb)
  for cell in nb.cells:
    if cell.cell_type == "code":
      assert not cell.outputs and cell.execution_count is None, cell.source[:60]


@pytest.mark.slow
def test_notebook_runs_in_small_mode(tmp_path, monkeypatch):
  monkeypatch.setenv("CI", "true")
  monkeypatch.setenv("BERTJAX_NOTEBOOK_WORKDIR", str(tmp_path / "workdir"))
  nb = nbformat.read(NOTEBOOK, as_version=4)
  # A failing cell raises CellExecutionError with the cell's traceback.
  # Run from launch/, as a notebook opened from a clone: it uses that clone.
  NotebookClient(nb, timeout=600, kernel_name="python3",
                 resources={"metadata": {"path": os.path.join(REPO, "launch")}}).execute()
  outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                    for o in c.outputs)
  assert f"bertjax from {REPO} |" in outputs
  assert "finished at step 240 of 240" in outputs
  assert "After pretraining:" in outputs and "transformers:" in outputs
  assert "from random init" in outputs or "random init:" in outputs
  images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if "image/png" in o.get("data", {})]
  assert len(images) >= 3  # Loss curve, held-out accuracy, fine-tuning scores.
