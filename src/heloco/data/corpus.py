"""Per-language text corpora held in memory (the ``windows`` sampling): a folder or globs.

A folder holds ``xx.txt``, ``xx.jsonl`` / ``xx.jsonl.gz`` (one JSON object per line with a
text field, C4 style), ``xx.parquet`` (a text column), or a folder ``xx/`` of such shards; the
language is the name without the suffix (``de.txt`` -> ``de``). JSONL records are joined by
newlines, so every format gives one string per language. Streamed reading of the same layouts
(never the whole corpus in memory) is :mod:`heloco.data.shards`.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from shardmeter.errors import UserInputError

SUFFIXES = (".txt", ".jsonl", ".jsonl.gz")


@dataclass(frozen=True)
class Corpus:
    """Text per language, languages sorted by name."""

    languages: tuple[str, ...]
    texts: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.languages) != len(self.texts):
            raise ValueError("Corpus needs one text per language")


@dataclass(frozen=True)
class LanguageSplit:
    """The validation share (start of the text) and the training text of one language."""

    language: str
    validation: str
    train: str


def language_of(path: Path) -> str | None:
    """The language code of a corpus file, or None if its suffix is not a corpus suffix."""
    for suffix in SUFFIXES:
        if path.name.endswith(suffix) and len(path.name) > len(suffix):
            return path.name[: -len(suffix)]
    return None


def read_jsonl(path: Path, field: str = "text") -> str:
    """The ``field`` strings of a (gzipped) JSONL file, joined by newlines."""
    opener = gzip.open if path.name.endswith(".gz") else open
    records: list[str] = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise UserInputError(
                    f"{path.name}:{lineno}", line[:40], "one JSON object per line"
                ) from None
            text = record.get(field) if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise UserInputError(
                    f"{path.name}:{lineno}",
                    line[:40],
                    f'a JSON object with a string "{field}" field',
                )
            records.append(text)
    return "\n".join(records)


def read_text_file(path: Path, field: str = "text") -> str:
    """One corpus file's text (UTF-8)."""
    try:
        if path.name.endswith(".txt"):
            return path.read_text(encoding="utf-8")
        return read_jsonl(path, field)
    except UnicodeDecodeError:
        raise UserInputError("data_dir", str(path), "UTF-8 text files") from None
    except (OSError, EOFError) as exc:
        raise UserInputError("data_dir", str(path), f"a readable file ({exc})") from None


def load_corpus(data_dir: Path, field: str = "text") -> Corpus:
    """Every language of ``data_dir``: ``xx.txt`` / ``xx.jsonl[.gz]`` files as they are,
    ``xx.parquet`` files and ``xx/`` folders of shards as their records joined."""
    from heloco.data.sources import folder_sources

    if not data_dir.is_dir():
        raise UserInputError(
            "data_dir", str(data_dir), "an existing folder of per-language xx.txt or xx.jsonl files"
        )
    try:
        found = folder_sources(data_dir)
    except UserInputError as exc:
        if exc.allowed == "one entry per language":
            raise UserInputError(exc.field, exc.value, "one file per language") from None
        raise
    return _corpus(found, field)


def sources_corpus(patterns: dict[str, list[str]], field: str = "text") -> Corpus:
    """The languages of ``data.sources`` (name -> glob patterns), read whole."""
    from heloco.data.sources import glob_sources

    return _corpus(glob_sources(patterns), field)


def _corpus(found: dict[str, list[Path]], field: str) -> Corpus:
    from heloco.data.shards import RecordPos, read_source

    languages = tuple(sorted(found))
    texts = []
    for lang in languages:
        files = found[lang]
        if len(files) == 1 and files[0].name.endswith(SUFFIXES):
            texts.append(read_text_file(files[0], field))
        else:
            texts.append("".join(t for _, t in read_source(files, field, RecordPos(), loop=False)))
    return Corpus(languages, tuple(texts))


def split_language(
    language: str, text: str, val_chars: int, train_fraction: float
) -> LanguageSplit:
    """First ``val_chars`` characters -> validation; the first ``train_fraction`` of the rest
    -> training. The two never overlap (the paper's held-out head of each file, spec §3)."""
    if len(text) <= val_chars:
        raise UserInputError(
            f"language {language!r}",
            f"{len(text)} characters",
            f"more than val_chars_per_language={val_chars} characters",
        )
    rest = text[val_chars:]
    keep = max(1, int(len(rest) * train_fraction))
    return LanguageSplit(language, text[:val_chars], rest[:keep])
