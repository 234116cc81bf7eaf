"""Text records from local shards, read in order from any position: txt, jsonl(.gz), parquet.

A *source* (one language, one folder) is a sorted list of shard files. A record is a line of
a ``.txt`` file (at most :data:`MAX_RECORD_BYTES`; longer lines are read in pieces), the
``text_field`` of a JSONL line, or of a Parquet row. A :class:`RecordPos` says where a record
starts (file index, byte offset or row, and the record's index in the source), so a reader can
resume exactly there after a restart without reading what comes before (gzip excepted: it is
re-read up to the line). Nothing holds more than one record (or one Parquet batch) at a time.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from shardmeter.errors import UserInputError

SHARD_SUFFIXES = (".txt", ".jsonl", ".jsonl.gz", ".parquet")
MAX_RECORD_BYTES = 1 << 20  # a .txt line longer than this is read in pieces of this size
PARQUET_BATCH = 1024  # rows per Parquet read


@dataclass(frozen=True)
class RecordPos:
    """Where a record starts: shard ``file``, ``offset`` (bytes for txt/jsonl, line number
    for jsonl.gz, row for parquet), ``index`` (records before it in the source, this epoch)
    and ``epoch`` (full passes over the source before it)."""

    file: int = 0
    offset: int = 0
    index: int = 0
    epoch: int = 0

    def to_json(self) -> dict[str, int]:
        """JSON form (worker state)."""
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RecordPos:
        """Inverse of :meth:`to_json`."""
        return cls(int(d["file"]), int(d["offset"]), int(d["index"]), int(d["epoch"]))


def shard_suffix(path: Path) -> str | None:
    """The shard suffix of ``path`` (``.jsonl.gz`` before ``.jsonl``), or None."""
    name = path.name
    for suffix in (".jsonl.gz", ".jsonl", ".txt", ".parquet"):
        if name.endswith(suffix) and len(name) > len(suffix):
            return suffix
    return None


def check_shards(files: list[Path], source: str) -> None:
    """Every shard exists and is non-empty (an empty shard is a one-line error)."""
    if not files:
        raise UserInputError(f"data source {source!r}", "no files", "at least one shard")
    for f in files:
        if not f.is_file():
            raise UserInputError(f"data source {source!r}", str(f), "an existing file")
        if f.stat().st_size == 0:
            raise UserInputError(f"data source {source!r}", str(f), "a non-empty shard")


def _jsonl_text(line: bytes, path: Path, where: int, field: str) -> str | None:
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        raise UserInputError(
            f"{path.name} line/offset {where}", line[:40], "one JSON object per line"
        ) from None
    text = record.get(field) if isinstance(record, dict) else None
    if not isinstance(text, str):
        keys = sorted(record)[:5] if isinstance(record, dict) else []
        raise UserInputError(
            f"{path.name} line/offset {where}",
            f"fields {keys}",
            f"a string field {field!r} (set data.text_field)",
        )
    return text + "\n"


def _txt_records(path: Path, offset: int) -> Iterator[tuple[int, str]]:
    with path.open("rb") as fh:
        fh.seek(offset)
        while True:
            start = fh.tell()
            raw = fh.readline(MAX_RECORD_BYTES)
            if not raw:
                return
            if not raw.endswith(b"\n") and len(raw) == MAX_RECORD_BYTES:
                keep = _utf8_boundary(raw)
                fh.seek(start + keep)
                raw = raw[:keep]
            try:
                yield start, raw.decode("utf-8")
            except UnicodeDecodeError:
                raise UserInputError("data", f"{path} at byte {start}", "UTF-8 text") from None


def _utf8_boundary(raw: bytes) -> int:
    """Length of ``raw`` without a trailing, incomplete UTF-8 character."""
    for back in range(1, min(4, len(raw)) + 1):
        byte = raw[-back]
        if byte & 0xC0 != 0x80:  # a lead byte (or ASCII): is its character complete?
            need = 1 if byte < 0x80 else 2 if byte >> 5 == 6 else 3 if byte >> 4 == 14 else 4
            return len(raw) if need <= back else len(raw) - back
    return len(raw)


def _jsonl_records(path: Path, offset: int, field: str) -> Iterator[tuple[int, str]]:
    with path.open("rb") as fh:
        fh.seek(offset)
        while True:
            start = fh.tell()
            line = fh.readline()
            if not line:
                return
            text = _jsonl_text(line, path, start, field)
            if text is not None:
                yield start, text


def _gz_records(path: Path, line_no: int, field: str) -> Iterator[tuple[int, str]]:
    try:
        with gzip.open(path, "rb") as fh:
            for i, line in enumerate(io.BufferedReader(fh)):
                if i < line_no:
                    continue
                text = _jsonl_text(line, path, i, field)
                if text is not None:
                    yield i, text
    except (OSError, EOFError) as exc:
        raise UserInputError("data", str(path), f"a readable gzip file ({exc})") from None


def _parquet_records(path: Path, row: int, field: str) -> Iterator[tuple[int, str]]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises its own error types
        raise UserInputError("data", str(path), f"a Parquet file ({exc})") from None
    names = pf.schema_arrow.names
    if field not in names:
        raise UserInputError(
            f"{path.name}", f"columns {names[:5]}", f"a text column {field!r} (set data.text_field)"
        )
    first_group, skip = 0, row
    meta = pf.metadata
    while first_group < meta.num_row_groups and skip >= meta.row_group(first_group).num_rows:
        skip -= meta.row_group(first_group).num_rows
        first_group += 1
    groups = list(range(first_group, meta.num_row_groups))
    at = row - skip
    for batch in pf.iter_batches(PARQUET_BATCH, row_groups=groups, columns=[field]):
        for value in batch.column(0).to_pylist():
            if at >= row and isinstance(value, str) and value:
                yield at, value + "\n"
            at += 1


def records_from(path: Path, offset: int, field: str) -> Iterator[tuple[int, str]]:
    """``(offset, text)`` of each record of one shard from ``offset`` on."""
    suffix = shard_suffix(path)
    if suffix == ".txt":
        return _txt_records(path, offset)
    if suffix == ".jsonl":
        return _jsonl_records(path, offset, field)
    if suffix == ".jsonl.gz":
        return _gz_records(path, offset, field)
    if suffix == ".parquet":
        return _parquet_records(path, offset, field)
    raise UserInputError("data", str(path), f"a shard ending in {', '.join(SHARD_SUFFIXES)}")


def read_source(
    files: list[Path],
    field: str,
    start: RecordPos,
    loop: bool = True,
    restart: RecordPos | None = None,
) -> Iterator[tuple[RecordPos, str]]:
    """Every record of a source from ``start`` on, in order; with ``loop``, the source starts
    over (epoch + 1) at ``restart`` (default: its first record) after its last shard. A
    source with no record at all is an error."""
    first = restart if restart is not None else RecordPos()
    pos = start
    while True:
        seen = False
        for f in range(pos.file, len(files)):
            offset = pos.offset if f == pos.file else 0
            for at, text in records_from(files[f], offset, field):
                seen = True
                yield RecordPos(f, at, pos.index, pos.epoch), text
                pos = RecordPos(f, at, pos.index + 1, pos.epoch)
        if not seen and (pos.file, pos.offset, pos.index) == (
            first.file,
            first.offset,
            first.index,
        ):
            raise UserInputError("data", f"{len(files)} shard(s) from {files[0]}", "a record")
        if not loop:
            return
        pos = RecordPos(first.file, first.offset, first.index, pos.epoch + 1)
