"""The feature-based task's model from the run config's `feature_based` group.

configs/finetune/ner_features.py has the group: layers (encoder layers whose
outputs are concatenated, -1 the last), lstm_units (per direction),
lstm_layers and dropout_rate (model/feature_based.py).
"""

from bertjax.model.config import BertConfig
from bertjax.model.feature_based import BertFeatureTagger, hidden_state_index

FIELDS = ("layers", "lstm_units", "lstm_layers", "dropout_rate")


def check_config(config) -> None:
  """The run config has a complete feature_based group with sound values."""
  group = config.get("feature_based")
  missing = [f for f in FIELDS if group is None or f not in group]
  if missing:
    raise ValueError(f"--config.task={config.task}: the config has no feature_based."
                     f"{', feature_based.'.join(missing)}; use "
                     "--config=configs/finetune/ner_features.py")
  if not group.layers:
    raise ValueError("--config.feature_based.layers: give at least one layer, e.g. "
                     "(-1, -2, -3, -4)")
  for name in ("lstm_units", "lstm_layers"):
    if group[name] <= 0:
      raise ValueError(f"--config.feature_based.{name} must be positive, got {group[name]}")
  if not 0.0 <= group.dropout_rate < 1.0:
    raise ValueError("--config.feature_based.dropout_rate must be in [0, 1), got "
                     f"{group.dropout_rate}")


def model(bert_config: BertConfig, run_config, num_labels: int) -> BertFeatureTagger:
  group = run_config.feature_based
  for layer in group.layers:
    try:
      hidden_state_index(layer, bert_config.num_layers)
    except ValueError as e:
      raise ValueError(f"--config.feature_based.layers: {e}") from None
  return BertFeatureTagger(bert_config, num_labels, layers=tuple(group.layers),
                           lstm_units=group.lstm_units, lstm_layers=group.lstm_layers,
                           dropout_rate=group.dropout_rate)
