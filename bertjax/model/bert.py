"""The BERT encoder and its pretraining heads (masked LM and next sentence).

`BertModel` is what fine-tuning needs: sequence output and the tanh pooler
(and, through `hidden_states`, every layer's output for feature extraction).
`BertForPreTraining` adds the heads. The masked-LM head runs only at
`masked_lm_positions` (gathered first, as the original release does), so
pretraining never forms the full sequence x vocab logits; in training the
last encoder layer, too, runs only at [CLS] and the masked positions.
A causal (left-to-right) model instead predicts the next token at every
position with the same tied decoder; a model without the next-sentence head
(config.next_sentence_head False) has no "nsp" parameters and no NSP logits.

Packed rows (several examples in one row, bertjax/input/packing.py) come
with packed_example_ids (attention stays within an example), position_ids
(restarting per example) and next_sentence_positions (each example's
[CLS]); the pooler and the next-sentence head then run once per example.

A causal model pools each row's last real token instead of [CLS]: under the
causal mask [CLS] attends only to itself, and the last real token is the one
position that has seen the whole input.
"""

import flax.linen as nn
import jax.numpy as jnp

from bertjax.model.config import BertConfig
from bertjax.model.layers import Embeddings, Encoder, dense, gelu, layer_norm


def attention_mask(input_mask_BxL):
  """[B, L] 0/1 padding mask -> boolean mask of the real tokens [B, L]."""
  return input_mask_BxL > 0


def last_real_position(input_mask_BxL):
  """[B] int32: the last position of each row whose input_mask is 1 (0 for a row
  with none)."""
  positions_L = jnp.arange(input_mask_BxL.shape[1], dtype=jnp.int32)
  return jnp.max(jnp.where(input_mask_BxL > 0, positions_L, 0), axis=1)


class BertModel(nn.Module):
  """Embeddings, encoder and pooler. Returns (sequence_output, pooled_output).

  The pooler reads [CLS] (position 0), or with config.causal each row's last
  real token (the last position where input_mask is 1).
  """
  config: BertConfig

  def setup(self):
    c = self.config
    self.embeddings = Embeddings(c)
    self.encoder = Encoder(c)
    self.pooler = dense(c, c.hidden_size, ("embed", "hidden"), "pooler")

  def __call__(self, input_ids, input_mask, segment_ids, deterministic: bool = True,
               output_positions=None, packed_example_ids=None, position_ids=None,
               cls_positions=None):
    """With output_positions [B, Q] (its first column 0, the [CLS] token) the
    last layer runs only there and the sequence output is [B, Q, D]; the
    pooled output then reads its first row. A causal model takes no
    output_positions (its attention refuses a subset of queries).

    Packed rows: packed_example_ids and position_ids [B, L] and
    cls_positions [B, K], all three or none; the pooled output is then
    [B, K, D], one per example, and output_positions (if given) must start
    with the K cls_positions. A causal model takes no packed rows.
    """
    packed = [a is not None for a in (packed_example_ids, position_ids, cls_positions)]
    if any(packed) and not all(packed):
      raise ValueError("packed rows need packed_example_ids, position_ids and "
                       "next_sentence_positions together")
    if self.config.causal and cls_positions is not None:
      raise ValueError("model.causal: packed rows are not supported (the pooler reads each "
                       "row's last real token); set data.packing=False")
    mask = attention_mask(input_mask) if packed_example_ids is None else packed_example_ids
    x_BxLxD = self.embeddings(input_ids, segment_ids, deterministic, position_ids)
    x_BxLxD = self.encoder(x_BxLxD, mask, deterministic, output_positions)
    if self.config.causal and output_positions is not None:
      raise ValueError("model.causal: the last layer runs at every position (no "
                       "output_positions)")
    if self.config.causal:
      cls_BxD = jnp.take_along_axis(x_BxLxD, last_real_position(input_mask)[:, None, None],
                                    axis=1)[:, 0]
    elif cls_positions is None:
      cls_BxD = x_BxLxD[:, 0]
    elif output_positions is None:
      cls_BxD = jnp.take_along_axis(x_BxLxD, cls_positions[..., None].astype(jnp.int32), axis=1)
    else:
      cls_BxD = x_BxLxD[:, :cls_positions.shape[1]]
    pooled_BxD = jnp.tanh(self.pooler(cls_BxD).astype(jnp.float32))
    return x_BxLxD, pooled_BxD

  def hidden_states(self, input_ids, input_mask, segment_ids, deterministic: bool = True):
    """[num_layers + 1, B, L, D]: the embeddings' output, then each layer's
    output (transformers' output_hidden_states; [-1] is the sequence output)."""
    x_BxLxD = self.embeddings(input_ids, segment_ids, deterministic)
    layers_NxBxLxD = self.encoder(x_BxLxD, attention_mask(input_mask), deterministic,
                                  all_layers=True)
    return jnp.concatenate([x_BxLxD[None].astype(layers_NxBxLxD.dtype), layers_NxBxLxD])


class MaskedLMHead(nn.Module):
  """Dense + GELU + LayerNorm, then the tied decoder plus a per-token bias.

  The decoder multiplies by the whole padded word table (MXU-aligned):
  the logits have padded_vocab_size columns, those past vocab_size at the
  most negative float, so padding never wins an argmax nor takes softmax
  mass (decoder.tied_logits).
  """
  config: BertConfig

  @nn.compact
  def __call__(self, x_BxPxD, embeddings: Embeddings):
    c = self.config
    h = dense(c, c.hidden_size, ("embed", "hidden"), "transform")(x_BxPxD)
    h = gelu(h)
    h = layer_norm(c, "transform_layer_norm")(h)
    bias_V = self.param(
        "output_bias",
        nn.with_logical_partitioning(nn.initializers.zeros_init(), ("vocab",)),
        (c.padded_vocab_size,), c.params_dtype)
    return embeddings.attend(h, bias_V)


class BertForPreTraining(nn.Module):
  """BERT with the masked-LM and next-sentence heads.

  Returns a dict: sequence_output [B, L, D], pooled_output [B, D],
  mlm_logits [B, P, padded V] (fp32, at masked_lm_positions; columns past
  vocab_size hold the most negative float) and nsp_logits [B, 2]
  (fp32; class 0 = actual next sentence, 1 = random). Packed rows
  (packed_example_ids, position_ids and next_sentence_positions [B, K]
  given) give pooled_output [B, K, D] and nsp_logits [B, K, 2], one per
  packed example. With
  sequence_output=False (what the train and eval steps use) the last layer
  computes only [CLS] and the masked positions, the rest of its work being
  unread, and the dict has no sequence_output; the other outputs are the same.
  Without config.next_sentence_head there is no nsp_logits. A causal model
  (config.causal) returns lm_logits [B, L, padded V] instead of mlm_logits:
  at position t the logits of the token at t + 1 (masked_lm_positions is
  unread); its last layer always runs at every position.
  """
  config: BertConfig

  def setup(self):
    self.bert = BertModel(self.config)
    self.mlm = MaskedLMHead(self.config)
    if self.config.next_sentence_head:
      self.nsp = dense(self.config, 2, ("hidden", "classes"), "nsp")

  def __call__(self, input_ids, input_mask, segment_ids, masked_lm_positions,
               deterministic: bool = True, sequence_output: bool = True,
               packed_example_ids=None, position_ids=None, next_sentence_positions=None):
    positions_BxP = masked_lm_positions.astype(jnp.int32)
    packed = dict(packed_example_ids=packed_example_ids, position_ids=position_ids,
                  cls_positions=next_sentence_positions)
    out = {}
    if self.config.causal:
      seq_BxLxD, pooled_BxD = self.bert(input_ids, input_mask, segment_ids, deterministic,
                                        **packed)
      out["lm_logits"] = self.mlm(seq_BxLxD, self.bert.embeddings)
    elif sequence_output:
      seq_BxLxD, pooled_BxD = self.bert(input_ids, input_mask, segment_ids, deterministic,
                                        **packed)
      gathered_BxPxD = jnp.take_along_axis(seq_BxLxD, positions_BxP[..., None], axis=1)
    else:
      # The losses read the last layer at [CLS] (each packed example's) and
      # the masked positions only.
      cls_BxK = (jnp.zeros_like(positions_BxP[:, :1]) if next_sentence_positions is None
                 else next_sentence_positions.astype(jnp.int32))
      cls_and_masked = jnp.concatenate([cls_BxK, positions_BxP], 1)
      out_BxKPxD, pooled_BxD = self.bert(input_ids, input_mask, segment_ids, deterministic,
                                         output_positions=cls_and_masked, **packed)
      gathered_BxPxD = out_BxKPxD[:, cls_BxK.shape[1]:]
    if not self.config.causal:
      out["mlm_logits"] = self.mlm(gathered_BxPxD, self.bert.embeddings)
    if self.config.next_sentence_head:
      out["nsp_logits"] = self.nsp(pooled_BxD).astype(jnp.float32)
    out["pooled_output"] = pooled_BxD
    if sequence_output:
      out["sequence_output"] = seq_BxLxD
    return out
