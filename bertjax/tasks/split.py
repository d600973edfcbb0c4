"""One split of a task's data, ready for the model, and how its predictions score."""

import dataclasses
import os
from typing import Any, Callable

import numpy as np

from bertjax.records import fileio


@dataclasses.dataclass
class Split:
  """`arrays`: model inputs and labels, leading axis one row per example
  (input_ids, input_mask, segment_ids, labels, ...). `score(outputs)` turns the
  model's outputs for every row, in order, into metrics; `extra` holds what a
  task's scoring needs besides. With `writes_outputs`, score also takes
  output_dir= (the run's workdir) and writes its prediction files there; a
  test set's score (Task.load_test) writes its prediction files and returns
  their row counts. `per_position_outputs`: the model's outputs have a
  position axis after the example axis (token tags, span logits)."""
  name: str
  arrays: dict[str, np.ndarray]
  score: Callable[..., dict[str, float]]
  extra: dict[str, Any] = dataclasses.field(default_factory=dict)
  writes_outputs: bool = False
  per_position_outputs: bool = False

  def __len__(self) -> int:
    return len(next(iter(self.arrays.values())))


class LabelError(ValueError):
  pass


def label_ids(labels: list, known: tuple[str, ...], where: list[str], task: str) -> np.ndarray:
  """Label strings -> their index in `known`; a label outside it names its file and line."""
  index = {label: i for i, label in enumerate(known)}
  out = np.empty(len(labels), np.int32)
  for i, label in enumerate(labels):
    if label not in index:
      raise LabelError(f"{where[i]}: label {label!r} is not one of task {task}'s labels "
                       f"{list(known)}")
    out[i] = index[label]
  return out


def test_file(config, name: str, what: str) -> str:
  """config.predict_file, else data_dir/`name`: the file a task's test set is read
  from; an error naming the flags when neither is given or the file is missing."""
  if not config.predict_file and not config.data_dir:
    raise ValueError(f"--config.predict_file: give the {what} to predict "
                     f"(or --config.data_dir holding {name})")
  path = config.predict_file or os.path.join(config.data_dir, name)
  if not fileio.exists(path):
    raise FileNotFoundError(f"{path}: no such file (--config.predict_file or "
                            f"--config.data_dir's {name})")
  return path
