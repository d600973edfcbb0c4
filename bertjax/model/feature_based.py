"""The paper's feature-based NER model (Devlin et al., 2018, section 5.3, Table 7).

BERT is frozen: each batch runs through the encoder (deterministic, no
dropout) and its hidden layers enter the tagger under jax.lax.stop_gradient,
so no gradient reaches the encoder's parameters (the optimizer also leaves
them out: tasks.registry's `frozen`). The token features are the chosen
layers' outputs concatenated (the paper's best: the top four, K*D = 3072
wide for BERT-BASE), then a bidirectional LSTM of `lstm_layers` layers
(`lstm_units` per direction; the paper's 768), then a linear classifier:
logits [B, L, num_labels], fp32. The LSTMs run over each row's real tokens
(input_mask's count), the backward one from the last real token.

Parameters: {"bert": BertModel's tree (pretrained weights load as into every
head), "lstm_0", ..., "tagger"}.
"""

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.model.bert import BertModel
from bertjax.model.config import BertConfig
from bertjax.model.dropout import Dropout


def hidden_state_index(layer: int, num_layers: int) -> int:
  """The index into BertModel.hidden_states (embeddings first) of encoder layer
  `layer`, counted as the original release's get_all_encoder_layers(): 0 is the
  first layer's output, -1 the last's."""
  if not -num_layers <= layer < num_layers:
    raise ValueError(f"{layer} is not a layer of a {num_layers}-layer model "
                     f"(give -{num_layers}..{num_layers - 1}; -1 is the last)")
  return layer + 1 if layer >= 0 else num_layers + 1 + layer


class BertFeatureTagger(nn.Module):
  """Frozen BERT's hidden layers -> BiLSTM -> linear: logits [B, L, num_labels]."""
  config: BertConfig
  num_labels: int
  layers: Sequence[int] = (-1, -2, -3, -4)  # Encoder layers concatenated, as hidden_state_index counts them.
  lstm_units: int = 768  # Per direction.
  lstm_layers: int = 2
  dropout_rate: float = 0.0  # On the features and between the LSTM layers in training.

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, deterministic: bool = True):
    bert = BertModel(self.config, name="bert")
    if self.is_initializing():
      bert(input_ids, input_mask, segment_ids)  # Creates the pooler too: BertModel's whole tree.
    states_NxBxLxD = bert.hidden_states(input_ids, input_mask, segment_ids, deterministic=True)
    take = [hidden_state_index(i, self.config.num_layers) for i in self.layers]
    features_BxLxKD = jnp.concatenate([states_NxBxLxD[i] for i in take], axis=-1)
    x_BxLxF = jax.lax.stop_gradient(features_BxLxKD.astype(jnp.float32))
    lengths_B = jnp.sum(input_mask > 0, axis=-1).astype(jnp.int32)
    drop = Dropout(self.dropout_rate)
    for i in range(self.lstm_layers):
      x_BxLxF = drop(x_BxLxF, deterministic=deterministic)
      x_BxLxF = nn.Bidirectional(self._rnn(), self._rnn(), name=f"lstm_{i}")(
          x_BxLxF, seq_lengths=lengths_B)
    x_BxLxF = drop(x_BxLxF, deterministic=deterministic)
    return nn.Dense(self.num_labels, name="tagger")(x_BxLxF).astype(jnp.float32)

  def _rnn(self) -> nn.RNN:
    """One direction's LSTM, unbound: its parameters go under the Bidirectional's name."""
    return nn.RNN(nn.OptimizedLSTMCell(self.lstm_units, parent=None), parent=None)
