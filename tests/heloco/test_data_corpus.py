"""Corpus folders (txt / jsonl / jsonl.gz), validation split, synthetic corpus."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from heloco.data import load_corpus, synthetic_corpus
from heloco.data.corpus import split_language
from shardmeter.errors import UserInputError


def test_loads_txt_jsonl_and_gz(tmp_path: Path) -> None:
    (tmp_path / "en.txt").write_text("hello world\n", encoding="utf-8")
    records = [{"text": "hola"}, {"text": "mundo", "url": "x"}]
    (tmp_path / "es.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    with gzip.open(tmp_path / "de.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write(json.dumps({"text": "Grüße"}) + "\n")
    (tmp_path / "README.md").write_text("not a corpus file")
    corpus = load_corpus(tmp_path)
    assert corpus.languages == ("de", "en", "es")
    assert corpus.texts == ("Grüße", "hello world\n", "hola\nmundo")


def one_line(exc: pytest.ExceptionInfo[UserInputError]) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="data_dir") as exc:
        load_corpus(tmp_path / "nope")
    assert "nope" in one_line(exc)


def test_folder_without_corpus_files(tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("x")
    with pytest.raises(UserInputError, match=r"\.txt") as exc:
        load_corpus(tmp_path)
    one_line(exc)


def test_two_files_for_one_language(tmp_path: Path) -> None:
    (tmp_path / "en.txt").write_text("a")
    (tmp_path / "en.jsonl").write_text('{"text": "b"}\n')
    with pytest.raises(UserInputError, match="one file per language"):
        load_corpus(tmp_path)


@pytest.mark.parametrize("line", ["{not json", '{"content": "x"}', '["text"]', '{"text": 3}'])
def test_bad_jsonl_record(tmp_path: Path, line: str) -> None:
    (tmp_path / "fr.jsonl").write_text('{"text": "ok"}\n' + line + "\n")
    with pytest.raises(UserInputError, match=r"fr\.jsonl:2") as exc:
        load_corpus(tmp_path)
    one_line(exc)


def test_split_is_disjoint_head_and_rest() -> None:
    text = "abcdefghij" * 10
    split = split_language("xx", text, 30, 1.0)
    assert split.validation == text[:30]
    assert split.validation + split.train == text
    half = split_language("xx", text, 30, 0.5)
    assert half.train == text[30:65]


def test_split_rejects_language_shorter_than_validation_share() -> None:
    with pytest.raises(UserInputError, match="'xx'") as exc:
        split_language("xx", "short", 40_000, 1.0)
    assert "40000" in one_line(exc)


def test_synthetic_corpus_is_deterministic_and_distinct() -> None:
    a = synthetic_corpus(5000)
    synthetic_corpus.cache_clear()
    b = synthetic_corpus(5000)
    assert a == b
    assert len(a.languages) == 5
    assert all(len(t) >= 5000 for t in a.texts)
    alphabets = [set(t) - set(" .!?;\n") for t in a.texts]
    for i in range(5):
        for j in range(i + 1, 5):
            # distinct character statistics: alphabets differ between pseudo-languages
            assert alphabets[i] != alphabets[j]
