"""Small fine-tuning fixtures: a WordPiece vocab and GLUE-format TSVs.

The pair task is learnable: label 1 when the two sentences share their first
word. Texts use the fixture vocab's words only.
"""

import os

import numpy as np

WORDS = [f"word{i}" for i in range(40)] + ["the", "a", "cat", "dog", "runs", "sits"]


def write_vocab(path: str) -> str:
  tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", *WORDS, "##s", "##ing"]
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(tokens) + "\n")
  return path


def sentence(rng, first: str) -> str:
  """`first` then 2 to 11 random words, some with a sub-word suffix."""
  words = [w + ("ing" if rng.random() < 0.2 else "") for w in rng.choice(WORDS, rng.integers(2, 12))]
  return " ".join([first, *words])


def pair_rows(n: int, seed: int) -> list[tuple[str, str, str]]:
  """(label, sentence1, sentence2): label "1" when both start with the same word."""
  rng = np.random.default_rng(seed)
  rows = []
  for i in range(n):
    a = rng.choice(WORDS[:8])
    same = i % 2 == 0
    b = a if same else rng.choice([w for w in WORDS[:8] if w != a])
    rows.append(("1" if same else "0", sentence(rng, a), sentence(rng, b)))
  return rows


def write_mrpc(directory: str, num_train: int = 64, num_dev: int = 24) -> str:
  """train.tsv and dev.tsv in MRPC's columns: Quality, #1 ID, #2 ID, #1 String, #2 String."""
  os.makedirs(directory, exist_ok=True)
  for name, n, seed in (("train.tsv", num_train, 0), ("dev.tsv", num_dev, 1)):
    lines = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
    lines += [f"{y}\t{i}\t{i + 1}\t{a}\t{b}" for i, (y, a, b) in enumerate(pair_rows(n, seed))]
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
      f.write("\n".join(lines) + "\n")
  return directory


def _write(path: str, lines: list[str]) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")


def write_cola(directory: str, num: int = 20) -> str:
  """CoLA's headerless train.tsv/dev.tsv: source, label, original mark, sentence."""
  for name, seed in (("train.tsv", 0), ("dev.tsv", 1)):
    rows = pair_rows(num, seed)
    _write(os.path.join(directory, name),
           [f"src{i}\t{y}\t\t{a}" for i, (y, a, _) in enumerate(rows)])
  return directory


MNLI_LABELS = ("contradiction", "entailment", "neutral")


def write_mnli(directory: str, num: int = 20) -> str:
  """MNLI's train.tsv, dev_matched.tsv, dev_mismatched.tsv (sentences in columns 8, 9;
  gold label last)."""
  header = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\t"
            "sentence2_binary_parse\tsentence1_parse\tsentence2_parse\tsentence1\t"
            "sentence2\tlabel1\tgold_label")
  for seed, name in enumerate(("train.tsv", "dev_matched.tsv", "dev_mismatched.tsv")):
    rows = pair_rows(num, seed)
    lines = [header]
    for i, (_, a, b) in enumerate(rows):
      label = MNLI_LABELS[(i + seed) % 3]
      lines.append(f"{i}\t{i}\t{i}e\tfiction\t( x )\t( y )\t(ROOT x)\t(ROOT y)\t"
                   f"{a}\t{b}\t{label}\t{label}")
    _write(os.path.join(directory, name), lines)
  return directory


def write_sst2_token_presence(directory: str, num_train: int = 256, num_dev: int = 64,
                              token: str = "cat") -> str:
  """SST-2's train.tsv and dev.tsv (sentence, label) of a separable task: label 1
  exactly when `token` is in the sentence (half the rows, at a random place)."""
  others = [w for w in WORDS if w != token]
  for name, n, seed in (("train.tsv", num_train, 0), ("dev.tsv", num_dev, 1)):
    rng = np.random.default_rng(seed)
    lines = ["sentence\tlabel"]
    for i in range(n):
      words = list(rng.choice(others, rng.integers(3, 10)))
      if i % 2:
        words.insert(int(rng.integers(0, len(words) + 1)), token)
      lines.append(f"{' '.join(words)}\t{i % 2}")
    _write(os.path.join(directory, name), lines)
  return directory


# The test TSVs of GLUE's download (download_glue_data.py): a header, the index in
# column 0, no label. task directory -> [(file, header columns, text columns)].
_PAIR = ["index", "sentence1", "sentence2"]
_MNLI_TEST = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse",
              "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1",
              "sentence2"]
GLUE_TEST_LAYOUTS = {
    "CoLA": [("test.tsv", ["index", "sentence"], ["sentence"])],
    "SST-2": [("test.tsv", ["index", "sentence"], ["sentence"])],
    "MRPC": [("test.tsv", ["index", "#1 ID", "#2 ID", "#1 String", "#2 String"],
              ["#1 String", "#2 String"])],
    "STS-B": [("test.tsv", ["index", "genre", "filename", "year", "old_index", "source1",
                            "source2", "sentence1", "sentence2"], ["sentence1", "sentence2"])],
    "QQP": [("test.tsv", ["id", "question1", "question2"], ["question1", "question2"])],
    "MNLI": [("test_matched.tsv", _MNLI_TEST, ["sentence1", "sentence2"]),
             ("test_mismatched.tsv", _MNLI_TEST, ["sentence1", "sentence2"])],
    "QNLI": [("test.tsv", ["index", "question", "sentence"], ["question", "sentence"])],
    "RTE": [("test.tsv", _PAIR, ["sentence1", "sentence2"])],
    "WNLI": [("test.tsv", _PAIR, ["sentence1", "sentence2"])],
    "diagnostic": [("diagnostic.tsv", _PAIR, ["sentence1", "sentence2"])],
}


def write_glue_test(root: str, task_dir: str, texts: list[tuple[str, str]]) -> list[str]:
  """task_dir's test TSV(s) under root/task_dir with `texts` (a, b; b unused by single-
  sentence tasks) in GLUE's layout; indices 100, 101, ... Returns the files written."""
  paths = []
  for name, header, text_columns in GLUE_TEST_LAYOUTS[task_dir]:
    lines = ["\t".join(header)]
    for i, pair in enumerate(texts):
      values = dict(zip(text_columns, pair))
      lines.append("\t".join(str(100 + i) if column == header[0] else
                             values.get(column, "x") for column in header))
    paths.append(os.path.join(root, task_dir, name))
    _write(paths[-1], lines)
  return paths
