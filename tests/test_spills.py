"""Spill runs: byte-string entries and fixed-width rows sort and merge alike;
the map step's rows (mapper.row_dtype) hold what framing needs."""

import numpy as np
import pytest

from bertjax.create import mapper
from bertjax.create import records
from bertjax.create import spills

KEY_WIDTH, PARTS = 8, 3
ROW = np.dtype([("a", "<u2", (5,)), ("b", "u1")])


def _batches(seed=0, n_batches=5):
  """Random (parts, keys, rows) batches; keys distinct."""
  rng = np.random.default_rng(seed)
  keys = rng.permutation(1000)[:n_batches * 40].astype(">u8").view(f"S{KEY_WIDTH}")
  out = []
  for i in range(n_batches):
    n = int(rng.integers(1, 40))
    rows = np.zeros(n, ROW)
    rows["a"] = rng.integers(0, 1 << 16, (n, 5))
    rows["b"] = rng.integers(0, 256, n)
    out.append((rng.integers(0, PARTS, n), keys[i * 40:i * 40 + n], rows))
  return out


def _spill(directory, batches, as_rows, spill_bytes):
  writer = spills.SpillWriter(str(directory), PARTS, KEY_WIDTH, spill_bytes)
  for parts, keys, rows in batches:
    if as_rows:
      writer.add_rows(parts, keys, rows)
    else:
      writer.add(parts, keys, rows.tobytes(), np.full(len(rows), ROW.itemsize))
  writer.flush()
  return spills.list_runs([str(directory)])


@pytest.mark.parametrize("spill_bytes", [1, 200, 1 << 20])
def test_rows_spill_and_merge_as_their_bytes_do(tmp_path, spill_bytes):
  batches = _batches()
  row_runs = _spill(tmp_path / "rows", batches, True, spill_bytes)
  byte_runs = _spill(tmp_path / "bytes", batches, False, spill_bytes)
  assert len(row_runs) == len(byte_runs) > (1 if spill_bytes < 1 << 20 else 0)
  for part in range(PARTS):
    merged = list(spills.merge_part(row_runs, part, KEY_WIDTH, 300, row_dtype=ROW))
    want = list(spills.merge_part(byte_runs, part, KEY_WIDTH, 300))
    assert len(merged) == len(want)
    for (keys, rows, lengths), (want_keys, blob, want_lengths) in zip(merged, want):
      np.testing.assert_array_equal(keys, want_keys)
      assert rows.dtype == ROW and rows.tobytes() == blob
      np.testing.assert_array_equal(lengths, want_lengths)
    # Every entry of the part once, in key order.
    keys = np.concatenate([m[0] for m in merged])
    expected = np.sort(np.concatenate([k[p == part] for p, k, _ in batches]))
    np.testing.assert_array_equal(keys, expected)


def test_byte_runs_read_as_rows_and_mixed_entries_are_refused(tmp_path):
  batches = _batches()
  byte_runs = _spill(tmp_path / "bytes", batches, False, 1 << 20)
  other = np.dtype([("a", "<u2", (4,))])
  with pytest.raises(ValueError, match=r"run-00000\.bin: entries of \{11\} bytes, not rows of 8"):
    list(spills.merge_part(byte_runs, 0, KEY_WIDTH, row_dtype=other))
  writer = spills.SpillWriter(str(tmp_path / "mixed"), PARTS, KEY_WIDTH, 1 << 20)
  parts, keys, rows = batches[0]
  writer.add_rows(parts, keys, rows)
  with pytest.raises(ValueError, match="byte strings or rows, not both"):
    writer.add(parts, keys, rows.tobytes(), np.full(len(rows), ROW.itemsize))


def test_rows_frame_as_the_arrays_do():
  config = mapper.CreationConfig(max_seq_length=16, max_predictions_per_seq=3)
  rng = np.random.default_rng(0)
  B = 6
  lengths = rng.integers(5, 17, B)
  ids = rng.integers(0, 30000, (B, 16)) * (np.arange(16) < lengths[:, None])
  pos = np.sort(rng.integers(1, 5, (B, 3)), 1)
  args = (ids, lengths, lengths // 2 - 1, pos, rng.integers(0, 30000, (B, 3)),
          np.full(B, 3), rng.integers(0, 2, B))
  encoder = records.ExampleEncoder(16, 3)
  rows = mapper.to_rows(mapper.row_dtype(config, 30522), *args)
  assert rows.dtype["input_ids"].base == np.dtype("<u2")
  assert mapper.frame(encoder, rows)[0] == encoder.frame_batch(*args)[0]
  big = mapper.row_dtype(config, 119547)  # Multilingual BERT's vocab: 4-byte ids.
  wide = (ids + 90000,) + args[1:]
  assert mapper.frame(encoder, mapper.to_rows(big, *wide))[0] == encoder.frame_batch(*wide)[0]
  with pytest.raises(ValueError, match="input_ids: value .* does not fit"):
    mapper.to_rows(mapper.row_dtype(config, 30522), *wide)
