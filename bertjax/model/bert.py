"""The BERT encoder and its pretraining heads (masked LM and next sentence).

`BertModel` is what fine-tuning needs: sequence output and the tanh pooler
(and, through `hidden_states`, every layer's output for feature extraction).
`BertForPreTraining` adds the heads. The masked-LM head runs only at
`masked_lm_positions` (gathered first, as the original release does), so
pretraining never forms the full sequence x vocab logits; in training the
last encoder layer, too, runs only at [CLS] and the masked positions.
"""

import flax.linen as nn
import jax.numpy as jnp

from bertjax.model.config import BertConfig
from bertjax.model.layers import Embeddings, Encoder, dense, gelu, layer_norm


def attention_mask(input_mask_BxL):
  """[B, L] 0/1 padding mask -> boolean mask of the real tokens [B, L]."""
  return input_mask_BxL > 0


class BertModel(nn.Module):
  """Embeddings, encoder and pooler. Returns (sequence_output, pooled_output)."""
  config: BertConfig

  def setup(self):
    c = self.config
    self.embeddings = Embeddings(c)
    self.encoder = Encoder(c)
    self.pooler = dense(c, c.hidden_size, ("embed", "hidden"), "pooler")

  def __call__(self, input_ids, input_mask, segment_ids, deterministic: bool = True,
               output_positions=None):
    """With output_positions [B, Q] (its first column 0, the [CLS] token) the
    last layer runs only there and the sequence output is [B, Q, D]."""
    x_BxLxD = self.embeddings(input_ids, segment_ids, deterministic)
    x_BxLxD = self.encoder(x_BxLxD, attention_mask(input_mask), deterministic, output_positions)
    pooled_BxD = jnp.tanh(self.pooler(x_BxLxD[:, 0]).astype(jnp.float32))
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
  mass (layers.tied_logits).
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
  (fp32; class 0 = actual next sentence, 1 = random). With
  sequence_output=False (what the train and eval steps use) the last layer
  computes only [CLS] and the masked positions, the rest of its work being
  unread, and the dict has no sequence_output; the other outputs are the same.
  """
  config: BertConfig

  def setup(self):
    self.bert = BertModel(self.config)
    self.mlm = MaskedLMHead(self.config)
    self.nsp = dense(self.config, 2, ("hidden", "classes"), "nsp")

  def __call__(self, input_ids, input_mask, segment_ids, masked_lm_positions,
               deterministic: bool = True, sequence_output: bool = True):
    positions_BxP = masked_lm_positions.astype(jnp.int32)
    if sequence_output:
      seq_BxLxD, pooled_BxD = self.bert(input_ids, input_mask, segment_ids, deterministic)
      gathered_BxPxD = jnp.take_along_axis(seq_BxLxD, positions_BxP[..., None], axis=1)
    else:
      # The losses read the last layer at [CLS] and the masked positions only.
      cls_and_masked = jnp.concatenate([jnp.zeros_like(positions_BxP[:, :1]), positions_BxP], 1)
      out_Bx1PxD, pooled_BxD = self.bert(input_ids, input_mask, segment_ids, deterministic,
                                         output_positions=cls_and_masked)
      gathered_BxPxD = out_Bx1PxD[:, 1:]
    mlm_logits_BxPxV = self.mlm(gathered_BxPxD, self.bert.embeddings)
    nsp_logits_Bx2 = self.nsp(pooled_BxD).astype(jnp.float32)
    out = {"pooled_output": pooled_BxD, "mlm_logits": mlm_logits_BxPxV,
           "nsp_logits": nsp_logits_Bx2}
    if sequence_output:
      out["sequence_output"] = seq_BxLxD
    return out
