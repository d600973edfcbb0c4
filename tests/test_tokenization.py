"""Tests of the tokenizers (bertjax/text/tokenization.py, basic_tokenizer.py).

WordPiece is checked id for id against the original release's FullTokenizer
(bert-tensorflow, run in a subprocess by original_release.py) with the same
vocab, uncased and cased, on an adversarial set of texts; the "hf" variant
against transformers' BertTokenizer.
"""

import json
import os
import pickle
import random
import subprocess
import sys
import unicodedata

import numpy as np
import pytest
import tokenizers
import transformers

from bertjax.records import schema
from bertjax.text import ascii_words
from bertjax.text import ragged
from bertjax.text import tokenization
from bertjax.text import vocab as vocab_lib

ORIGINAL_SCRIPT = os.path.join(os.path.dirname(__file__), "original_release.py")
# Scripts and symbols the parity vocab covers (every character, its lower
# case and its decomposition, each also as a "##" continuation).
_RANGES = ((0x21, 0x7F), (0xA0, 0x250), (0x300, 0x370), (0x370, 0x500),
           (0x600, 0x700), (0x890, 0x900), (0x900, 0x980), (0xE00, 0xE80),
           (0x1100, 0x1200), (0x1AB0, 0x1B00), (0x1E00, 0x1F00),
           (0x2000, 0x2070), (0x20A0, 0x20C0), (0x2100, 0x2150),
           (0x3000, 0x30A0), (0x4E00, 0x4F00), (0xAC00, 0xAC80),
           (0xFF00, 0xFF5F), (0x2B800, 0x2B840), (0x1F300, 0x1F650),
           (0x1F900, 0x1FB00))
# Characters where a ready-made pipeline goes wrong: controls and format
# characters (Cc, Cf: dropped), unassigned and private-use ones (kept by the
# original: U+0378, U+1FAE8 and U+1C89 are unassigned in Unicode 14, U+E000
# and U+F0000 private), U+11938 (decomposed by NFD), combining marks with
# and without a canonical class (U+1D165 is Mc with class 216), CJK at the
# edges of the original's ranges, punctuation whose category changed
# (U+166D), special casing (İ, ß, ﬁ, final sigma) and whitespace.
_ODD = ("\x00\x01\x0b\x1f\x7f\x85\x9f\u00ad\u200b\u200d\ufeff\u2060\u180e"
        "\U000e0041\ufffd\u0378\U0001fae8\u1c89\ue000\U000f0000\U00011938"
        "\U00011935\U00011930\u0301\u0327\u0308\U0001d165\U0001d16d\u093f"
        "\u0f39\u20dd\u4e00\u9fff\u3400\U0002b820\U0002b91f\U0002ceaf"
        "\uf900\U0002f800\u2f00\u166d\u00b7\u0387\u2e3a\u00bf\u00a1\u2026"
        "\u0130\u00df\ufb01\u216b\u2460\u03a3\u03c3\u03c2\u1e9e\u01c5\u212b"
        "\u00e9\u00c5\u0130\u0390\u1f88\u0627\u0939\u0e44\ud55c\u0416")
_SPACES = " \t\n\r\u3000\u00a0\u2028\u2029\u1680\u202f"
_WORDS = ["un", "##want", "##ed", "wa", "want", "runn", "##ing", "hello",
          "world", "the", "café", "cafe", "cafe\u0301", "naive", "##ly",
          "ab", "##cd", "οδος", "οδοσ", "ς", "straße", "日本", "##ς"]
_TEXTS = [
    "Hello, World! The café's naïve résumé — Ångström & Co. (1998).",
    "unwanted running unwantedX running",
    "中文字符和日本語のテキスト、全角ＡＢＣ１２３。한국어 텍스트",
    "¿Qué pasó? ¡Sí! «Guillemets» „Anführung“ ‘single’ “double” …",
    "ctrl\x00chars\x01here\x7f and\u200bzero\ufeffwidth\ufffdreplaced\x85",
    "tabs\tnew\nlines\r\nideographic\u3000nbsp\u00a0line\u2028para\u2029",
    "Emoji: I ❤️ 🤗 and 👍🏽 and 🫨 (newer than Unicode 14) and 🧑‍💻",
    # Final sigma: the original lower-cases whole words.
    "ΟΔΟΣ ΑΣ. ΟΔΟΣ\u200bΑ ΑΣ\x01Β Σ ΣΑ ΑΣ΄ Α\u0301Σ",
    "İstanbul STRASSE straße ﬁne ǅ Ⅻ ① Å \u1c89\u1c8a \U00011938",
    # NFD and NFC forms: cased text is not normalised.
    "cafe\u0301 café e\u0301\u0327 e\u0327\u0301 a\u200b\u0301\u0327",
    "العربية हिन्दी ไทย Ελληνικά Русский 3.14 1,000 $5 50% a/b a-b a_b",
    "private \ue000\U000f0000 unassigned \u0378\U00040000 \U0002b820\uf900",
    # Words of 99 to 202 characters (the original's limit is 200).
    " ".join(c * n for c, n in (("a", 99), ("b", 100), ("c", 101),
                                ("d", 150), ("e", 200), ("f", 201))),
    " ".join(["é" * 101, "É" * 200, "é" * 201, "e\u0301" * 100,
              "e\u0301" * 101, "Σ" * 150, "ab" * 100 + "!", "日" * 250]),
    "[MASK] [CLS] [unused0] ##ing",
    "no  double   spaces    and trailing   ",
    "",
    "   ",
]


def _parity_vocab(path):
  chars = set()
  for ch in [chr(cp) for a, b in _RANGES for cp in range(a, b)] + list(_ODD):
    for c in (ch, ch.lower(), *unicodedata.normalize("NFD", ch),
              *unicodedata.normalize("NFD", ch.lower())):
      if len(c) == 1 and not c.isspace():
        chars.add(c)
  tokens = list(schema.SPECIAL_TOKENS) + _WORDS + sorted(chars) + [
      "##" + c for c in sorted(chars)]
  tokens = list(dict.fromkeys(tokens))
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(tokens) + "\n")
  return path


def _random_texts(n, seed):
  """Mixes of every script of the vocab, the odd characters and spaces,
  with now and then a word of 95 to 205 characters."""
  rng = random.Random(seed)
  pool = ([chr(cp) for a, b in _RANGES for cp in range(a, b, 7)]
          + list(_ODD) * 40 + list(_SPACES) * 30 + list("abcdefg ") * 20
          + ["Σ", "ΑΣ", "e\u0301", "\U0001fae8"] * 10)
  texts = []
  for _ in range(n):
    text = "".join(rng.choice(pool) for _ in range(rng.randint(0, 40)))
    if rng.random() < 0.1:
      word = "".join(rng.choice("aÉe\u0301Σς中") for _ in range(3))
      text += " " + word * (rng.randint(95, 205) // 3)
    texts.append(text)
  return texts


def _ascii_texts(n, seed):
  rng = random.Random(seed)
  pool = [chr(c) for c in range(128)] + list("abcdefghij  ") * 8
  words = ["the", "Python", "UNwanted", "running", "HELLO", "x" * 101,
           "a" * 200, "b" * 201, "caf", "it's", "e.g.", "1,000", "[mask"]
  out = []
  for _ in range(n):
    parts = [rng.choice(words) if rng.random() < 0.4 else "".join(
        rng.choice(pool) for _ in range(rng.randint(0, 12)))
             for _ in range(rng.randint(0, 8))]
    out.append(" ".join(parts))
  return out


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
  """The vocab, the texts, and the original release's ids for them."""
  root = tmp_path_factory.mktemp("tok")
  path = _parity_vocab(str(root / "vocab.txt"))
  texts = {"adversarial": _TEXTS + _random_texts(1500, seed=0),
           "ascii": _ascii_texts(1500, seed=1)}
  flat = [t for v in texts.values() for t in v]
  in_json, out_json = root / "texts.json", root / "ids.json"
  in_json.write_text(json.dumps(flat))
  result = subprocess.run(
      [sys.executable, ORIGINAL_SCRIPT, "tokenize-cases", path, in_json, out_json],
      text=True, capture_output=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  ids = json.loads(out_json.read_text())
  out = {"path": path, "texts": texts}
  for lower, name in ((True, "uncased"), (False, "cased")):
    n = len(texts["adversarial"])
    out[lower] = {"adversarial": ids[name][:n], "ascii": ids[name][n:],
                  "ours": tokenization.load_tokenizer("wordpiece", path,
                                                      lower)}
  return out


def _mismatches(tok, texts, got, want):
  return [(text, tok.convert_ids_to_tokens(g), tok.convert_ids_to_tokens(w))
          for text, g, w in zip(texts, got, want) if g != w]


@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_wordpiece_matches_the_original_release_id_for_id(oracle, lower):
  ours, want = oracle[lower]["ours"], oracle[lower]["adversarial"]
  texts = oracle["texts"]["adversarial"]
  got = ours.encode_batch(texts)
  assert not _mismatches(ours, texts, got, want)[:3]
  assert [ours.encode(t) for t in texts[:50]] == got[:50]
  # The character classes cover the characters seen so far, growing as new
  # ones come: texts one at a time through a fresh tokenizer, and the
  # pipeline whose classes cover all of Unicode, give the same ids.
  fresh = tokenization.load_tokenizer("wordpiece", oracle["path"], lower)
  assert [fresh.encode(t) for t in texts[:300]] == got[:300]
  whole = fresh._tokenizer  # pylint: disable=protected-access
  assert [e.ids for e in whole.encode_batch(
      fresh.basic.prepare_batch(texts), add_special_tokens=False)] == got
  # The set is adversarial: tokenizers' ready-made BERT pipeline (its
  # normaliser, pre-tokenizer and 100-character limit) gets many wrong.
  ready = tokenizers.Tokenizer(tokenizers.models.WordPiece(
      ours.vocab, unk_token="[UNK]", max_input_chars_per_word=100))
  ready.normalizer = tokenizers.normalizers.BertNormalizer(
      lowercase=lower, strip_accents=lower)
  ready.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
  theirs = [e.ids for e in ready.encode_batch(texts, add_special_tokens=False)]
  wrong = _mismatches(ours, texts, theirs, want)
  assert len(wrong) > 100, len(wrong)
  assert {_TEXTS[12], _TEXTS[13]} <= {w[0] for w in wrong}
  unk = ours.special_ids["unk"]
  assert sum(ids.count(unk) for ids in got) > 100
  assert sum(len(ids) for ids in got) > 30000


@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_ascii_word_path_matches_the_original_release(oracle, lower):
  # ASCII texts take the word-cache path (ascii_words.py): every ASCII
  # character, newlines inside texts, words of 200 and 201 characters.
  ours, want = oracle[lower]["ours"], oracle[lower]["ascii"]
  texts = oracle["texts"]["ascii"]
  got = ours.encode_batch(texts)
  assert not _mismatches(ours, texts, got, want)[:3]
  assert got == ours._encode_compiled(texts)  # pylint: disable=protected-access
  assert sum(map(len, got)) > 20000
  # A cache that fills up starts over and gives the same ids.
  small = ascii_words.AsciiWords(
      lambda words: ragged.flatten(ours._encode_compiled(words)),  # pylint: disable=protected-access
      lower, max_words=40)
  for start in (0, 500, 0):
    ids, lengths = small.encode_flat(texts[start:start + 500])
    assert lengths.tolist() == [len(x) for x in got[start:start + 500]]
    assert ids.tolist() == [i for x in got[start:start + 500] for i in x]
  assert len(small) > 40
  assert small.encode_flat(["Zebra Stripes"])[0].tolist() == ours.encode(
      "Zebra Stripes")
  assert len(small) <= 40
  # Batches mixing ASCII and other texts keep every text in its place.
  others = oracle["texts"]["adversarial"]
  mixed = [t for pair in zip(texts[:300], others[:300]) for t in pair]
  ids, lengths = ours.encode_flat(mixed)
  want = [x for pair in zip(want[:300], oracle[lower]["adversarial"][:300])
          for x in pair]
  assert lengths.tolist() == [len(x) for x in want]
  assert ids.tolist() == [i for x in want for i in x]
  assert ids.dtype == np.int32


class _CollidingWords(ascii_words.AsciiWords):
  """Hash tables of zeros (a word's hash is then its length) for the first
  `bad` draws, random ones after."""

  def __init__(self, *args, bad: int, **kwargs):
    self.draws, self.bad = 0, bad
    super().__init__(*args, **kwargs)

  def _new_tables(self):
    super()._new_tables()
    self.draws += 1
    if self.draws <= self.bad:
      self._tables = np.zeros_like(self._tables)


@pytest.mark.parametrize("bad", [1, 3])
def test_ascii_words_give_the_right_ids_when_hashes_collide(oracle, bad):
  # Every word of one length has one hash: matches are checked byte for
  # byte, so the collisions are found and new tables drawn (with bad=3 the
  # cached words themselves collide after the first new draw: the cache
  # starts over).
  ours = oracle[True]["ours"]
  texts = oracle["texts"]["ascii"][:400]
  want = ours.encode_batch(texts)
  words = _CollidingWords(ours._encode_words, True, bad=bad)  # pylint: disable=protected-access
  for a, b in ((0, 200), (200, 400)):
    ids, lengths = words.encode_flat(texts[a:b])
    got = want[a:b]
    assert lengths.tolist() == [len(x) for x in got]
    assert ids.tolist() == [i for x in got for i in x]
  assert words.draws == bad + 1 and words._tables.any()  # pylint: disable=protected-access


def test_encode_flat_a_batch_at_a_time_gives_the_same_ids(oracle, monkeypatch):
  ours = oracle[True]["ours"]
  texts = [t for pair in zip(oracle["texts"]["ascii"][:300],
                             oracle["texts"]["adversarial"][:300]) for t in pair]
  want_ids, want_lengths = ours.encode_flat(texts)
  monkeypatch.setattr(tokenization, "_BATCH_CHARS", 500)
  assert len(list(tokenization._batches(texts))) > 10  # pylint: disable=protected-access
  ids, lengths = ours.encode_flat(texts)
  np.testing.assert_array_equal(ids, want_ids)
  np.testing.assert_array_equal(lengths, want_lengths)
  assert lengths.sum() > 5000
  assert [len(x) for x in ours.encode_flat([])] == [0, 0]


@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_hf_variant_matches_transformers_bert_tokenizer(oracle, lower):
  path = oracle["path"]
  ours = tokenization.load_tokenizer("wordpiece", path, lower, compat="hf")
  ref = transformers.BertTokenizer(path, do_lower_case=lower)
  # BertTokenizer keeps special-token literals whole; bertjax splits them.
  texts = [t for t in oracle["texts"]["adversarial"]
           + oracle["texts"]["ascii"][:300] if "[MASK]" not in t]
  assert ours.tokenize("[MASK]") != ref.tokenize("[MASK]") == ["[MASK]"]
  got = ours.encode_batch(texts)
  want = [ref.convert_tokens_to_ids(ref.tokenize(t)) for t in texts]
  assert not _mismatches(ours, texts, got, want)[:3]
  # It is a different tokenizer from the original's default.
  assert got != oracle[lower]["ours"].encode_batch(texts)
  assert ours.describe()["compat"] == "hf"
  assert pickle.loads(pickle.dumps(ours)).encode_batch(texts[:20]) == got[:20]


def test_wordpiece_known_answers(oracle, tmp_path):
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
  tok, cased = oracle[True]["ours"], oracle[False]["ours"]
  assert tok.tokenize("Café") == ["cafe"]
  assert cased.tokenize("café") == ["café"]
  assert cased.tokenize("cafe\u0301") == ["cafe\u0301"]  # Not NFC.
  assert tok.tokenize("ΟΔΟΣ") == ["οδος"]  # Final sigma.
  assert tok.tokenize("a" * 200) == ["a"] + ["##a"] * 199
  assert tok.tokenize("a" * 201) == ["[UNK]"]
  assert tok.tokenize("a\x00b\u200bc") == ["ab", "##c"]  # Controls go.
  assert tok.tokenize("\U0001fae8") == ["\U0001fae8"]  # Unassigned: kept.
  # Special-token literals are split like any text, so text never yields
  # a special id other than [UNK].
  assert tok.tokenize("[MASK] [CLS]") == ["[", "m", "##a", "##s", "##k", "]",
                                          "[", "c", "##l", "##s", "]"]
  assert tok.encode_batch([]) == [] and tok.encode("") == []
  with pytest.raises(ValueError, match="compat='google': must be one of"):
    tokenization.load_tokenizer("wordpiece", str(path), compat="google")


def test_word_starts_and_metadata(oracle):
  tok = oracle[True]["ours"]
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
  with open(oracle["path"], encoding="utf-8") as f:
    file_tokens = f.read().split("\n")[:-1]
  assert tok.vocab_hash() == schema.vocab_hash(file_tokens)
  assert tok.describe() == {"type": "wordpiece", "do_lower_case": True,
                            "vocab_file": "vocab.txt",
                            "vocab_size": len(file_tokens),
                            "compat": "original"}
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
