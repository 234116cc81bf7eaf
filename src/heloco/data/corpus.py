"""Per-language text corpora from a folder: ``xx.txt`` or ``xx.jsonl`` / ``xx.jsonl.gz``.

The language of a file is its name without the suffix (``de.txt`` -> ``de``). A JSONL file
holds one JSON object per line with a ``text`` field (C4 style); records are joined by
newlines, so both formats give one string per language.
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


def read_jsonl(path: Path) -> str:
    """The ``text`` fields of a (gzipped) JSONL file, joined by newlines."""
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
            text = record.get("text") if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise UserInputError(
                    f"{path.name}:{lineno}", line[:40], 'a JSON object with a string "text" field'
                )
            records.append(text)
    return "\n".join(records)


def read_text_file(path: Path) -> str:
    """One corpus file's text (UTF-8)."""
    try:
        if path.name.endswith(".txt"):
            return path.read_text(encoding="utf-8")
        return read_jsonl(path)
    except UnicodeDecodeError:
        raise UserInputError("data_dir", str(path), "UTF-8 text files") from None
    except (OSError, EOFError) as exc:
        raise UserInputError("data_dir", str(path), f"a readable file ({exc})") from None


def load_corpus(data_dir: Path) -> Corpus:
    """Read every ``xx.txt`` / ``xx.jsonl`` / ``xx.jsonl.gz`` in ``data_dir`` (not recursive)."""
    if not data_dir.is_dir():
        raise UserInputError(
            "data_dir", str(data_dir), "an existing folder of per-language xx.txt or xx.jsonl files"
        )
    files: dict[str, Path] = {}
    for path in sorted(data_dir.iterdir()):
        language = language_of(path)
        if language is None or not path.is_file():
            continue
        if language in files:
            raise UserInputError(
                "data_dir",
                f"{files[language].name} and {path.name}",
                "one file per language",
            )
        files[language] = path
    if not files:
        raise UserInputError(
            "data_dir", str(data_dir), f"a folder holding files ending in {', '.join(SUFFIXES)}"
        )
    languages = tuple(sorted(files))
    return Corpus(languages, tuple(read_text_file(files[lang]) for lang in languages))


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
