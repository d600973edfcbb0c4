"""Ragged sequences as flat numpy arrays: values back to back and counts."""

import itertools
from typing import Sequence

import numpy as np


def flatten(lists: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
  """(all values back to back as int32, number per list)."""
  counts = np.fromiter(map(len, lists), np.int64, len(lists))
  values = np.fromiter(itertools.chain.from_iterable(lists), np.int32,
                       int(counts.sum()))
  return values, counts


def ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
  """starts[i], starts[i] + 1, ..., starts[i] + counts[i] - 1 for every i."""
  first = np.cumsum(counts) - counts
  return np.repeat(starts - first, counts) + np.arange(int(counts.sum()))
