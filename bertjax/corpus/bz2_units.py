"""bz2 files read from any byte: multistream files by stream, others by block.

A worker that reads a byte range [start, end) of a compressed dump begins at
the first unit that starts in it and yields each unit's decompressed bytes
with the unit's stored offset, reading on past `end` for as long as its
caller asks (to finish the page it began). Units are
  * streams, in multistream files (Wikimedia's `*-multistream.xml.bz2`:
    bz2 streams of 100 pages each, concatenated): a stream starts at a
    byte, with "BZh", its level and the first block's magic;
  * blocks, in single-stream files (`*-pages-articles.xml.bz2`): a block
    starts at any bit, with the 48-bit magic 0x314159265359, and ends where
    the next block or the end-of-stream mark (0x177245385090) starts. A
    block is decompressed alone as a stream of its own: a header, the block's
    bits, the end mark and, as the stream's CRC, the block's own (the CRC of
    a one-block stream), as parallel bzip2 tools do.
A unit's offset is the byte that holds its first bit, so every worker agrees
on which units are whose. A block magic can occur by chance inside
compressed data (about once in 30 GB); a block that does not decompress is
joined to the next one and tried again.

Errors name the file and the offset: a truncated file (no end-of-stream
mark after the last block, or a stream that stops), or corrupt data.
"""

import bz2
from typing import IO, Iterator

_READ = 4 << 20
_BLOCK_MAGIC = 0x314159265359
_EOS_MAGIC = 0x177245385090
_STREAM_START = b"1AY&SY"  # A stream's first block magic, after b"BZh" + level.
# How many candidate ends a block may be joined across (chance magics).
_MAX_JOINS = 4


def _patterns(magic: int) -> list[tuple[int, bytes, int, int]]:
  """(shift, whole bytes, first-byte mask, last-byte mask) to find a 48-bit
  magic starting at bit `shift` of a byte with bytes.find."""
  out = []
  for s in range(8):
    window = magic << (8 - s) if s else magic  # 56 bits for s > 0.
    if s == 0:
      out.append((0, magic.to_bytes(6, "big"), 0, 0))
    else:
      middle = ((window >> 8) & ((1 << 40) - 1)).to_bytes(5, "big")
      out.append((s, middle, window >> 48, window & 0xFF))
  return out


_BLOCK_PATTERNS = _patterns(_BLOCK_MAGIC)
_EOS_PATTERNS = _patterns(_EOS_MAGIC)


def _find_bits(buf: bytes, patterns, lo: int, hi: int) -> list[int]:
  """Bit positions p, lo <= p < hi, where the magic starts (whole in buf)."""
  found = []
  for s, middle, first, last in patterns:
    offset = 0 if s == 0 else 1  # Where `middle` sits after the start byte.
    i = max(0, lo // 8 - 1) + offset
    while True:
      j = buf.find(middle, i)
      if j < 0:
        break
      i = j + 1
      start = j - offset
      if start < 0:
        continue
      if s and (start + 6 >= len(buf) or buf[start] & (0xFF >> s) != first
                or buf[start + 6] >> (8 - s) != last >> (8 - s)):
        continue
      bit = start * 8 + s
      if lo <= bit < hi:
        found.append(bit)
  return sorted(found)


def _bits(buf: bytes, b0: int, b1: int) -> int:
  """The bits [b0, b1) of buf as an integer."""
  a, z = b0 // 8, (b1 + 7) // 8
  value = int.from_bytes(buf[a:z], "big") >> ((z * 8) - b1)
  return value & ((1 << (b1 - b0)) - 1)


def decompress_block(buf: bytes, b0: int, b1: int) -> bytes:
  """The decompressed bytes of the block whose bits are [b0, b1) of buf;
  raises OSError if they are not one whole block."""
  n = b1 - b0
  crc = _bits(buf, b0 + 48, b0 + 80)
  value = (_bits(buf, b0, b1) << 80) | (_EOS_MAGIC << 32) | crc
  pad = (-(n + 80)) % 8
  stream = b"BZh9" + (value << pad).to_bytes((n + 80 + pad) // 8, "big")
  d = bz2.BZ2Decompressor()
  out = d.decompress(stream)
  if not d.eof:
    raise OSError("block ends early")
  return out


def is_multistream(f: IO[bytes], probe_bytes: int = 8 << 20) -> bool:
  """True if the file's first bz2 stream ends within `probe_bytes` and
  another starts after it (Wikimedia's multistream dumps put the siteinfo
  header alone in the first stream)."""
  f.seek(0)
  d = bz2.BZ2Decompressor()
  read = 0
  while read < probe_bytes and not d.eof:
    chunk = f.read(1 << 20)
    if not chunk:
      return False
    read += len(chunk)
    d.decompress(chunk, max_length=1 << 20)
    while not d.eof and d.needs_input is False:
      d.decompress(b"", max_length=1 << 20)
  if not d.eof:
    return False
  rest = d.unused_data + f.read(16)
  return rest.startswith(b"BZh") and rest[4:10] == _STREAM_START


def iter_streams(f: IO[bytes], start: int, path: str
                 ) -> Iterator[tuple[int, bytes]]:
  """(stream offset, decompressed bytes) of the streams from the first that
  starts at or after `start`, in pieces, for as long as the caller reads."""
  pos = _first_stream(f, start)
  if pos < 0:
    return
  f.seek(pos)
  pending = b""
  while True:
    d = bz2.BZ2Decompressor()
    stream_at = pos
    data = pending
    pending = b""
    while True:
      if not data:
        data = f.read(_READ)
        if not data:
          raise ValueError(f"{path}: truncated bz2 stream: the file ends "
                           f"inside the stream that starts at byte {stream_at}.")
      try:
        out = d.decompress(data)
      except (OSError, EOFError) as e:
        raise ValueError(f"{path}: corrupt bz2 data in the stream that starts "
                         f"at byte {stream_at} ({e}).") from e
      if out:
        yield stream_at, out
      if d.eof:
        pending = d.unused_data
        pos += len(data) - len(pending)
        break
      pos += len(data)
      data = b""
    pending = pending.lstrip(b"\0")  # Padding between streams, if any.
    if not pending:
      pending = f.read(_READ)
      if not pending:
        return
    if not pending.startswith(b"BZh"):
      raise ValueError(f"{path}: corrupt bz2 data at byte {pos}: not the "
                       "start of a stream.")


def _first_stream(f: IO[bytes], start: int) -> int:
  """The offset of the first stream that starts at or after `start`, -1 if
  none does."""
  if start == 0:
    return 0
  at = start
  while True:
    f.seek(at)
    buf = f.read(_READ + 9)
    if len(buf) < 10:
      return -1
    i = 0
    while True:
      j = buf.find(_STREAM_START, i)
      if j < 0 or j > _READ + 3:
        break
      if j >= 4 and buf[j - 4:j - 1] == b"BZh" and buf[j - 1:j] in b"123456789":
        return at + j - 4
      i = j + 1
    at += _READ


class _BitScanner:
  """A window of a file with the bit positions of every block magic
  (`starts`) and of every block magic or end mark (`ends`) in it."""

  def __init__(self, f: IO[bytes], start: int):
    self.f = f
    f.seek(start)
    self.base = start  # The file offset of buf[0].
    self.buf = b""
    self.eof = False
    self.starts: list[int] = []
    self.ends: list[int] = []

  def more(self, keep_bit: int) -> int:
    """Drops the bytes before bit `keep_bit` and reads on; returns the bits
    dropped (positions move down by as much)."""
    cut = keep_bit // 8
    data = self.f.read(_READ)
    self.eof = len(data) < _READ
    self.buf = self.buf[cut:] + data
    self.base += cut
    n = len(self.buf) * 8
    self.starts = _find_bits(self.buf, _BLOCK_PATTERNS, 0, n)
    self.ends = sorted(self.starts + _find_bits(self.buf, _EOS_PATTERNS, 0, n))
    return cut * 8


def iter_blocks(f: IO[bytes], start: int, path: str
                ) -> Iterator[tuple[int, bytes]]:
  """(block offset, decompressed bytes) of the blocks from the first that
  starts at or after `start`, for as long as the caller reads."""
  scan = _BitScanner(f, start)
  scan.more(0)
  at, first = 0, True  # The bit where the next block starts, at or after.
  while True:
    s = next((b for b in scan.starts if b >= at), None)
    if s is None:
      if scan.eof:
        return
      at -= scan.more(max(0, len(scan.buf) * 8 - 56))
      continue
    out, k = None, 0
    while out is None:
      ends = [e for e in scan.ends if e >= s + 80]
      if len(ends) <= k:
        if scan.eof:
          break
        dropped = scan.more(s)
        s, at = s - dropped, at - dropped
        continue
      try:
        out, end = decompress_block(scan.buf, s, ends[k]), ends[k]
      except (OSError, EOFError, ValueError):
        k += 1
        if k > _MAX_JOINS:
          break
    block_at = scan.base + s // 8
    if out is None:
      if not [e for e in scan.ends if e >= s + 80]:
        raise ValueError(f"{path}: truncated bz2 file: no end-of-stream mark "
                         f"after the block at byte {block_at}.")
      if first:  # A chance magic before the first whole block: skip it.
        at = s + 1
        continue
      raise ValueError(f"{path}: corrupt bz2 data in the block at byte "
                       f"{block_at}.")
    yield block_at, out
    first, at = False, end
