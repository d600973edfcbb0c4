"""Dev-set metrics by their official definitions (scikit-learn, scipy, seqeval).

GLUE: accuracy, F1 of the positive class (MRPC, QQP), Matthews correlation
(CoLA), Pearson and Spearman correlation (STS-B). CoNLL-2003: span-level
F1 (seqeval, CoNLL's definition). Scores are fractions in [0, 1] (correlations
in [-1, 1]).
"""

from typing import Sequence

import numpy as np


def accuracy(labels: np.ndarray, predictions: np.ndarray) -> float:
  from sklearn import metrics  # pylint: disable=g-import-not-at-top
  return float(metrics.accuracy_score(labels, predictions))


def f1(labels: np.ndarray, predictions: np.ndarray) -> float:
  """F1 of label 1 (MRPC's 'equivalent', QQP's 'duplicate')."""
  from sklearn import metrics  # pylint: disable=g-import-not-at-top
  return float(metrics.f1_score(labels, predictions, pos_label=1, average="binary",
                                zero_division=0.0))


def matthews(labels: np.ndarray, predictions: np.ndarray) -> float:
  from sklearn import metrics  # pylint: disable=g-import-not-at-top
  return float(metrics.matthews_corrcoef(labels, predictions))


def pearson(labels: np.ndarray, predictions: np.ndarray) -> float:
  from scipy import stats  # pylint: disable=g-import-not-at-top
  return float(stats.pearsonr(labels, predictions)[0])


def spearman(labels: np.ndarray, predictions: np.ndarray) -> float:
  from scipy import stats  # pylint: disable=g-import-not-at-top
  return float(stats.spearmanr(labels, predictions)[0])


CLASSIFICATION = {"accuracy": accuracy, "f1": f1, "matthews": matthews}
REGRESSION = {"pearson": pearson, "spearman": spearman}


def classification(names: Sequence[str], labels: np.ndarray,
                   logits_NxC: np.ndarray) -> dict[str, float]:
  predictions = np.argmax(logits_NxC, axis=-1)
  return {n: CLASSIFICATION[n](labels, predictions) for n in names}


def regression(names: Sequence[str], labels: np.ndarray,
               scores_Nx1: np.ndarray) -> dict[str, float]:
  predictions = np.asarray(scores_Nx1).reshape(-1)
  return {n: REGRESSION[n](labels, predictions) for n in names}


def span_f1(gold: list[list[str]], predicted: list[list[str]]) -> dict[str, float]:
  """Entity-level precision, recall and F1 over BIO tag sequences (seqeval)."""
  from seqeval import metrics  # pylint: disable=g-import-not-at-top
  return {"f1": float(metrics.f1_score(gold, predicted)),
          "precision": float(metrics.precision_score(gold, predicted)),
          "recall": float(metrics.recall_score(gold, predicted)),
          "accuracy": float(metrics.accuracy_score(gold, predicted))}
