"""A pretrained model and its tokenizer, read for inference on this machine.

`load` takes what `python -m bertjax.predict` and the notebook take: a
bertjax checkpoint (saved on any mesh or topology: read onto the first
local device) or a Hugging Face BERT directory, and finds the vocab the
model was trained with: the run's data for a checkpoint (run_vocab.py), the
directory's vocab.txt and tokenizer_config.json for an export.
"""

import json
import os
from typing import Optional

from bertjax.convert import hf
from bertjax.convert import run_vocab
from bertjax.convert import weights
from bertjax.model.config import BertConfig
from bertjax.records import fileio
from bertjax.train import checkpoint as ckpt_lib
from bertjax.text import tokenization


def _hf_vocab(directory: str, vocab_file: Optional[str],
              do_lower_case: Optional[bool]) -> run_vocab.Vocab:
  path = vocab_file or os.path.join(directory, run_vocab.VOCAB_NAME)
  if not fileio.exists(path):
    raise ValueError(f"--vocab_file: {directory} has no {run_vocab.VOCAB_NAME}; pass the "
                     "vocab.txt the model was trained with")
  if do_lower_case is None:
    config_path = os.path.join(directory, run_vocab.TOKENIZER_CONFIG_NAME)
    settings = json.loads(fileio.read_text(config_path)) if fileio.exists(config_path) else {}
    do_lower_case = settings.get("do_lower_case", True)
  return run_vocab.Vocab(tuple(tokenization.read_vocab(path)), bool(do_lower_case), path)


def load(path: str, vocab_file: Optional[str] = None, do_lower_case: Optional[bool] = None
         ) -> tuple[dict, BertConfig, tokenization.WordPieceTokenizer]:
  """(params as numpy, the model config, the tokenizer) of a checkpoint or HF directory."""
  if weights.is_bertjax_checkpoint(path):
    config = weights.checkpoint_config(ckpt_lib.read_meta(path), path)
    params = weights.read_checkpoint_params(path)  # Onto the first local device.
    vocab = run_vocab.find_vocab(path, vocab_file, do_lower_case)
  elif fileio.exists(os.path.join(path, hf.CONFIG_NAME)):
    from bertjax.convert import hf_files  # pylint: disable=g-import-not-at-top
    try:
      params, config = hf_files.load_hf_checkpoint(path)
    except ValueError as e:
      if "no pretraining heads" in str(e):
        raise ValueError(f"--checkpoint={path}: the model has no masked-LM and "
                         "next-sentence heads (cls.*), which fill-mask needs; export a "
                         "pretraining checkpoint") from None
      raise
    params = hf.unwrap(params)
    vocab = _hf_vocab(path, vocab_file, do_lower_case)
  else:
    raise ValueError(f"--checkpoint={path}: neither a bertjax checkpoint (a params/ item) "
                     "nor a Hugging Face model directory (config.json)")
  run_vocab.check_fits(vocab, config.vocab_size)
  tokenizer = tokenization.WordPieceTokenizer(vocab.source, vocab.do_lower_case, tokens=vocab.tokens)
  return dict(params), config, tokenizer
