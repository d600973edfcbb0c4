"""The vocab a checkpoint was trained with, and the tokenizer files exports carry.

A pretraining run records its resolved config in WORKDIR/config.json, beside
WORKDIR/checkpoints; its phases' train_files lead to the data's
metadata.json, whose `tokenizer` entry names the vocab file (its base name)
and says whether text is lower-cased, and whose `vocab_hash` identifies the
vocab's tokens. The vocab file is looked for in the data directory and the
two directories above it (data creation's layout, e.g. the demo's
demo_data/vocab.txt beside demo_data/train_128/) and must hash to
`vocab_hash`. A run without data of its own (fine-tuning) takes the vocab
file and casing its record names (vocab_file, do_lower_case), and where the
record names no vocab file, the vocab of the weights its init_from names: a
model directory's vocab.txt or another bertjax run's. An explicit vocab file (the export's
--vocab_file) takes the place of that search; it must still hash to the
data's vocab_hash when the data is known.
"""

import dataclasses
import json
import os
from typing import Any, Optional

from bertjax.records import fileio
from bertjax.records import schema
from bertjax.text import tokenization

RUN_RECORD_FILENAME = "config.json"  # WORKDIR/config.json, written when a run starts.
VOCAB_NAME = "vocab.txt"
TOKENIZER_CONFIG_NAME = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_NAME = "special_tokens_map.json"
# How many directories above a data directory the vocab file is looked for.
_SEARCH_UP = 2


@dataclasses.dataclass(frozen=True)
class Vocab:
  """A WordPiece vocab: its tokens in id order, casing, and where it came from."""
  tokens: tuple[str, ...]
  do_lower_case: bool
  source: str


def _run_record(checkpoint_dir: str) -> tuple[str, dict[str, Any]]:
  """(path, contents) of the run record beside a checkpoints directory ({} if none)."""
  checkpoint_dir = checkpoint_dir.rstrip("/")
  if os.path.basename(checkpoint_dir).isdigit():  # A step directory was given.
    checkpoint_dir = os.path.dirname(checkpoint_dir)
  record = os.path.join(os.path.dirname(checkpoint_dir), RUN_RECORD_FILENAME)
  if not fileio.exists(record):
    return record, {}
  try:
    return record, json.loads(fileio.read_text(record))
  except json.JSONDecodeError as e:
    raise ValueError(f"{record}: not valid JSON ({e})") from None


def _data_dirs(checkpoint_dir: str) -> tuple[str, list[str]]:
  """(the run record's path, the data directories of its phases, in order)."""
  record, contents = _run_record(checkpoint_dir)
  dirs = []
  for phase in contents.get("phases", {}).values():
    files = phase.get("train_files") if isinstance(phase, dict) else None
    if files and os.path.dirname(files) not in dirs:
      dirs.append(os.path.dirname(files))
  return record, dirs


def _init_from_vocab(checkpoint_dir: str, do_lower_case: Optional[bool],
                     depth: int) -> Optional[Vocab]:
  """The vocab of the weights a run started from (its record's init_from): a
  model directory's vocab.txt (Hugging Face, TF1), or a bertjax checkpoint's
  own run's vocab. None when the run records no init_from."""
  record, contents = _run_record(checkpoint_dir)
  init_from = contents.get("init_from")
  if not init_from or depth > 3:
    return None
  if fileio.exists(os.path.join(init_from, VOCAB_NAME)):
    if do_lower_case is None:
      config_path = os.path.join(init_from, TOKENIZER_CONFIG_NAME)
      if fileio.exists(config_path):
        do_lower_case = json.loads(fileio.read_text(config_path)).get("do_lower_case")
    if do_lower_case is None:
      raise ValueError(f"--do_lower_case: the casing of {init_from}'s vocab (the init_from "
                       f"of {record}) is unknown; pass --do_lower_case=true or false")
    return _read(os.path.join(init_from, VOCAB_NAME), do_lower_case)
  return find_vocab(init_from, None, do_lower_case, depth=depth + 1)


def _fine_tuning_record(checkpoint_dir: str) -> tuple[str, dict[str, Any]]:
  """(path, contents) of a fine-tuning run's record (one with `task` and
  `do_lower_case`; {} for other runs): its `vocab_file` (empty: init_from's
  vocab.txt) and `do_lower_case` are those the run tokenized its data with."""
  record, contents = _run_record(checkpoint_dir)
  if "task" in contents and "do_lower_case" in contents:
    return record, contents
  return record, {}


def recorded_casing(checkpoint_dir: str) -> Optional[bool]:
  """Whether the run that wrote `checkpoint_dir` lower-cased its text: as its
  pretraining data's metadata.json or its fine-tuning record says; None when
  neither is found."""
  meta, _ = data_metadata(checkpoint_dir)
  if meta is not None and meta.tokenizer.get("do_lower_case") is not None:
    return bool(meta.tokenizer["do_lower_case"])
  _, contents = _fine_tuning_record(checkpoint_dir)
  return bool(contents["do_lower_case"]) if contents else None


def data_metadata(checkpoint_dir: str) -> tuple[Optional[schema.DatasetMetadata], str]:
  """The metadata.json of the data a checkpoint was trained on, and what was
  looked at (for error messages); (None, ...) when it cannot be found."""
  record, dirs = _data_dirs(checkpoint_dir)
  if not dirs:
    return None, f"no run record with train_files at {record}"
  for d in dirs:
    meta = schema.read_metadata(d)
    if meta is not None:
      return meta, schema.metadata_path(d)
  return None, f"no metadata.json in the run's data directories {dirs}"


def _candidates(data_dir: str, name: str) -> list[str]:
  out, d = [], data_dir
  for _ in range(_SEARCH_UP + 1):
    out.append(os.path.join(d, name))
    d = os.path.dirname(d.rstrip("/"))
  return out


def _read(path: str, do_lower_case: bool) -> Vocab:
  return Vocab(tuple(tokenization.read_vocab(path)), do_lower_case, path)


def find_vocab(checkpoint_dir: str, vocab_file: Optional[str] = None,
               do_lower_case: Optional[bool] = None, *, depth: int = 0) -> Vocab:
  """The vocab of the run that wrote `checkpoint_dir` (see the module docstring).

  `vocab_file` and `do_lower_case` replace what the data's metadata says;
  either is required where the data's metadata cannot be found. A run
  without pretraining data of its own (fine-tuning) has the vocab file and
  casing its record names, else the vocab of the weights it started from.
  """
  meta, looked_at = data_metadata(checkpoint_dir)
  if meta is None:
    # A fine-tuning run recorded its vocab file and casing.
    _, recorded = _fine_tuning_record(checkpoint_dir)
    if recorded and do_lower_case is None:
      do_lower_case = bool(recorded["do_lower_case"])
    if (recorded.get("vocab_file") and vocab_file is None
        and fileio.exists(recorded["vocab_file"])):
      vocab_file = recorded["vocab_file"]
  if meta is None and vocab_file is None:
    inherited = _init_from_vocab(checkpoint_dir, do_lower_case, depth)
    if inherited is not None:
      return inherited
  tokenizer = meta.tokenizer if meta else {}
  if meta and tokenizer.get("type", "wordpiece") != "wordpiece":
    raise ValueError(f"{looked_at}: the data was tokenized with {tokenizer.get('type')}; "
                     "Hugging Face's BertTokenizer and the original release read WordPiece "
                     "vocab.txt files only")
  lower = do_lower_case if do_lower_case is not None else tokenizer.get("do_lower_case")
  if lower is None:
    raise ValueError(f"--do_lower_case: the data's casing is unknown ({looked_at}); pass "
                     "--do_lower_case=true or false")
  if vocab_file:
    vocab = _read(vocab_file, lower)
  elif not meta:
    raise ValueError(f"--vocab_file: the checkpoint's vocab cannot be found ({looked_at}); "
                     "pass the vocab.txt the data was created with")
  else:
    data_dir = os.path.dirname(looked_at)
    found = [p for p in _candidates(data_dir, tokenizer.get("vocab_file", VOCAB_NAME))
             if fileio.exists(p)]
    matching = [p for p in found
                if schema.vocab_hash(tokenization.read_vocab(p)) == meta.vocab_hash]
    if not matching:
      raise ValueError(
          f"--vocab_file: {looked_at} names vocab {tokenizer.get('vocab_file')!r} "
          f"({meta.vocab_hash}) but no file of that name with those tokens is in "
          f"{_candidates(data_dir, '')}"
          + (f" (found {found} with other tokens)" if found else "")
          + "; pass the vocab.txt the data was created with")
    vocab = _read(matching[0], lower)
  if meta and schema.vocab_hash(vocab.tokens) != meta.vocab_hash:
    raise ValueError(f"--vocab_file={vocab_file}: its tokens hash to "
                     f"{schema.vocab_hash(vocab.tokens)} but the data ({looked_at}) was "
                     f"created with vocab {meta.vocab_hash}")
  return vocab


def check_fits(vocab: Vocab, vocab_size: int) -> None:
  """The vocab has the model's row count and BERT's special tokens."""
  special_tokens(vocab)
  if len(vocab.tokens) != vocab_size:
    raise ValueError(f"{vocab.source}: {len(vocab.tokens)} tokens but the model has "
                     f"model.vocab_size={vocab_size}")


def special_tokens(vocab: Vocab) -> dict[str, str]:
  """HF's special-token map; the vocab must hold all of BERT's special tokens."""
  missing = [t for t in schema.SPECIAL_TOKENS if t not in vocab.tokens]
  if missing:
    raise ValueError(f"{vocab.source}: the vocab lacks {missing}")
  pad, unk, cls, sep, mask = schema.SPECIAL_TOKENS
  return dict(pad_token=pad, unk_token=unk, cls_token=cls, sep_token=sep, mask_token=mask)


def write_vocab(vocab: Vocab, out_dir: str) -> str:
  path = os.path.join(out_dir, VOCAB_NAME)
  fileio.write_text(path, "".join(t + "\n" for t in vocab.tokens))
  return path


def _write_json(path: str, obj: Any) -> None:
  fileio.write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_hf_tokenizer(vocab: Vocab, out_dir: str, model_max_length: int) -> None:
  """vocab.txt, tokenizer_config.json and special_tokens_map.json for
  transformers' BertTokenizer / BertTokenizerFast (AutoTokenizer)."""
  specials = special_tokens(vocab)
  write_vocab(vocab, out_dir)
  _write_json(os.path.join(out_dir, SPECIAL_TOKENS_MAP_NAME), specials)
  _write_json(os.path.join(out_dir, TOKENIZER_CONFIG_NAME), dict(
      specials, tokenizer_class="BertTokenizer", do_lower_case=vocab.do_lower_case,
      # The original release lower-cases and strips accents together.
      strip_accents=None, tokenize_chinese_chars=True, do_basic_tokenize=True,
      model_max_length=model_max_length, clean_up_tokenization_spaces=True))


def pad_token_id(vocab: Vocab) -> int:
  return vocab.tokens.index(schema.SPECIAL_TOKENS[0])
