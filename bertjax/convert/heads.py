"""Fine-tuned task models in the layouts other tools load.

bertjax's task models (bertjax/model/heads.py) hold {"bert": BertModel's
params, <head>: {"kernel": [D, out], "bias": [out]}}:

  head type                model class                    head        out
  sequence_classification  BertForSequenceClassification  classifier  num_labels (1: regression)
  token_classification     BertForTokenClassification     classifier  num_labels
  multiple_choice          BertForMultipleChoice          classifier  1
  question_answering       BertForQuestionAnswering       qa_outputs  2 (start, end)

Hugging Face uses the same head names and [in, out] Flax kernels; its token
classification and question answering models have no pooler, so the export
leaves it out there. The original release's run_classifier.py names the
classifier `output_weights` [num_labels, H] / `output_bias`, and
run_squad.py `cls/squad/output_weights` [2, H] / `cls/squad/output_bias`
(tf1.py); its graphs keep the pooler.

A causal (left-to-right) encoder's sequence-classification and multiple-
choice models pool each row's last real token (bertjax/model/bert.py), but
transformers' and the release's pool [CLS] always: their exports would
compute other logits, so they are refused. Its token-classification and
question-answering models read every token and export (is_decoder=True).
"""

import dataclasses
from typing import Any, Optional, Sequence

from bertjax.convert import hf
from bertjax.model.config import BertConfig


@dataclasses.dataclass(frozen=True)
class Head:
  architecture: str  # transformers' model class.
  param: str  # The head's params key.
  pooler: bool  # Whether the HF model has the pooler.
  labelled: bool  # Whether the outputs are labels (num_labels, id2label).


HEADS = {
    "sequence_classification": Head("BertForSequenceClassification", "classifier", True, True),
    "token_classification": Head("BertForTokenClassification", "classifier", False, True),
    "multiple_choice": Head("BertForMultipleChoice", "classifier", True, False),
    "question_answering": Head("BertForQuestionAnswering", "qa_outputs", False, False),
}


def is_task_model(params) -> bool:
  tree = hf.unwrap(params)
  return "bert" in tree and any(h.param in tree for h in HEADS.values())


def infer_head(params, head_type: Optional[str]) -> str:
  """The head type: `head_type` if given (checked against the tree), else the
  only one the tree's head fits (question answering); otherwise an error."""
  tree = hf.unwrap(params)
  fits = [name for name, h in HEADS.items() if h.param in tree]
  if head_type is not None:
    if head_type not in HEADS:
      raise ValueError(f"--head={head_type}: not one of {sorted(HEADS)}")
    if head_type not in fits:
      raise ValueError(f"--head={head_type}: the checkpoint's head is "
                       f"{sorted(k for k in tree if k != 'bert')}, not "
                       f"{HEADS[head_type].param}")
    return head_type
  if len(fits) != 1:
    raise ValueError(f"--head: the checkpoint's classifier fits {fits}; name the task's head "
                     "type")
  return fits[0]


def _head_size(params, head: Head) -> int:
  return int(hf.unwrap(params)[head.param]["kernel"].shape[-1])


def task_to_hf(params, config: BertConfig, head_type: str, *, keep_pooler: bool = False) -> dict:
  """A bertjax task model's params -> the HF Flax task model's params (numpy).

  The pooler goes where the HF model has none, unless `keep_pooler` (the
  release's TF1 graphs always have it).
  """
  head = HEADS[head_type]
  if config.causal and head.pooler:
    raise ValueError(
        f"{head.architecture}: the checkpoint's encoder is causal (objective ltr), so its "
        "pooled output is each row's last real token, but transformers' and the original "
        f"release's {head.architecture} pool [CLS] (which under the causal mask sees only "
        "itself): the export would compute other logits. Run this model with bertjax "
        "(python -m bertjax.finetune --config.mode=predict)")
  tree = hf.unwrap(params)
  unexpected = sorted(set(tree) - {"bert", head.param})
  if unexpected:
    raise ValueError(f"{head.architecture}: unexpected top-level params {unexpected}")
  encoder = hf.bertjax_to_hf(tree["bert"], config, encoder_only=True)
  if not (head.pooler or keep_pooler):
    encoder.pop("pooler")
  out_size = {"multiple_choice": 1, "question_answering": 2}.get(head_type)
  size = _head_size(params, head)
  if out_size is not None and size != out_size:
    raise ValueError(f"{head.architecture}: {head.param}/kernel has {size} outputs, not "
                     f"{out_size}")
  return {"bert": encoder, head.param: {p[-1]: hf.to_numpy(x, (head.param,) + p)
                                        for p, x in hf.flatten(tree[head.param]).items()}}


def hf_task_config(config: BertConfig, params, head_type: str,
                   labels: Optional[Sequence[str]] = None) -> dict[str, Any]:
  """config.json of the HF task model: architecture, num_labels, id2label/label2id."""
  head = HEADS[head_type]
  fields = hf.hf_config_dict(config, head.architecture)
  if head.labelled:
    num_labels = _head_size(params, head)
    names = list(labels) if labels else [f"LABEL_{i}" for i in range(num_labels)]
    if len(names) != num_labels:
      raise ValueError(f"--labels: {len(names)} names for a head of {num_labels} outputs")
    fields.update(id2label={str(i): n for i, n in enumerate(names)},
                  label2id={n: i for i, n in enumerate(names)})
    if head_type == "sequence_classification":
      fields["problem_type"] = ("regression" if num_labels == 1
                                else "single_label_classification")
  return fields
