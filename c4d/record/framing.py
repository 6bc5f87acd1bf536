"""Trace framing (format 2): every batch the master writes is a frame that a reader can verify,
skip when damaged, and find again after damage.

    frame := SYNC (8 bytes) | u32 payload_bytes | u32 crc32c | payload (payload_bytes / 128 records)

All little-endian. The CRC32C (Castagnoli, the iSCSI/ext4 polynomial, through google-crc32c)
covers the length field and the payload, so a damaged length is caught like damaged records.
``SYNC`` starts with a non-ASCII byte and holds CR LF and ^Z, like PNG's signature, so text-mode
mangling is caught too.

Reading follows the lengths; at a frame that does not verify (bad sync, absurd length, CRC
mismatch) the reader records the damage and searches for the next ``SYNC``, where frames
verify again: one inserted byte or one flipped bit costs the frame it hit, not the rest of the
file. A last frame cut by the end of the file (a master killed mid-write) keeps its complete
records, unverified, and the cut is reported apart from damage. Bytes inside a payload can
imitate a frame only after damage, while searching; such a frame must still verify, and its
records still go through the edge validator.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import google_crc32c
import numpy as np

from c4d.record import schema

SYNC = b"\x89C4D\r\n\x1a\n"
_HEAD = struct.Struct("<8sII")
HEAD_BYTES = _HEAD.size  # 16
MAX_FRAME_BYTES = 1 << 27  # 1 Mi records: far above any batch the collector accepts


def crc32c(length_field: bytes, payload: bytes | np.ndarray) -> int:
    return google_crc32c.extend(google_crc32c.value(length_field), payload)


def encode(payload: bytes) -> bytes:
    """One frame around ``payload`` (whole records)."""
    n = struct.pack("<I", len(payload))
    return SYNC + n + struct.pack("<I", crc32c(n, payload)) + payload


@dataclass
class Scan:
    """What ``scan`` found in a body of frames."""

    records: np.ndarray  # schema.HEADER rows of every verified frame (and of a cut last frame), in order
    frames: int = 0  # verified frames
    damaged: list[tuple[int, int]] = field(default_factory=list)  # (offset in the body, bytes skipped)
    cut_records: int = 0  # complete records kept from a last frame cut short (not verified)
    truncated_bytes: int = 0  # bytes at the end that are not a whole record or frame header

    @property
    def damaged_bytes(self) -> int:
        return sum(n for _, n in self.damaged)


def scan(body: bytes) -> Scan:
    """Every record of ``body`` (the bytes after the trace header), skipping damaged frames."""
    sc = Scanner()
    parts = sc.feed(bytes(body), final=True)
    return sc.result(np.concatenate(parts).view(schema.HEADER) if parts else np.empty(0, schema.HEADER))


class Scanner:
    """``scan`` in pieces: feed the body as it is read, get each piece's verified records back.

    What it found so far (frames, damage, a cut at the end) accumulates; the last ``feed`` must
    say ``final=True``, and then the result equals ``scan`` of the whole body. A frame that runs
    past the bytes fed so far waits for the next piece (at most MAX_FRAME_BYTES are held)."""

    def __init__(self) -> None:
        self._buf = b""  # bytes not consumed yet
        self._base = 0  # body offset of _buf[0]
        self._open = False  # the last damage reached the end of a piece: a search still under way
        self.frames = 0
        self.damaged: list[tuple[int, int]] = []
        self.cut_records = 0
        self.truncated_bytes = 0

    def _damage(self, pos: int, n: int, open_: bool) -> None:
        at = self._base + pos
        if self._open and self.damaged and sum(self.damaged[-1]) == at:
            off, k = self.damaged[-1]
            self.damaged[-1] = (off, k + n)  # the same search, across two pieces
        else:
            self.damaged.append((at, n))
        self._open = open_

    def feed(self, piece: bytes, final: bool = False) -> list[np.ndarray]:
        """The records (``schema.HEADER``) of the frames completed by ``piece``: one array, or
        none. The frames' bytes are joined first and viewed as records once (a structured view
        per frame cost a trace of small batches more than its replay)."""
        data = self._buf + piece if self._buf else piece
        size = len(data)
        arr = np.frombuffer(data, dtype=np.uint8)
        parts: list[np.ndarray] = []  # each frame's record bytes
        pos = 0
        while pos < size:
            rest = size - pos
            if rest < HEAD_BYTES:
                if not final:
                    break
                k = min(rest, len(SYNC))
                if data[pos : pos + k] == SYNC[:k]:
                    self.truncated_bytes = rest  # a frame header cut short
                else:
                    self._damage(pos, rest, False)
                pos = size
                break
            sync, n, crc = _HEAD.unpack_from(data, pos)
            if sync == SYNC and n % schema.RECORD_SIZE == 0 and n <= MAX_FRAME_BYTES:
                start, end = pos + HEAD_BYTES, pos + HEAD_BYTES + n
                if end <= size:
                    if crc32c(data[pos + 8 : pos + 12], arr[start:end]) == crc:
                        parts.append(arr[start:end])
                        self.frames += 1
                        self._open = False
                        pos = end
                        continue
                elif not final:
                    break  # the rest of this frame is in the next piece
                elif data.find(SYNC, pos + 8) < 0:  # the file ends inside this frame: a cut, not damage
                    whole = (size - start) // schema.RECORD_SIZE * schema.RECORD_SIZE
                    parts.append(arr[start : start + whole])
                    self.cut_records = whole // schema.RECORD_SIZE
                    self.truncated_bytes = size - start - whole
                    pos = size
                    break
            nxt = data.find(SYNC, pos + 1)
            if nxt < 0 and not final:  # keep a tail that may hold the start of the next SYNC
                upto = max(pos + 1, size - (len(SYNC) - 1))
                self._damage(pos, upto - pos, True)
                pos = upto
                break
            skip = (size if nxt < 0 else nxt) - pos
            self._damage(pos, skip, False)
            pos += skip
        self._buf = data[pos:]
        self._base += pos
        parts = [p for p in parts if len(p)]
        return [np.concatenate(parts).view(schema.HEADER)] if parts else []

    def result(self, records: np.ndarray) -> Scan:
        return Scan(
            records=records,
            frames=self.frames,
            damaged=list(self.damaged),
            cut_records=self.cut_records,
            truncated_bytes=self.truncated_bytes,
        )
