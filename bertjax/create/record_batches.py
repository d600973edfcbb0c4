"""Masked batches -> TFRecord frames of serialised Examples, in numpy.

The creation driver's fast path: `FrameEncoder.encode` turns an
`instance_batches.MaskedBatch` into the TFRecord frames (length, masked
crc32c of the length, Example bytes, masked crc32c of the bytes) of every
row, back to back, as `records.frame(records.ExampleEncoder.encode(...))`
would, byte for byte.

Every frame is a row of fields of known widths: the frame header (a table
lookup by the record's size), the Example's headers (lookups by payload
size), the varints of the ids (a lookup per id), the constant runs of the
mask, weights, label and segment features, and the crc. The rows are laid
out as one padded byte matrix with a mask of the bytes in use, and the
frames are the used bytes in row order; only the crc of each record's bytes
is computed one record at a time (google_crc32c).
"""

import google_crc32c
import numpy as np

from bertjax.create import records
from bertjax.records import tfrecord

_HEADER = 12  # uint64 length + masked crc of it.
_FOOTER = 4  # masked crc of the data.


def _table(rows: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
  """Byte strings as a zero-padded uint8 matrix and their lengths."""
  width = max(map(len, rows))
  out = np.zeros((len(rows), width), np.uint8)
  for i, r in enumerate(rows):
    out[i, :len(r)] = np.frombuffer(r, np.uint8)
  return out, np.fromiter(map(len, rows), np.int64, len(rows))


def _masked_crc(crc: np.ndarray) -> np.ndarray:
  """tfrecord.masked_crc32c's masking, for an array of crcs."""
  crc = crc.astype(np.uint32)
  return (((crc >> np.uint32(15)) | (crc << np.uint32(17)))
          + np.uint32(tfrecord.MASK_DELTA)).astype("<u4")


class FramedBatch:
  """Frames of a batch's rows back to back; frame i is blob[starts[i]:ends[i]]."""

  def __init__(self, blob: bytes, lengths: np.ndarray):
    self.blob = blob
    self.lengths = lengths
    self.ends = np.cumsum(lengths)
    self.starts = self.ends - lengths

  def __len__(self):
    return len(self.lengths)

  def records(self) -> list[bytes]:
    """The Example bytes of every row (without the frame)."""
    blob = self.blob
    return [blob[a + _HEADER:b - _FOOTER]
            for a, b in zip(self.starts.tolist(), self.ends.tolist())]


class FrameEncoder:
  """Encodes `MaskedBatch` rows as TFRecord frames (see the module docstring)."""

  def __init__(self, encoder: records.ExampleEncoder):
    self.encoder = encoder
    L, P = encoder.max_seq_length, encoder.max_predictions_per_seq
    self._L, self._P = L, P
    # Each id's varint bytes and a mask of the bytes in use, as one word
    # per id (2, 4 or 8 bytes), so that both are single-element lookups.
    varints, varint_len = _table(encoder._table)  # pylint: disable=protected-access
    width = varints.shape[1]
    word = next(w for w in (2, 4, 8) if w >= width)
    padded = np.zeros((len(varints), word), np.uint8)
    padded[:, :width] = varints
    self._varint_word = padded.view(f"<u{word}").ravel()
    self._varint_used = (np.arange(word) < varint_len[:, None]).astype(
        np.uint8).view(f"<u{word}").ravel()
    self._varint_len = varint_len
    head = encoder._int_head  # pylint: disable=protected-access
    self._heads = {name: _table([head(name, n) for n in range(count * width + 1)])
                   for name, count in (("input_ids", L), ("masked_lm_ids", P),
                                       ("masked_lm_positions", P))}
    self._mask = _table(encoder._mask)[0]  # pylint: disable=protected-access
    self._weights = _table(encoder._weights)[0]  # pylint: disable=protected-access
    self._labels = _table(encoder._labels)[0]  # pylint: disable=protected-access
    self._segment_head = np.frombuffer(encoder._segment_head, np.uint8)  # pylint: disable=protected-access
    # The largest body: every payload at its widest.
    fixed = (self._mask.shape[1] + self._weights.shape[1]
             + self._labels.shape[1] + len(self._segment_head) + L)
    max_body = fixed + sum(t[0].shape[1] + len(t[0]) - 1
                           for t in self._heads.values())
    self._size = _table([records.varint(n) for n in range(max_body + 1)])
    max_data = 1 + self._size[0].shape[1] + max_body
    self._frame_head = _table([records.frame_header(n)
                               for n in range(max_data + 1)])[0]

  def _varint_block(self, values_BxN: np.ndarray):
    """(varint bytes, bytes in use, bytes per row) of rows of ids."""
    if values_BxN.size and (values_BxN.min() < 0
                            or values_BxN.max() >= len(self._varint_word)):
      raise ValueError(f"ids must be in [0, {len(self._varint_word)})")
    B = len(values_BxN)
    block = self._varint_word[values_BxN].view(np.uint8).reshape(B, -1)
    used = self._varint_used[values_BxN].view(bool).reshape(B, -1)
    return block, used, self._varint_len[values_BxN].sum(axis=1)

  def encode(self, batch) -> FramedBatch:
    """The frames of every row of an `instance_batches.MaskedBatch`."""
    L, P = self._L, self._P
    if (batch.input_ids_BxL.shape[1] != L
        or batch.masked_lm_positions_BxP.shape[1] != P):
      raise ValueError("batch shapes do not match max_seq_length / "
                       "max_predictions_per_seq")
    B = len(batch)
    n_B, a_B = batch.lengths_B, batch.num_a_B
    col = np.arange(L)
    seg = ((col >= (a_B + 2)[:, None]) & (col < n_B[:, None])).astype(np.uint8)
    # Body fields in order, as (bytes_BxW, used_BxW or None for all).
    fields = []
    body = np.zeros(B, np.int64)

    def payload(name, values):
      block, used, nbytes = self._varint_block(values)
      heads, head_len = self._heads[name]
      fields.append((heads[nbytes],
                     np.arange(heads.shape[1]) < head_len[nbytes][:, None]))
      fields.append((block, used))
      return head_len[nbytes] + nbytes

    def constant(table, rows):
      fields.append((table[rows], None))
      return table.shape[1]

    body += payload("input_ids", batch.input_ids_BxL)
    body += constant(self._mask, n_B)
    body += payload("masked_lm_ids", batch.masked_lm_ids_BxP)
    body += payload("masked_lm_positions", batch.masked_lm_positions_BxP)
    body += constant(self._weights, batch.num_predictions_B)
    body += constant(self._labels, batch.is_random_next_B.astype(np.int64))
    fields.append((np.broadcast_to(self._segment_head,
                                   (B, len(self._segment_head))), None))
    fields.append((seg, None))
    body += len(self._segment_head) + L
    size_len = self._size[1][body]
    data_len = 1 + size_len + body
    sizes = self._size[0]
    parts = [(self._frame_head[data_len], None),
             (np.full((B, 1), 0x0A, np.uint8), None),
             (sizes[body], np.arange(sizes.shape[1]) < size_len[:, None]),
             *fields,
             (np.zeros((B, _FOOTER), np.uint8), None)]
    matrix = np.concatenate([p for p, _ in parts], axis=1)
    used = np.concatenate([np.ones(p.shape, bool) if u is None else u
                           for p, u in parts], axis=1)
    out = np.compress(used.ravel(), matrix.ravel())  # Faster than matrix[used].
    lengths = data_len + _HEADER + _FOOTER
    ends = np.cumsum(lengths)
    starts = ends - lengths
    blob = out.tobytes()
    crc = np.fromiter(
        (google_crc32c.value(blob[a + _HEADER:b - _FOOTER])
         for a, b in zip(starts.tolist(), ends.tolist())), np.uint32, B)
    out[(ends - _FOOTER)[:, None] + np.arange(_FOOTER)] = (
        _masked_crc(crc).view(np.uint8).reshape(B, _FOOTER))
    return FramedBatch(out.tobytes(), lengths)
