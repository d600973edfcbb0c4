"""A bag-of-words baseline for a fine-tuning task, trained on the rows fine-tuning
trains on and scored on the dev rows it is scored on, with the task's own metric.

What a task's dev score means depends on what a model needs to reach it: a
task that a linear model over word counts already solves says little about
what pretraining taught. The features are read from the task's own encoded
rows (Split.arrays), so the baseline sees exactly the tokens the model sees:

  classification  each row's counts of its word pieces, segment A's and B's
                  counted apart (so a pair task's two sides stay apart), the
                  special tokens and padding left out.
  token           each labelled position's own word piece, beside its row's
                  counts as above: a tag that the word alone or the word and
                  its sentence's words tell is within its reach.

A multinomial logistic regression (scikit-learn) on those counts gives
per-class log-probabilities, which the dev split scores as it scores the
model's logits. Other task kinds (regression, multiple choice, spans) have no
baseline here.
"""

import numpy as np

from bertjax.tasks.split import Split

# scipy and scikit-learn are imported where they are used: about a second at
# start-up that a fine-tuning run which never asks for the baseline need not pay.

KINDS = ("classification", "token")
MAX_ITER = 2000  # The solver's iterations (lbfgs); the demo's tasks converge well before.


def row_counts(arrays: dict[str, np.ndarray], vocab_size: int,
               special_ids) -> "scipy.sparse.csr_matrix":
  """[N, 2 * vocab_size] counts of each row's word pieces, segment B's in the
  second half; special tokens and padding not counted."""
  from scipy import sparse  # pylint: disable=g-import-not-at-top
  ids, mask = arrays["input_ids"], arrays["input_mask"].astype(bool)
  keep = mask & ~np.isin(ids, list(special_ids))
  rows, cols = np.nonzero(keep)
  features = ids[rows, cols] + vocab_size * (arrays["segment_ids"][rows, cols] > 0)
  return sparse.csr_matrix((np.ones(len(rows), np.float32), (rows, features)),
                           shape=(len(ids), 2 * vocab_size))


def _features(kind: str, split: Split, vocab_size: int, special_ids):
  """(features, labels, where): one row per example, or per labelled position
  of a token task (where: its (row, position) indices)."""
  from scipy import sparse  # pylint: disable=g-import-not-at-top
  counts = row_counts(split.arrays, vocab_size, special_ids)
  if kind == "classification":
    return counts, split.arrays["labels"], None
  rows, positions = np.nonzero(split.arrays["label_weights"] > 0)
  own = sparse.csr_matrix(
      (np.ones(len(rows), np.float32), (np.arange(len(rows)),
                                        split.arrays["input_ids"][rows, positions])),
      shape=(len(rows), vocab_size))
  features = sparse.hstack([own, counts[rows]], format="csr")
  return features, split.arrays["labels"][rows, positions], (rows, positions)


def fit_and_score(kind: str, num_labels: int, train: Split, dev: Split, vocab_size: int,
                  special_ids, seed: int = 0) -> dict[str, float]:
  """The baseline trained on `train` and scored on `dev` (dev.score on its
  log-probabilities, per row or per labelled position); `special_ids` are the
  tokenizer's special token ids, left out of the counts."""
  if kind not in KINDS:
    raise ValueError(f"no bag-of-words baseline for task kind {kind!r}; kinds: {KINDS}")
  from sklearn.linear_model import LogisticRegression  # pylint: disable=g-import-not-at-top
  x_train, y_train, _ = _features(kind, train, vocab_size, special_ids)
  x_dev, _, where = _features(kind, dev, vocab_size, special_ids)
  model = LogisticRegression(max_iter=MAX_ITER, random_state=seed)
  model.fit(x_train, y_train)
  # Classes absent from the training rows can never be predicted.
  log_probs = np.full((x_dev.shape[0], num_labels), -np.inf, np.float32)
  log_probs[:, model.classes_] = model.predict_log_proba(x_dev)
  if where is None:
    return dev.score(log_probs)
  outputs = np.zeros(dev.arrays["input_ids"].shape + (num_labels,), np.float32)
  outputs[where] = log_probs
  return dev.score(outputs)
