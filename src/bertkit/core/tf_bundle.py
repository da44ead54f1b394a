"""TensorFlow's checkpoint format ("tensor bundle"), read and written without TensorFlow.

A checkpoint `PREFIX` is `PREFIX.index` plus `PREFIX.data-00000-of-0000N`:

- the index is an SSTable (LevelDB's table format): sorted `key -> value` records in blocks,
  each block followed by a 1-byte compression type and a masked CRC32C; a footer at the end points
  to the index block, whose values point to the data blocks;
- the key "" holds a `BundleHeaderProto` (number of shards, endianness); every other key is a
  variable name whose value is a `BundleEntryProto`: dtype, shape, shard, byte offset, byte size,
  and the masked CRC32C of the tensor's bytes;
- a data file holds the tensors' raw little-endian bytes back to back.

Only the few protobuf fields involved are decoded, with a minimal wire-format reader.
"""

from __future__ import annotations

import functools
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertkit._io import atomic_write_bytes

# --------------------------------------------------------------------------------- CRC32C
_POLY = 0x82F63B78  # Castagnoli, reflected


def _make_table() -> np.ndarray:
    table = np.zeros(256, dtype=np.uint32)
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ _POLY if crc & 1 else crc >> 1
        table[byte] = crc
    return table


_TABLE = _make_table()
_TABLE_LIST = [int(x) for x in _TABLE]


def _crc_scalar(register: int, data: bytes | memoryview) -> int:
    table = _TABLE_LIST
    for byte in bytes(data):
        register = table[(register ^ byte) & 0xFF] ^ (register >> 8)
    return register


def _shift_tables(length: int) -> list[np.ndarray]:
    """Tables for the linear map "feed `length` zero bytes into the CRC register" (GF(2))."""
    basis = (np.uint32(1) << np.arange(32, dtype=np.uint32)).astype(np.uint32)
    for _ in range(length):
        basis = _TABLE[basis & 0xFF] ^ (basis >> np.uint32(8))
    tables = []
    for lane in range(4):
        values = np.arange(256, dtype=np.uint32)
        table = np.zeros(256, dtype=np.uint32)
        for bit in range(8):
            table ^= np.where((values >> bit) & 1, basis[8 * lane + bit], 0).astype(np.uint32)
        tables.append(table)
    return tables


_CHUNK = 4096


@functools.cache
def _shift_chunk() -> list[list[int]]:
    return [t.tolist() for t in _shift_tables(_CHUNK)]


def crc32c(data: bytes | memoryview | np.ndarray) -> int:
    """CRC-32C (Castagnoli) of a buffer, as TensorFlow and LevelDB compute it.

    Large buffers are cut into equal chunks whose CRCs numpy computes side by side, then chained
    through the CRC's linearity.

    >>> hex(crc32c(b"123456789"))
    '0xe3069283'
    """
    buffer = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)  # type: ignore[arg-type]
    register = 0xFFFFFFFF
    chunks = len(buffer) // _CHUNK
    if chunks >= 16:  # below that the plain loop is faster
        body = buffer[: chunks * _CHUNK].reshape(chunks, _CHUNK).T.copy()  # (L, N)
        partial = np.zeros(chunks, dtype=np.uint32)  # CRC of each chunk from a zero register
        for row in body:
            partial = _TABLE[(partial ^ row) & 0xFF] ^ (partial >> np.uint32(8))
        t0, t1, t2, t3 = _shift_chunk()
        for value in partial.tolist():
            register = (
                t0[register & 0xFF]
                ^ t1[(register >> 8) & 0xFF]
                ^ t2[(register >> 16) & 0xFF]
                ^ t3[register >> 24]
                ^ value
            )
        buffer = buffer[chunks * _CHUNK :]
    register = _crc_scalar(register, buffer.tobytes())
    return register ^ 0xFFFFFFFF


def mask_crc(crc: int) -> int:
    """LevelDB/TF store CRCs "masked" so that CRCs of CRC-bearing data stay well spread."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


# --------------------------------------------------------------------------------- protobuf
def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _fields(message: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) pairs of a protobuf message; varints as int, others as bytes."""
    out: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(message):
        value: int | bytes
        key, pos = _varint(message, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(message, pos)
        elif wire == 1:
            value, pos = message[pos : pos + 8], pos + 8
        elif wire == 2:
            length, pos = _varint(message, pos)
            value, pos = message[pos : pos + length], pos + length
        elif wire == 5:
            value, pos = message[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        out.append((number, value))
    return out


def _varint_field(value: int | bytes) -> int:
    if not isinstance(value, int):
        raise ValueError("malformed checkpoint index: a length-delimited field where a number is")
    return value


def _bytes_field(value: int | bytes) -> bytes:
    if isinstance(value, int):
        raise ValueError("malformed checkpoint index: a number where bytes are")
    return value


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, int):
        return _encode_varint(number << 3) + _encode_varint(value)
    return _encode_varint(number << 3 | 2) + _encode_varint(len(value)) + value


# TensorFlow DataType enum -> numpy dtype (the ones a BERT checkpoint can hold).
_DTYPES: dict[int, np.dtype] = {
    1: np.dtype("<f4"),  # DT_FLOAT
    2: np.dtype("<f8"),  # DT_DOUBLE
    3: np.dtype("<i4"),  # DT_INT32
    4: np.dtype("u1"),  # DT_UINT8
    5: np.dtype("<i2"),  # DT_INT16
    6: np.dtype("i1"),  # DT_INT8
    9: np.dtype("<i8"),  # DT_INT64
    10: np.dtype("?"),  # DT_BOOL
    19: np.dtype("<f2"),  # DT_HALF
}
_DT_BFLOAT16 = 14
_DTYPE_CODES = {v: k for k, v in _DTYPES.items()}


@dataclass
class BundleEntry:
    dtype: int
    shape: tuple[int, ...]
    shard_id: int
    offset: int
    size: int
    crc32c: int | None  # masked


def _parse_entry(value: bytes) -> BundleEntry:
    dtype, shard, offset, size = 0, 0, 0, 0
    shape: list[int] = []
    crc: int | None = None
    for number, field in _fields(value):
        if number == 1:
            dtype = _varint_field(field)
        elif number == 2:
            for dim_number, dim in _fields(_bytes_field(field)):  # TensorShapeProto
                if dim_number == 2:
                    sizes = (v for n, v in _fields(_bytes_field(dim)) if n == 1)
                    shape.append(_varint_field(next(sizes, 0)))
        elif number == 3:
            shard = _varint_field(field)
        elif number == 4:
            offset = _varint_field(field)
        elif number == 5:
            size = _varint_field(field)
        elif number == 6:
            crc = struct.unpack("<I", _bytes_field(field))[0]
        elif number == 7:
            raise ValueError("partitioned (sliced) variables are not supported")
    return BundleEntry(dtype, tuple(shape), shard, offset, size, crc)


def _encode_entry(entry: BundleEntry) -> bytes:
    shape = b"".join(_field(2, _field(1, d) if d else b"") for d in entry.shape)
    out = _field(1, entry.dtype) + _field(2, shape)
    if entry.shard_id:
        out += _field(3, entry.shard_id)
    if entry.offset:
        out += _field(4, entry.offset)
    out += _field(5, entry.size)
    out += _encode_varint(6 << 3 | 5) + struct.pack("<I", entry.crc32c or 0)
    return out


# --------------------------------------------------------------------------------- SSTable
_MAGIC = 0xDB4775248B80FB57
_FOOTER_LEN = 48


def _read_block(data: bytes, offset: int, size: int, path: Path) -> bytes:
    end = offset + size
    if end + 5 > len(data):
        raise ValueError(f"{path}: truncated (a block ends at byte {end + 5} of {len(data)})")
    contents = data[offset:end]
    kind = data[end]
    stored = struct.unpack("<I", data[end + 1 : end + 5])[0]
    if mask_crc(crc32c(data[offset : end + 1])) != stored:
        raise ValueError(f"{path}: corrupt (checksum mismatch in the block at byte {offset})")
    if kind != 0:
        raise ValueError(f"{path}: compressed SSTable blocks (type {kind}) are not supported")
    return contents


def _block_entries(block: bytes) -> list[tuple[bytes, bytes]]:
    (restarts,) = struct.unpack("<I", block[-4:])
    limit = len(block) - 4 - 4 * restarts
    entries, pos, key = [], 0, b""
    while pos < limit:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        value_len, pos = _varint(block, pos)
        key = key[:shared] + block[pos : pos + unshared]
        pos += unshared
        entries.append((key, block[pos : pos + value_len]))
        pos += value_len
    return entries


def read_sstable(path: Path) -> list[tuple[bytes, bytes]]:
    data = path.read_bytes()
    if len(data) < _FOOTER_LEN:
        raise ValueError(f"{path}: truncated (only {len(data)} bytes, no SSTable footer)")
    footer = data[-_FOOTER_LEN:]
    if struct.unpack("<Q", footer[-8:])[0] != _MAGIC:
        raise ValueError(f"{path}: not a TensorFlow checkpoint index (bad SSTable magic number)")
    pos = 0
    _, pos = _varint(footer, pos)  # metaindex offset
    _, pos = _varint(footer, pos)  # metaindex size
    index_offset, pos = _varint(footer, pos)
    index_size, pos = _varint(footer, pos)
    records = []
    for _, handle in _block_entries(_read_block(data, index_offset, index_size, path)):
        offset, p = _varint(handle, 0)
        size, _ = _varint(handle, p)
        records.extend(_block_entries(_read_block(data, offset, size, path)))
    return records


def _build_block(entries: list[tuple[bytes, bytes]]) -> bytes:
    # Restart at every entry (no key prefix sharing): simplest valid layout.
    body, restarts = bytearray(), []
    for key, value in entries:
        restarts.append(len(body))
        body += _encode_varint(0) + _encode_varint(len(key)) + _encode_varint(len(value))
        body += key + value
    if not restarts:
        restarts = [0]
    body += b"".join(struct.pack("<I", r) for r in restarts) + struct.pack("<I", len(restarts))
    return bytes(body)


def _append_block(out: bytearray, block: bytes) -> bytes:
    handle = _encode_varint(len(out)) + _encode_varint(len(block))
    out += block + b"\x00" + struct.pack("<I", mask_crc(crc32c(block + b"\x00")))
    return handle


def write_sstable(records: list[tuple[bytes, bytes]], block_size: int = 4096) -> bytes:
    records = sorted(records)
    out = bytearray()
    index_entries, current, current_size = [], [], 0
    for key, value in records:
        current.append((key, value))
        current_size += len(key) + len(value) + 8
        if current_size >= block_size:
            index_entries.append((current[-1][0], _append_block(out, _build_block(current))))
            current, current_size = [], 0
    if current:
        index_entries.append((current[-1][0], _append_block(out, _build_block(current))))
    meta_handle = _append_block(out, _build_block([]))
    index_handle = _append_block(out, _build_block(index_entries))
    footer = meta_handle + index_handle
    footer += b"\x00" * (40 - len(footer)) + struct.pack("<Q", _MAGIC)
    return bytes(out + footer)


# --------------------------------------------------------------------------------- bundle
def bundle_prefix(path: str | os.PathLike) -> Path:
    """`dir` (with one `*.index`), `dir/name.index` or `dir/name` -> the checkpoint prefix."""
    path = Path(path)
    if path.is_dir():
        indexes = sorted(path.glob("*.index"))
        if len(indexes) != 1:
            raise FileNotFoundError(
                f"{path}: expected one TF checkpoint *.index file, found {len(indexes)}"
            )
        return indexes[0].with_suffix("")
    if path.suffix == ".index":
        return path.with_suffix("")
    return path


def read_bundle(
    prefix: str | os.PathLike, *, skip=lambda name: False, verify: bool = True
) -> dict[str, np.ndarray]:
    """All tensors of a TF checkpoint as numpy arrays (copies), except those `skip(name)` drops.

    Raises ValueError naming the file for a truncated or corrupt index or data file (checksums
    are verified unless `verify=False`).
    """
    prefix = Path(prefix)
    index_path = Path(f"{prefix}.index")
    if not index_path.exists():
        raise FileNotFoundError(f"{index_path}: TF checkpoint index not found")
    records = read_sstable(index_path)
    num_shards = 1
    entries: dict[str, BundleEntry] = {}
    for key, value in records:
        if key == b"":
            for number, field in _fields(value):
                if number == 1:
                    num_shards = int(field)
                elif number == 2 and field != 0:
                    raise ValueError(f"{index_path}: big-endian checkpoints are not supported")
            continue
        name = key.decode("utf-8")
        try:
            entries[name] = _parse_entry(value)
        except ValueError as err:
            raise ValueError(f"{index_path}: variable {name!r}: {err}") from None

    shards: dict[int, np.memmap] = {}
    # Every variable's extent is in the index: a truncated data file is caught even where the
    # lost bytes belong to variables we skip (optimiser slots at the end, typically).
    needed: dict[int, tuple[int, str]] = {}
    for name, entry in entries.items():
        end = entry.offset + entry.size
        if end > needed.get(entry.shard_id, (0, ""))[0]:
            needed[entry.shard_id] = (end, name)
    for shard_id, (end, name) in needed.items():
        data_path = Path(f"{prefix}.data-{shard_id:05d}-of-{num_shards:05d}")
        if not data_path.exists():
            raise FileNotFoundError(f"{data_path}: TF checkpoint data file not found")
        size = data_path.stat().st_size
        if size < end:
            raise ValueError(
                f"{data_path}: truncated: variable {name!r} ends at byte {end} but the file has "
                f"{size} bytes"
            )
    tensors: dict[str, np.ndarray] = {}
    for name, entry in entries.items():
        if skip(name):
            continue
        dtype: np.dtype
        if entry.dtype == _DT_BFLOAT16:
            dtype = np.dtype("<u2")  # converted by the caller via torch
        elif entry.dtype in _DTYPES:
            dtype = _DTYPES[entry.dtype]
        else:
            raise ValueError(f"{index_path}: variable {name!r} has unsupported dtype {entry.dtype}")
        data_path = Path(f"{prefix}.data-{entry.shard_id:05d}-of-{num_shards:05d}")
        if entry.shard_id not in shards:
            shards[entry.shard_id] = np.memmap(data_path, dtype=np.uint8, mode="r")
        shard = shards[entry.shard_id]
        expected = int(np.prod(entry.shape, dtype=np.int64)) * dtype.itemsize
        if entry.size != expected:
            raise ValueError(
                f"{index_path}: variable {name!r} has {entry.size} bytes, expected {expected} for "
                f"shape {entry.shape}"
            )
        raw = shard[entry.offset : entry.offset + entry.size]
        if verify and entry.crc32c is not None and mask_crc(crc32c(raw)) != entry.crc32c:
            raise ValueError(f"{data_path}: corrupt: checksum mismatch for variable {name!r}")
        array = np.array(raw).view(dtype).reshape(entry.shape)
        tensors[name] = array if entry.dtype != _DT_BFLOAT16 else _BFloat16(array)
    return tensors


class _BFloat16(np.ndarray):
    """Marks raw bfloat16 bits (uint16) read from a bundle."""

    def __new__(cls, bits: np.ndarray):
        return np.asarray(bits).view(cls)


def write_bundle(prefix: str | os.PathLike, tensors: dict[str, np.ndarray]) -> None:
    """Write a single-shard TF checkpoint (`prefix.index`, `prefix.data-00000-of-00001`) that
    TensorFlow's `tf.train.load_checkpoint` reads; each file is written atomically."""
    prefix = Path(prefix)
    data = bytearray()
    records = [(b"", _field(1, 1) + _field(3, _field(1, 1)))]  # 1 shard, little-endian, v1
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
        if dtype not in _DTYPE_CODES:
            raise ValueError(f"variable {name!r}: dtype {array.dtype} cannot be written")
        raw = array.astype(dtype, copy=False).tobytes()
        entry = BundleEntry(
            _DTYPE_CODES[dtype], tuple(array.shape), 0, len(data), len(raw), mask_crc(crc32c(raw))
        )
        data += raw
        records.append((name.encode("utf-8"), _encode_entry(entry)))
    atomic_write_bytes(f"{prefix}.data-00000-of-00001", bytes(data))
    atomic_write_bytes(f"{prefix}.index", write_sstable(records))
