"""Every fine-tuning task by name: its kind, label count, dev splits, data and head."""

import dataclasses
import functools
from typing import Any, Callable, Optional

import flax.linen as nn
import jax.numpy as jnp

from bertjax.model import heads
from bertjax.model.config import BertConfig
from bertjax.tasks import conll
from bertjax.tasks import feature_tagger
from bertjax.tasks import glue
from bertjax.tasks import python_docs
from bertjax.tasks import same_document
from bertjax.tasks import squad
from bertjax.tasks import swag
from bertjax.tasks.split import Split


@dataclasses.dataclass(frozen=True)
class Task:
  """`load(split, tokenizer, config)` reads one split ("train" or a dev split name)
  with the fine-tuning config's data fields (data_dir, tfds_data_dir, max_seq_length)."""
  name: str
  kind: str  # One of tasks.step.KINDS.
  num_labels: int  # Classifier outputs (1 for regression and multiple choice).
  dev_splits: tuple[str, ...]
  primary: str  # The dev metric a sweep picks its best run by (first dev split).
  load: Callable[[str, Any, Any], Split]
  num_choices: int = 0  # Multiple choice only.
  labels: tuple[str, ...] = ()  # Label names in output order (classification, token).
  configure: Optional[Callable[[Any], None]] = None  # Fills task defaults into the config.
  # (tokenizer, config) -> the test sets to predict, each a Split whose
  # score(outputs, output_dir=) writes its prediction files; None: no test set.
  load_test: Optional[Callable[[Any, Any], list[Split]]] = None
  # (model config, run config) -> the model, instead of the kind's head (model_for).
  model: Optional[Callable[[BertConfig, Any], nn.Module]] = None
  frozen: tuple[str, ...] = ()  # Top-level parameter keys the optimizer leaves unchanged.


def _glue(t: glue.GlueTask) -> Task:
  def load(split, tokenizer, config):
    return glue.load(t, split, tokenizer, config.max_seq_length, config.data_dir,
                     config.tfds_data_dir)
  def load_test(tokenizer, config):
    return glue.load_test(t, tokenizer, config.max_seq_length, config.data_dir,
                          config.predict_file)
  return Task(t.name, t.kind, max(len(t.labels), 1), tuple(t.dev), t.primary, load,
              labels=t.labels, load_test=load_test)


TASKS: dict[str, Task] = {name: _glue(t) for name, t in glue.TASKS.items()}
TASKS["conll2003"] = Task("conll2003", "token", len(conll.LABELS), ("dev",), "f1", conll.load,
                          labels=conll.LABELS, load_test=conll.load_test)
TASKS["conll2003_features"] = Task(
    "conll2003_features", "token", len(conll.LABELS), ("dev",), "f1", conll.load,
    labels=conll.LABELS, configure=feature_tagger.check_config,
    model=functools.partial(feature_tagger.model, num_labels=len(conll.LABELS)),
    frozen=("bert",))
TASKS["swag"] = Task("swag", "multiple_choice", 1, ("dev",), "accuracy", swag.load,
                     num_choices=swag.NUM_CHOICES, load_test=swag.load_test)
TASKS["squad"] = Task("squad", "span", 2, ("dev",), "f1", squad.load,
                      configure=squad.apply_version_defaults, load_test=squad.load_test)
TASKS["same_document"] = Task("same_document", "classification", 2, ("dev",), "accuracy",
                              same_document.load, labels=same_document.LABELS)
TASKS["doc_area"] = Task("doc_area", "classification", len(python_docs.AREA_LABELS), ("dev",),
                         "accuracy", python_docs.load_doc_area,
                         labels=python_docs.AREA_LABELS)
TASKS["word_area"] = Task("word_area", "token", len(python_docs.WORD_LABELS), ("dev",), "f1",
                          python_docs.load_word_area, labels=python_docs.WORD_LABELS)
TASKS["related_words"] = Task("related_words", "classification", 2, ("dev",), "accuracy",
                              python_docs.load_related_words,
                              labels=python_docs.RELATED_LABELS)


# Task kind -> the head type exports read from a checkpoint's meta.
HEAD_TYPES = {"classification": "sequence_classification",
              "regression": "sequence_classification",
              "token": "token_classification", "multiple_choice": "multiple_choice",
              "span": "question_answering"}


def _spelling(name: str) -> str:
  return name.lower().replace("-", "").replace("_", "")


def get_task(name: str) -> Task:
  """The task named `name`, as bertjax names it or as people write it: case,
  hyphens and underscores aside (SST-2, STS-B, MNLI, CoNLL2003)."""
  by_spelling = {_spelling(t): t for t in TASKS}
  if _spelling(name) not in by_spelling:
    raise ValueError(f"--config.task={name!r}: unknown task; tasks: {sorted(TASKS)}")
  return TASKS[by_spelling[_spelling(name)]]


def model_for(task: Task, config: BertConfig, run_config=None) -> nn.Module:
  """The model the task trains: its own (Task.model, given the run config) or its kind's head."""
  if task.model is not None:
    return task.model(config, run_config)
  if task.kind in ("classification", "regression"):
    return heads.BertForSequenceClassification(config, num_labels=task.num_labels)
  if task.kind == "token":
    return heads.BertForTokenClassification(config, num_labels=task.num_labels)
  if task.kind == "multiple_choice":
    return heads.BertForMultipleChoice(config)
  if task.kind == "span":
    return heads.BertForQuestionAnswering(config)
  raise ValueError(f"task {task.name}: kind {task.kind!r} has no head")


def init_fn(task: Task, max_seq_length: int):
  """(model, rng) -> boxed parameters, for train.state's abstract and real init."""
  shape = (1, task.num_choices, max_seq_length) if task.kind == "multiple_choice" else (
      1, max_seq_length)

  def init(model, rng):
    ids = jnp.zeros(shape, jnp.int32)
    return model.init({"params": rng}, ids, ids, ids, deterministic=True)["params"]
  return init
