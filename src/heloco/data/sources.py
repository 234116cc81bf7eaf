"""Where a run's text lives: sources (languages) and their shard files, and the streamed split.

A source is one language (or any group a worker may be bound to): from ``data_dir``, a file
``xx.txt`` / ``xx.jsonl`` / ``xx.jsonl.gz`` / ``xx.parquet`` or a folder ``xx/`` of such shards
(one language per folder); or from ``data.sources``, a table of name -> glob patterns. In
streamed mode the validation text of a source is its first records, up to
``val_chars_per_language`` characters, and its training records start right after them.
"""

from __future__ import annotations

import glob
from pathlib import Path

from heloco.data.shards import SHARD_SUFFIXES, RecordPos, check_shards, read_source, shard_suffix
from shardmeter.errors import UserInputError


def folder_sources(data_dir: Path) -> dict[str, list[Path]]:
    """Sources of a data folder: per-language files and per-language folders of shards."""
    if not data_dir.is_dir():
        raise UserInputError(
            "data_dir", str(data_dir), "an existing folder of per-language files or folders"
        )
    found: dict[str, list[Path]] = {}
    for entry in sorted(data_dir.iterdir()):
        suffix = shard_suffix(entry)
        if entry.is_file() and suffix is not None:
            name, files = entry.name[: -len(suffix)], [entry]
        elif entry.is_dir() and not entry.name.startswith("."):
            files = sorted(p for p in entry.rglob("*") if p.is_file() and shard_suffix(p))
            if not files:
                continue
            name = entry.name
        else:
            continue
        if name in found:
            raise UserInputError(
                "data_dir", f"{found[name][0].name} and {entry.name}", "one entry per language"
            )
        found[name] = files
    if not found:
        raise UserInputError(
            "data_dir",
            str(data_dir),
            f"a folder holding files ending in {', '.join(SHARD_SUFFIXES)}",
        )
    return found


def glob_sources(patterns: dict[str, list[str]]) -> dict[str, list[Path]]:
    """Sources of ``data.sources``: name -> files matching its glob patterns (sorted)."""
    found: dict[str, list[Path]] = {}
    for name, pats in sorted(patterns.items()):
        files = sorted(
            {
                Path(p)
                for pat in pats
                for p in glob.glob(str(Path(pat).expanduser()), recursive=True)
                if shard_suffix(Path(p)) and Path(p).is_file()
            }
        )
        if not files:
            raise UserInputError(
                f"data.sources.{name}", pats, f"globs matching {', '.join(SHARD_SUFFIXES)} files"
            )
        found[name] = files
    if not found:
        raise UserInputError("data.sources", patterns, "at least one name = [globs]")
    return found


def validation_head(files: list[Path], field: str, chars: int, name: str) -> tuple[str, RecordPos]:
    """The first ``chars`` characters of a source (whole records, the last one cut) and the
    position of its first training record."""
    check_shards(files, name)
    parts: list[str] = []
    have = 0
    for pos, text in read_source(files, field, RecordPos(), loop=False):
        if have >= chars:
            return "".join(parts)[:chars], pos
        parts.append(text)
        have += len(text)
    raise UserInputError(
        f"language {name!r}",
        f"{have} characters",
        f"more than val_chars_per_language={chars} characters, with records left after "
        "them (training starts at the first record after the validation head)",
    )
