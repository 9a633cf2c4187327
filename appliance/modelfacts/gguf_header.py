"""A bounded GGUF v2/v3 header parser.

The header of a GGUF file is attacker-controlled input (reliability-table row 6):
lengths and counts in it are checked against the bytes that remain in the file
and against fixed ceilings *before* anything is read or allocated, so a hostile
file is rejected with :class:`InvalidModelFile` in well under a second whatever
it claims. The file is memory-mapped read-only and parsed in place; only the
metadata values we need are decoded, everything else is skipped.

Layout (little endian): ``magic "GGUF"``, ``version u32``, ``tensor_count u64``,
``kv_count u64``, then ``kv_count`` pairs ``(key: string, type: u32, value)``,
then ``tensor_count`` infos ``(name: string, n_dims: u32, dims: u64[n_dims],
type: u32, offset: u64)``, then tensor data at ``general.alignment``.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from appliance.modelfacts.errors import InvalidModelFile

MAGIC = b"GGUF"
MAX_KV = 1 << 16
"""Most metadata pairs accepted (real files have < 100)."""
MAX_TENSORS = 1 << 17
"""Most tensors accepted (the largest MoE files have a few thousand)."""
MAX_KEY_LEN = 1024
MAX_NAME_LEN = 256
"""llama.cpp itself limits tensor names to 63 bytes."""
MAX_KEPT_STRING = 1 << 20
"""Longest string value decoded (other strings are skipped)."""
MAX_TEMPLATE_LEN = 16 << 20
"""Longest chat template decoded (longer ones are skipped, not kept)."""
MAX_STRING_ARRAY = 1 << 20
"""Most elements in one string array (vocabularies are < 300k)."""
MAX_TOTAL_STRINGS = 1 << 20
"""Most array strings in the whole header (tokens + merges: ~410k for Llama 3). Skipping one
string costs ~0.3 us, so this ceiling is what keeps the worst allowed header under a second."""
MAX_KEPT_ARRAY = 4096
"""Numeric arrays up to this length are kept (per-layer values)."""
MAX_DIMS = 4
MAX_ALIGNMENT = 1 << 20

# GGUF value types -> (struct code, size)
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("<B", 1),
    1: ("<b", 1),
    2: ("<H", 2),
    3: ("<h", 2),
    4: ("<I", 4),
    5: ("<i", 4),
    6: ("<f", 4),
    7: ("<?", 1),
    10: ("<Q", 8),
    11: ("<q", 8),
    12: ("<d", 8),
}
_STRING, _ARRAY = 8, 9

Scalar: TypeAlias = int | float | bool
MetaValue: TypeAlias = Scalar | str | tuple[Scalar, ...]
GGUFMetadata: TypeAlias = dict[str, MetaValue]
"""Kept header metadata: scalars, strings and short numeric arrays, by key."""
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's header entry."""

    name: str
    shape: tuple[int, ...]
    type: int
    offset: int
    n_elements: int
    n_bytes: int


@dataclass(frozen=True)
class GGUFHeader:
    """What the header says: version, kept metadata, tensor infos.

    ``metadata`` holds scalars, strings (up to the limits above) and short numeric
    arrays as tuples; for string arrays only their length is kept, under the
    key with ``#count`` appended (``tokenizer.ggml.tokens#count``).
    """

    version: int
    metadata: GGUFMetadata
    tensors: tuple[TensorInfo, ...]
    data_offset: int
    file_size: int


class _Cursor:
    """Reads little-endian values from a buffer, refusing to run past its end."""

    def __init__(self, buf: mmap.mmap, size: int):
        self.buf = buf
        self.size = size
        self.pos = 0
        self.strings_seen = 0

    def need(self, n: int, what: str) -> None:
        if n < 0 or n > self.size - self.pos:
            raise InvalidModelFile(f"GGUF {what} runs past the end of the file (needs {n} bytes, {self.size - self.pos} left)")

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v

    def scalar(self, vtype: int, what: str) -> Scalar:
        code, size = _SCALARS[vtype]
        self.need(size, what)
        (v,) = struct.unpack_from(code, self.buf, self.pos)
        self.pos += size
        return v

    def string(self, what: str, keep_limit: int) -> str | None:
        """Read a string; decode it when at most ``keep_limit`` bytes, else skip it."""
        n = self.u64(f"{what} length")
        self.need(n, what)
        start = self.pos
        self.pos += n
        if n > keep_limit:
            return None
        try:
            return bytes(self.buf[start : start + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidModelFile(f"GGUF {what} is not valid UTF-8") from None

    def skip_strings(self, count: int, what: str) -> None:
        self.strings_seen += count
        if self.strings_seen > MAX_TOTAL_STRINGS:
            raise InvalidModelFile(f"GGUF header holds more than {MAX_TOTAL_STRINGS} strings")
        buf, pos, size, unpack = self.buf, self.pos, self.size, _U64.unpack_from
        for _ in range(count):
            if size - pos < 8:
                raise InvalidModelFile(f"GGUF {what} runs past the end of the file")
            (n,) = unpack(buf, pos)
            pos += 8
            if n > size - pos:
                raise InvalidModelFile(f"GGUF {what} element length {n} is past the end of the file")
            pos += n
        self.pos = pos


def _read_value(cur: _Cursor, key: str, vtype: int) -> tuple[MetaValue | None, int | None]:
    """Read one metadata value; returns (kept value or None, string-array count or None)."""
    if vtype in _SCALARS:
        return cur.scalar(vtype, f"value of {key}"), None
    if vtype == _STRING:
        limit = MAX_TEMPLATE_LEN if key.startswith("tokenizer.chat_template") else MAX_KEPT_STRING
        return cur.string(f"value of {key}", limit), None
    if vtype != _ARRAY:
        raise InvalidModelFile(f"GGUF key {key} has unknown value type {vtype}")
    etype = cur.u32(f"array type of {key}")
    count = cur.u64(f"array length of {key}")
    if etype == _STRING:
        if count > MAX_STRING_ARRAY:
            raise InvalidModelFile(f"GGUF array {key} claims {count} strings (limit {MAX_STRING_ARRAY})")
        cur.need(count * 8, f"array {key}")
        cur.skip_strings(count, f"array {key}")
        return None, count
    if etype not in _SCALARS:
        raise InvalidModelFile(f"GGUF array {key} has unsupported element type {etype}")
    code, size = _SCALARS[etype]
    cur.need(count * size, f"array {key}")  # count is < 2**64: Python ints do not overflow
    start = cur.pos
    cur.pos += count * size
    if count <= MAX_KEPT_ARRAY:
        return tuple(v for (v,) in struct.iter_unpack(code, cur.buf[start : cur.pos])), None
    return None, None


def _tensor_info(cur: _Cursor, index: int) -> tuple[str, tuple[int, ...], int, int]:
    name = cur.string(f"tensor {index} name", MAX_NAME_LEN)
    if name is None:
        raise InvalidModelFile(f"GGUF tensor {index} name is longer than {MAX_NAME_LEN} bytes")
    n_dims = cur.u32(f"tensor {name} n_dims")
    if not 1 <= n_dims <= MAX_DIMS:
        raise InvalidModelFile(f"GGUF tensor {name} has {n_dims} dimensions (1..{MAX_DIMS} allowed)")
    shape = tuple(cur.u64(f"tensor {name} dims") for _ in range(n_dims))
    ttype = cur.u32(f"tensor {name} type")
    offset = cur.u64(f"tensor {name} offset")
    return name, shape, ttype, offset


def _sized(name: str, shape: tuple[int, ...], ttype: int, offset: int) -> TensorInfo:
    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
    except (ValueError, KeyError):
        raise InvalidModelFile(f"GGUF tensor {name} has unknown type {ttype}") from None
    n = 1
    for d in shape:
        if d == 0 or d >= 1 << 63:
            raise InvalidModelFile(f"GGUF tensor {name} has an invalid dimension {d}")
        n *= d
        if n >= 1 << 63:
            raise InvalidModelFile(f"GGUF tensor {name} dimensions overflow")
    if shape[0] % block:
        raise InvalidModelFile(f"GGUF tensor {name} row of {shape[0]} is not a multiple of block size {block}")
    return TensorInfo(name, shape, ttype, offset, n, n // block * type_size)


def read_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """Parse and validate the header of the GGUF file at ``path``.

    Raises :class:`InvalidModelFile` for anything malformed: bad magic, version
    other than 2 or 3, counts or lengths past the file size or over the ceilings
    above, unknown types, tensors whose data lies outside the file.
    """
    p = Path(path)
    try:
        with p.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < 24:
                raise InvalidModelFile("file is too small to be a GGUF model")
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(buf, size)
    except OSError as exc:
        raise InvalidModelFile(f"cannot read model file {p.name}: {exc.strerror or exc}") from None


def _parse(buf: mmap.mmap, size: int) -> GGUFHeader:
    cur = _Cursor(buf, size)
    if buf[:4] != MAGIC:
        raise InvalidModelFile("not a GGUF file (bad magic)")
    cur.pos = 4
    version = cur.u32("version")
    if version not in (2, 3):
        raise InvalidModelFile(f"GGUF version {version} is not supported (2 and 3 are)")
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("metadata count")
    if n_kv > MAX_KV:
        raise InvalidModelFile(f"GGUF claims {n_kv} metadata pairs (limit {MAX_KV})")
    if n_tensors > MAX_TENSORS:
        raise InvalidModelFile(f"GGUF claims {n_tensors} tensors (limit {MAX_TENSORS})")
    # Each pair needs >= 12 bytes (key length + type), each tensor info >= 24.
    cur.need(n_kv * 12 + n_tensors * 24, "metadata and tensor table")

    meta: GGUFMetadata = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key {i}", MAX_KEY_LEN)
        if key is None:
            raise InvalidModelFile(f"GGUF metadata key {i} is longer than {MAX_KEY_LEN} bytes")
        value, str_count = _read_value(cur, key, cur.u32(f"type of {key}"))
        if value is not None:
            meta[key] = value
        if str_count is not None:
            meta[key + "#count"] = str_count

    raw = [_tensor_info(cur, i) for i in range(n_tensors)]
    alignment = meta.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment > MAX_ALIGNMENT or alignment & (alignment - 1):
        raise InvalidModelFile(f"GGUF alignment {alignment!r} is not a power of two up to {MAX_ALIGNMENT}")
    data_offset = -(-cur.pos // alignment) * alignment
    tensors = []
    for name, shape, ttype, offset in raw:
        info = _sized(name, shape, ttype, offset)
        if offset % alignment or data_offset + offset + info.n_bytes > size:
            raise InvalidModelFile(f"GGUF tensor {name} data lies outside the file or is misaligned")
        tensors.append(info)
    return GGUFHeader(version, meta, tuple(tensors), data_offset, size)
