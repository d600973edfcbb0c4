"""Fine-tuning heads on the BERT encoder, as in the paper and the original release.

Each model holds the encoder under "bert" (BertModel's tree, so pretrained
weights drop in) and one dense head; kernels are [in, out]:
  BertForSequenceClassification  classifier [D, num_labels] on the pooled [CLS]
                                 output (num_labels=1: regression)
  BertForTokenClassification     classifier [D, num_labels] on every token
  BertForMultipleChoice          classifier [D, 1] on each choice's pooled output
  BertForQuestionAnswering       qa_outputs [D, 2] on every token (start, end)
Dropout (the encoder's hidden_dropout_rate) precedes the classifiers; the
question-answering head has none, as in the original run_squad. The pooled
output is BertModel's: the [CLS] token's, or each row's last real token's for a
causal (left-to-right) encoder, whose [CLS] sees only itself. Logits are fp32:
the final projection casts its input to fp32 and keeps an fp32 kernel and bias,
whatever the encoder's compute and parameter dtypes.
"""

import flax.linen as nn
import jax.numpy as jnp

from bertjax.model.bert import BertModel
from bertjax.model.config import BertConfig
from bertjax.model.dropout import Dropout
from bertjax.model.layers import dense


def _fp32_dense(config: BertConfig, features: int, axes, name: str):
  """The head's final projection: fp32 input, kernel, bias and output."""
  # attention_impl is unused by a Dense; "xla" keeps the fp32 config valid
  # where the encoder's fused attention needs a 16-bit dtype.
  fp32 = config.replace(dtype="float32", param_dtype="float32", attention_impl="xla")
  return dense(fp32, features, axes, name)


def pooled_only_positions(config: BertConfig, rows: int):
  """output_positions [rows, 1] that run the last layer at [CLS] only, for heads
  that read nothing but the pooled output: that layer's queries, attention
  output, feed-forward and LayerNorms then cost one position of L (keys and
  values still come from every token). Without dropout the pooled output is
  the full computation's; in training that layer draws its dropout masks for
  the one position. None for a causal model, whose pooler reads the last real
  token and whose attention takes every query."""
  return None if config.causal else jnp.zeros((rows, 1), jnp.int32)


class BertForSequenceClassification(nn.Module):
  """Logits [B, num_labels] from the pooled output ([CLS]; causal: the last real token)."""
  config: BertConfig
  num_labels: int

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, deterministic: bool = True):
    c = self.config
    _, pooled_BxD = BertModel(c, name="bert")(
        input_ids, input_mask, segment_ids, deterministic,
        output_positions=pooled_only_positions(c, input_ids.shape[0]))
    pooled_BxD = Dropout(c.hidden_dropout_rate)(pooled_BxD, deterministic=deterministic)
    logits = _fp32_dense(c, self.num_labels, ("hidden", "classes"), "classifier")(pooled_BxD)
    return logits.astype(jnp.float32)


class BertForTokenClassification(nn.Module):
  """Logits [B, L, num_labels], one per token."""
  config: BertConfig
  num_labels: int

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, deterministic: bool = True):
    c = self.config
    seq_BxLxD, _ = BertModel(c, name="bert")(input_ids, input_mask, segment_ids,
                                             deterministic)
    seq_BxLxD = Dropout(c.hidden_dropout_rate)(seq_BxLxD, deterministic=deterministic)
    logits = _fp32_dense(c, self.num_labels, ("embed", "classes"), "classifier")(seq_BxLxD)
    return logits.astype(jnp.float32)


class BertForMultipleChoice(nn.Module):
  """Inputs [B, C, L] (C choices) -> one score per choice, [B, C]."""
  config: BertConfig

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, deterministic: bool = True):
    c = self.config
    batch, choices, length = input_ids.shape
    flat = lambda x: x.reshape(batch * choices, length)
    _, pooled_BCxD = BertModel(c, name="bert")(
        flat(input_ids), flat(input_mask), flat(segment_ids), deterministic,
        output_positions=pooled_only_positions(c, batch * choices))
    pooled_BCxD = Dropout(c.hidden_dropout_rate)(pooled_BCxD, deterministic=deterministic)
    scores_BCx1 = _fp32_dense(c, 1, ("hidden", "classes"), "classifier")(pooled_BCxD)
    return scores_BCx1.astype(jnp.float32).reshape(batch, choices)


class BertForQuestionAnswering(nn.Module):
  """(start_logits [B, L], end_logits [B, L]) of the answer span."""
  config: BertConfig

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, deterministic: bool = True):
    c = self.config
    seq_BxLxD, _ = BertModel(c, name="bert")(input_ids, input_mask, segment_ids,
                                             deterministic)
    logits_BxLx2 = _fp32_dense(c, 2, ("embed", "classes"), "qa_outputs")(seq_BxLxD)
    logits_BxLx2 = logits_BxLx2.astype(jnp.float32)
    return logits_BxLx2[..., 0], logits_BxLx2[..., 1]
