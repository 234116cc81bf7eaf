"""Streamed shards: txt / jsonl / jsonl.gz / parquet records, packing, sharing, the data position.

The key property: a worker's consumed tokens are exactly the concatenation of its records
(packed with stride seq_len), and a worker restarted from its saved state continues that
sequence: it neither replays nor skips data.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from heloco.data import build_data, parse_data_config
from heloco.data.packed import PackedStream
from heloco.data.shards import RecordPos, read_source
from heloco.data.sources import folder_sources
from heloco.data.validation import ValidationSet
from heloco.model import TinyGPT, preset_config
from heloco.worker import InnerConfig, Worker
from shardmeter.errors import UserInputError

pytestmark = pytest.mark.usefixtures("one_thread")

SEQ = 16


def records(lang: str, n: int) -> list[str]:
    return [f"{lang} record {i:05d} " + "x" * (i % 7) for i in range(n)]


def write_corpus(root: Path, n: int = 400) -> dict[str, list[str]]:
    """Four languages, one per format (two shards for the folder ones)."""
    texts = {lang: records(lang, n) for lang in ("de", "en", "fr", "it")}
    (root / "en.txt").write_text("".join(t + "\n" for t in texts["en"]))
    (root / "de").mkdir()
    half = n // 2
    for k, part in enumerate((texts["de"][:half], texts["de"][half:])):
        (root / "de" / f"part{k}.jsonl").write_text(
            "".join(json.dumps({"body": t, "id": i}) + "\n" for i, t in enumerate(part))
        )
    with gzip.open(root / "fr.jsonl.gz", "wt") as fh:
        fh.writelines(json.dumps({"body": t}) + "\n" for t in texts["fr"])
    (root / "it").mkdir()
    for k, part in enumerate((texts["it"][:half], texts["it"][half:])):
        table = pa.table({"body": part, "n": list(range(len(part)))})
        pq.write_table(table, root / "it" / f"part{k}.parquet", row_group_size=37)
    return texts


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[Path, dict[str, list[str]]]:
    return tmp_path, write_corpus(tmp_path)


def data_cfg(root: Path, **over: object) -> object:
    values = {
        "data_dir": str(root),
        "sampling": "stream",
        "text_field": "body",
        "val_chars_per_language": 300,
        "seq_len": SEQ,
        **over,
    }
    return parse_data_config(values)


def test_records_of_every_format_in_order(corpus: tuple[Path, dict[str, list[str]]]) -> None:
    root, texts = corpus
    sources = folder_sources(root)
    assert sorted(sources) == ["de", "en", "fr", "it"] and len(sources["it"]) == 2
    for lang, files in sources.items():
        got = [text for _, text in read_source(files, "body", RecordPos(), loop=False)]
        assert got == [t + "\n" for t in texts[lang]], lang


def test_resume_from_any_record_position(corpus: tuple[Path, dict[str, list[str]]]) -> None:
    root, _ = corpus
    for files in folder_sources(root).values():
        every = list(read_source(files, "body", RecordPos(), loop=False))
        for k in (0, 1, 150, 250, len(every) - 1):
            again = list(read_source(files, "body", every[k][0], loop=False))
            assert again == every[k:]


def consumed(
    stream: PackedStream, batches: int, state: object = None
) -> tuple[list[np.ndarray], object]:
    sampler = stream.sampler(2, SEQ, seed=5)
    if state is not None:
        sampler.load_state_dict(state)  # type: ignore[arg-type]
    rows = []
    for _ in range(batches):
        x, y = sampler.next()
        assert torch.equal(x[:, 1:], y[:, :-1])
        rows.extend(torch.cat([x, y[:, -1:]], 1).numpy())
    return rows, sampler.state_dict()


def test_one_language_stream_is_the_corpus_packed(
    corpus: tuple[Path, dict[str, list[str]]],
) -> None:
    root, texts = corpus
    data = build_data(data_cfg(root, assignment="language"), 4, 0)  # type: ignore[arg-type]
    stream = data.streams[1]  # worker 1 reads "en" alone
    assert stream.mixture == {"de": 0.0, "en": 1.0, "fr": 0.0, "it": 0.0}
    rows, _ = consumed(stream, 20)
    flat = np.concatenate([rows[0]] + [r[1:] for r in rows[1:]])  # stride seq_len
    text = bytes(flat.astype(np.uint8)).decode()
    full = "".join(t + "\n" for t in texts["en"])
    head_end = full.index(text[:40])
    assert full[head_end : head_end + len(text)] == text  # contiguous: no skip, no repeat
    assert head_end >= 300  # the validation head is never trained on


def test_restart_neither_replays_nor_skips(corpus: tuple[Path, dict[str, list[str]]]) -> None:
    root, _ = corpus
    data = build_data(data_cfg(root, assignment="iid"), 3, 0)  # type: ignore[arg-type]
    stream = data.streams[2]
    straight, _ = consumed(stream, 12)
    first, state = consumed(stream, 5)
    state = json.loads(json.dumps(state["meta"])), state["tensors"]  # type: ignore[index]
    rest, _ = consumed(stream, 7, {"meta": state[0], "tensors": state[1]})
    assert all(np.array_equal(a, b) for a, b in zip(first + rest, straight, strict=True))


def test_workers_sharing_a_language_read_disjoint_records(
    corpus: tuple[Path, dict[str, list[str]]],
) -> None:
    root, _ = corpus
    data = build_data(data_cfg(root, assignment="language"), 8, 0)  # type: ignore[arg-type]
    a, b = data.streams[1], data.streams[5]  # both bound to "en"
    ra, _ = consumed(a, 10)
    rb, _ = consumed(b, 10)
    ta = bytes(np.concatenate(ra).astype(np.uint8)).decode(errors="replace")
    tb = bytes(np.concatenate(rb).astype(np.uint8)).decode(errors="replace")
    ids_a = {w for w in ta.split() if w.isdigit() and len(w) == 5}
    ids_b = {w for w in tb.split() if w.isdigit() and len(w) == 5}
    assert ids_a and ids_b and not ids_a & ids_b


def test_validation_is_the_head_of_each_source(corpus: tuple[Path, dict[str, list[str]]]) -> None:
    root, texts = corpus
    data = build_data(data_cfg(root), 4, 0)  # type: ignore[arg-type]
    assert isinstance(data.validation, ValidationSet)
    en = data.validation.tokens[data.languages.index("en")]
    assert (
        bytes(en.numpy().astype(np.uint8)).decode() == "".join(t + "\n" for t in texts["en"])[:300]
    )


def test_worker_state_carries_the_stream_position(
    corpus: tuple[Path, dict[str, list[str]]],
) -> None:
    root, _ = corpus
    data = build_data(data_cfg(root, assignment="dirichlet"), 2, 0)  # type: ignore[arg-type]
    model = TinyGPT(preset_config("tiny", vocab_size=256, seq_len=SEQ, d_model=32), seed=0)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = InnerConfig(lr=1e-2, batch_size=2, seq_len=SEQ)
    straight = Worker(0, model, data.streams[0], cfg, 0)
    straight.run_round(start, 3, 0)
    want = straight.run_round(start, 3, 1)
    first = Worker(0, model, data.streams[0], cfg, 0)
    first.run_round(start, 3, 0)
    state = first.state_dict()
    again = Worker(0, model, data.streams[0], cfg, 0)
    again.load_state_dict(state)
    got = again.run_round(start, 3, 1)
    assert all(torch.equal(got.delta[n], want.delta[n]) for n in start)


def test_bad_streamed_input_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "en.jsonl").write_text(2 * (json.dumps({"text": "x" * 400}) + "\n"))
    with pytest.raises(UserInputError, match="'body'") as exc:
        build_data(data_cfg(tmp_path), 1, 0)  # type: ignore[arg-type]
    assert "\n" not in str(exc.value)
    (tmp_path / "de.txt").write_text("")
    with pytest.raises(UserInputError, match="non-empty shard"):
        build_data(data_cfg(tmp_path, text_field="text"), 1, 0)  # type: ignore[arg-type]
    (tmp_path / "de.txt").unlink()
    pq.write_table(pa.table({"content": ["a" * 400] * 2}), tmp_path / "it.parquet")
    with pytest.raises(UserInputError, match="text column 'text'"):
        build_data(data_cfg(tmp_path, text_field="text"), 1, 0)  # type: ignore[arg-type]
    with pytest.raises(UserInputError, match="tokenizer"):
        build_data(data_cfg(tmp_path, tokenizer="bpe"), 1, 0)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.text(min_size=1, max_size=40), st.integers(min_value=1, max_value=200))
def test_a_utf8_cut_is_always_decodable(text: str, cut: int) -> None:
    from heloco.data.shards import _utf8_boundary

    raw = text.encode()[:cut]
    keep = _utf8_boundary(raw)
    assert raw[:keep].decode("utf-8") == text.encode()[:keep].decode("utf-8")
    assert len(raw) - keep < 4


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.binary(max_size=300))
def test_arbitrary_jsonl_bytes_give_records_or_one_line(tmp_path_factory: Any, blob: bytes) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "x.jsonl"
    path.write_bytes(blob)
    try:
        for _, text in read_source([path], "text", RecordPos(), loop=False):
            assert text.endswith("\n")
    except UserInputError as exc:
        assert "\n" not in str(exc)


def test_a_source_too_small_for_its_readers_is_one_line(tmp_path: Path) -> None:
    lines = [json.dumps({"body": "v" * 400})] * 2 + [json.dumps({"body": "t"})] * 2
    (tmp_path / "en.jsonl").write_text("\n".join(lines) + "\n")
    data = build_data(data_cfg(tmp_path, assignment="language"), 4, 0)  # type: ignore[arg-type]
    with pytest.raises(UserInputError, match="too few training records for 4 workers"):
        data.streams[3].sampler(1, SEQ, seed=0).next()


def test_epochs_start_over_after_the_validation_head(tmp_path: Path) -> None:
    texts = records("en", 40)  # about 1,000 characters: a few epochs in 80 batches
    (tmp_path / "en.txt").write_text("".join(t + "\n" for t in texts))
    data = build_data(data_cfg(tmp_path, val_chars_per_language=200), 1, 0)  # type: ignore[arg-type]
    rows, state = consumed(data.streams[0], 80)
    assert state["meta"]["cursors"]["en"]["pos"]["epoch"] >= 2  # type: ignore[index]
    seen = bytes(np.concatenate(rows).astype(np.uint8)).decode(errors="replace")
    head = {t.split()[2] for t in texts if "".join(x + "\n" for x in texts).index(t) < 200}
    assert head and not any(f"record {i} " in seen for i in head)
