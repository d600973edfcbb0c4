"""Tests of the tokenizers (bertjax/text/tokenization.py, basic_tokenizer.py).

WordPiece is checked id for id against transformers' BertTokenizer (the
original algorithm in Python) with the same vocab, uncased and cased.
"""

import json
import os
import pickle
import random
import unicodedata

import numpy as np
import pytest

from bertjax.records import schema
from bertjax.text import ascii_words
from bertjax.text import basic_tokenizer
from bertjax.text import tokenization
from bertjax.text import vocab as vocab_lib

# Scripts and symbols the parity vocab covers (every character, its lower
# case and its decomposition, each also as a "##" continuation).
_RANGES = ((0x21, 0x7F), (0xA0, 0x250), (0x300, 0x370), (0x370, 0x500),
           (0x600, 0x700), (0x890, 0x900), (0x900, 0x980), (0xE00, 0xE80),
           (0x1100, 0x1200), (0x1AB0, 0x1B00), (0x1E00, 0x1F00),
           (0x2000, 0x2070), (0x20A0, 0x20C0), (0x2100, 0x2150),
           (0x3000, 0x30A0), (0x4E00, 0x4F00), (0xAC00, 0xAC80),
           (0xFF00, 0xFF5F), (0x2B800, 0x2B840), (0x1F300, 0x1F650),
           (0x1F900, 0x1FB00))
_WORDS = ["un", "##want", "##ed", "wa", "want", "runn", "##ing", "hello",
          "world", "the", "café", "cafe", "naive", "##ly", "ab", "##cd",
          "οδος", "ς", "straße", "日本"]
_TEXTS = [
    "Hello, World! The café's naïve résumé — Ångström & Co. (1998).",
    "unwanted running unwantedX running",
    "中文字符和日本語のテキスト、全角ＡＢＣ１２３。한국어 텍스트",
    "¿Qué pasó? ¡Sí! «Guillemets» „Anführung“ ‘single’ “double” …",
    "a" * 99 + " " + "b" * 100 + " " + "c" * 101 + " " + "é" * 101,
    "ctrl\x00chars\x01here\x7f and\u200bzero\ufeffwidth\ufffdreplaced\x85",
    "tabs\tnew\nlines\r\nideographic\u3000nbsp\u00a0line\u2028para\u2029",
    "Emoji: I ❤️ 🤗 and 👍🏽 and 🫨 (newer than Python's Unicode) and 🧑‍💻",
    "ΟΔΟΣ ΑΣ. İstanbul STRASSE straße ﬁne e\u0301 ǅ Ⅻ ①",
    "العربية हिन्दी ไทย Ελληνικά Русский 3.14 1,000 $5 50% a/b a-b a_b",
    "no  double   spaces    and trailing   ",
    "",
    "   ",
]


def _parity_vocab(path):
  chars = set()
  for a, b in _RANGES:
    for cp in range(a, b):
      ch = chr(cp)
      for c in (ch, ch.lower(), *unicodedata.normalize("NFD", ch),
                *unicodedata.normalize("NFD", ch.lower())):
        if len(c) == 1 and not c.isspace():
          chars.add(c)
  tokens = list(schema.SPECIAL_TOKENS) + _WORDS + sorted(chars) + [
      "##" + c for c in sorted(chars)]
  tokens = list(dict.fromkeys(tokens))
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(tokens) + "\n")
  return path, sorted(chars)


@pytest.fixture(scope="module")
def parity(tmp_path_factory):
  transformers = pytest.importorskip("transformers")
  path, chars = _parity_vocab(str(tmp_path_factory.mktemp("tok") / "vocab.txt"))
  out = {"path": path, "chars": chars}
  for lower in (True, False):
    out[lower] = (tokenization.load_tokenizer("wordpiece", path, lower),
                  transformers.BertTokenizer(path, do_lower_case=lower))
  return out


def _random_texts(chars, unmatched, n, seed):
  rng = random.Random(seed)
  pool = ([c for c in chars if c not in unmatched]
          + [chr(cp) for cp in range(0x20)] + ["\x7f", "\x85", "\ufffd"]
          + list(" \t\n\u3000\u00a0\u2028") * 10 + list("abcdefg ") * 20
          + ["Σ", "ΑΣ", "e\u0301", "İ", "\U0001fae8", "\U000e0041"] * 5)
  return ["".join(rng.choice(pool) for _ in range(rng.randint(0, 40)))
          for _ in range(n)]


@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_wordpiece_matches_bert_tokenizer_id_for_id(parity, lower):
  ours, ref = parity[lower]
  # Characters whose Unicode category changed since the compiled tables.
  assert len(ours.basic.unmatched) <= 5, ours.basic.unmatched
  texts = _TEXTS + _random_texts(parity["chars"], ours.basic.unmatched, 1500,
                                 seed=int(lower))
  got = ours.encode_batch(texts)
  assert [ours.encode(t) for t in texts[:50]] == got[:50]
  mismatches = []
  for text, ids in zip(texts, got):
    want = ref.convert_tokens_to_ids(ref.tokenize(text))
    if ids != want:
      mismatches.append((text, ours.convert_ids_to_tokens(ids),
                         ref.convert_ids_to_tokens(want)))
  assert not mismatches, mismatches[:3]
  # The texts exercised what they are meant to.
  unk = ours.special_ids["unk"]
  assert sum(ids.count(unk) for ids in got) > 10
  assert sum(len(ids) for ids in got) > 10000


def _ascii_texts(n, seed):
  rng = random.Random(seed)
  pool = [chr(c) for c in range(128)] + list("abcdefghij  ") * 8
  words = ["the", "Python", "UNwanted", "running", "HELLO", "x" * 101,
           "a" * 100, "caf", "it's", "e.g.", "1,000", "[mask"]
  out = []
  for _ in range(n):
    parts = [rng.choice(words) if rng.random() < 0.4 else "".join(
        rng.choice(pool) for _ in range(rng.randint(0, 12)))
             for _ in range(rng.randint(0, 8))]
    out.append(" ".join(parts))
  return out


@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_ascii_word_path_matches_bert_tokenizer(parity, lower):
  # ASCII texts take the word-cache path (ascii_words.py): every ASCII
  # character, newlines inside texts, words over 100 characters.
  ours, ref = parity[lower]
  texts = _ascii_texts(1500, seed=10 + lower)
  got = ours.encode_batch(texts)
  for text, ids in zip(texts, got):
    assert ids == ref.convert_tokens_to_ids(ref.tokenize(text)), text
  assert got == ours._encode_compiled(texts)  # pylint: disable=protected-access
  assert sum(map(len, got)) > 20000
  # A cache that fills up starts over and gives the same ids.
  small = ascii_words.AsciiWords(
      ours._encode_compiled, lower, max_words=40)  # pylint: disable=protected-access
  for start in (0, 500, 0):
    ids, lengths = small.encode_flat(texts[start:start + 500])
    assert lengths.tolist() == [len(x) for x in got[start:start + 500]]
    assert ids.tolist() == [i for x in got[start:start + 500] for i in x]
  assert len(small._index) > 40  # pylint: disable=protected-access
  assert small.encode_flat(["Zebra Stripes"])[0].tolist() == ours.encode(
      "Zebra Stripes")
  assert len(small._index) <= 40  # pylint: disable=protected-access
  # Batches mixing ASCII and other texts keep every text in its place.
  others = _random_texts(parity["chars"], ours.basic.unmatched, 300, seed=5)
  mixed = [t for pair in zip(texts[:300], others) for t in pair]
  ids, lengths = ours.encode_flat(mixed)
  want = ours._encode_compiled(mixed)  # pylint: disable=protected-access
  assert lengths.tolist() == [len(x) for x in want]
  assert ids.tolist() == [i for x in want for i in x]
  assert ids.dtype == np.int32


def test_calibration_is_kept_on_disk(tmp_path, monkeypatch):
  monkeypatch.setenv("BERTJAX_CACHE_DIR", str(tmp_path))
  calibrate = basic_tokenizer._calibrate  # pylint: disable=protected-access
  calibrate.cache_clear()
  try:
    computed = calibrate(True)
    path = basic_tokenizer.cache_path(True)
    assert os.path.dirname(path) == str(tmp_path) and os.path.exists(path)
    calibrate.cache_clear()
    loaded = calibrate(True)
    assert loaded is not computed
    assert loaded.table == computed.table
    assert loaded.unmatched == computed.unmatched
    assert loaded.pattern.pattern == computed.pattern.pattern
    assert loaded.astral.pattern == computed.astral.pattern
    # A damaged file is computed afresh and replaced.
    with open(path, "w") as f:
      f.write("{not json")
    calibrate.cache_clear()
    assert calibrate(True).table == computed.table
    with open(path) as f:
      assert json.load(f)["table"] == computed.table
    monkeypatch.setenv("BERTJAX_CACHE_DIR", "")
    assert basic_tokenizer.cache_path(True) is None
  finally:
    calibrate.cache_clear()


def test_wordpiece_known_answers(parity, tmp_path):
  # The original release's own test vocab and answers.
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(list(schema.SPECIAL_TOKENS) + [
      "want", "##want", "##ed", "wa", "un", "runn", "##ing", ",", "low",
      "lowest", "中", "文"]) + "\n")
  tok = tokenization.load_tokenizer("wordpiece", str(path))
  assert tok.tokenize("UNwant\u00e9d,running") == [
      "un", "##want", "##ed", ",", "runn", "##ing"]
  assert tok.tokenize("unwantedX running") == ["[UNK]", "runn", "##ing"]
  assert tok.tokenize("中文 lowest") == ["中", "文", "lowest"]
  cased = tokenization.load_tokenizer("wordpiece", str(path), False)
  assert cased.tokenize("UNwanted wanted") == ["[UNK]", "want", "##ed"]
  assert cased.tokenize("unwant\u00e9d") == ["[UNK]"]  # Accents kept.
  tok = parity[True][0]
  assert tok.tokenize("Café") == ["cafe"]
  assert parity[False][0].tokenize("café") == ["café"]
  assert tok.tokenize("a" * 100) == ["a"] + ["##a"] * 99
  assert tok.tokenize("a" * 101) == ["[UNK]"]
  assert tok.tokenize("a\x00b\u200bc") == ["ab", "##c"]  # Controls go.
  # Special-token literals are split like any text, so text never yields
  # a special id other than [UNK].
  assert tok.tokenize("[MASK] [CLS]") == ["[", "m", "##a", "##s", "##k", "]",
                                          "[", "c", "##l", "##s", "]"]
  assert tok.encode_batch([]) == [] and tok.encode("") == []


def test_word_starts_and_metadata(parity):
  tok = parity[True][0]
  tokens = tok.tokens
  assert tok.vocab_size == len(tokens) == len(tok.is_word_start)
  assert all(s == (not t.startswith("##"))
             for t, s in zip(tokens, tok.is_word_start))
  for word in ("unwanted", "running", "hello", "zebra"):
    ids = tok.encode(word)
    assert [tok.is_word_start[i] for i in ids] == [True] + [False] * (
        len(ids) - 1)
  assert tok.special_ids == {"pad": 0, "unk": 1, "cls": 2, "sep": 3,
                             "mask": 4}
  with open(parity["path"], encoding="utf-8") as f:
    file_tokens = f.read().split("\n")[:-1]
  assert tok.vocab_hash() == schema.vocab_hash(file_tokens)
  assert tok.describe() == {"type": "wordpiece", "do_lower_case": True,
                            "vocab_file": "vocab.txt",
                            "vocab_size": len(file_tokens)}
  assert tok.convert_tokens_to_ids(["hello", "nope"]) == [
      tok.vocab["hello"], tok.special_ids["unk"]]


def test_pickles_without_the_vocab_file(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(list(schema.SPECIAL_TOKENS)
                            + ["hello", "world", "##s"]) + "\n")
  tok = tokenization.load_tokenizer("wordpiece", str(path))
  data = pickle.dumps(tok)
  path.unlink()
  copy = pickle.loads(data)
  assert copy.encode_batch(["Hello worlds"]) == [[5, 6, 7]]
  assert copy.vocab_hash() == tok.vocab_hash()


def test_vocab_errors_name_the_file_and_the_problem(tmp_path):
  missing = tmp_path / "no_specials.txt"
  missing.write_text("[PAD]\n[UNK]\n[SEP]\nthe\n")
  with pytest.raises(ValueError, match=r"no_specials\.txt.*\[CLS\], \[MASK\]"):
    tokenization.load_tokenizer("wordpiece", str(missing))
  with pytest.raises(ValueError, match=r"nowhere\.txt: cannot read"):
    tokenization.load_tokenizer("wordpiece", str(tmp_path / "nowhere.txt"))
  dup = tmp_path / "dup.txt"
  dup.write_text("\n".join(list(schema.SPECIAL_TOKENS) + ["a", "b", "a"]))
  with pytest.raises(ValueError, match=r"dup\.txt: line 8: token 'a' is "
                     r"already on line 6"):
    tokenization.load_tokenizer("wordpiece", str(dup))
  binary = tmp_path / "spm.bin"
  binary.write_bytes(b"\x0a\xff\xfe\x00")
  with pytest.raises(ValueError, match="--tokenizer=sentencepiece"):
    tokenization.load_tokenizer("wordpiece", str(binary))
  with pytest.raises(ValueError, match="--tokenizer=bpe: must be one of"):
    tokenization.load_tokenizer("bpe", str(dup))
  with pytest.raises(ValueError, match="not a SentencePiece model"):
    tokenization.load_tokenizer("sentencepiece", str(dup))


_SYLLABLES = ("ka to ri mu se na po li ve da gu shi ren tal mon ex pre "
              "con ing ed ly tion").split()


@pytest.fixture(scope="module", params=["unigram", "bpe"])
def sentencepiece_model(request, tmp_path_factory):
  pytest.importorskip("sentencepiece")
  root = tmp_path_factory.mktemp("spm")
  rng = random.Random(0)
  words = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4)))
           for _ in range(400)]
  corpus = root / "corpus.txt"
  with open(corpus, "w", encoding="utf-8") as f:
    for _ in range(3000):
      line = [rng.choice(words) for _ in range(rng.randint(4, 14))]
      f.write(" ".join(line).capitalize() + ".\n")
  path = vocab_lib.train_sentencepiece(
      [str(corpus)], str(root / request.param), vocab_size=120,
      model_type=request.param, num_threads=1)
  return path, words


def test_sentencepiece_special_ids_and_round_trip(sentencepiece_model):
  path, words = sentencepiece_model
  tok = tokenization.load_tokenizer("sentencepiece", path)
  assert tok.tokens[:5] == schema.SPECIAL_TOKENS
  assert tok.special_ids == {"pad": 0, "unk": 1, "cls": 2, "sep": 3,
                             "mask": 4}
  assert tok.vocab_size == 120
  texts = [" ".join(words[:8]).capitalize() + ".",
           " ".join(words[-12:]).capitalize() + "."]
  ids = tok.encode_batch(texts)
  assert [tok.decode(x) for x in ids] == [t.lower() for t in texts]
  assert all(i >= 1 for x in ids for i in x)
  # Special-token literals in text never give [PAD], [CLS], [SEP], [MASK].
  special = tok.encode(f"[CLS] {words[0]} [MASK] [SEP] [PAD]")
  assert not set(special) & {0, 2, 3, 4}
  # A word's first piece starts with "▁"; the others continue it.
  for word in words[:20] + ["zebra"]:
    pieces = tok.tokenize(word)
    assert pieces[0].startswith("\u2581")
    starts = [tok.is_word_start[i] for i in tok.encode(word)]
    assert starts == [True] + [False] * (len(pieces) - 1), pieces
  assert sum(tok.is_word_start) < tok.vocab_size  # Continuations exist.
  assert tok.describe()["type"] == "sentencepiece"
  copy = pickle.loads(pickle.dumps(tok))
  assert copy.encode_batch(texts) == ids
  assert copy.vocab_hash() == tok.vocab_hash() == schema.vocab_hash(tok.tokens)
