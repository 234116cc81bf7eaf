"""The serve/work/launch CLIs reject bad input with one line on stderr and exit code 2."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from heloco.cli import main
from heloco.net.auth import SECRET_ENV, SECRET_FILE_ENV


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["work", "--connect", "tcp://127.0.0.1:9", "--worker", "0"], "secret"),
        (["serve", "--status", "tcp://127.0.0.1:9"], "secret"),
    ],
)
def test_missing_secret_is_a_one_line_error(
    argv: list[str],
    needle: str,
    monkeypatch: pytest.MonkeyPatch,
    cli_error: Callable[..., str],
) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.delenv(SECRET_FILE_ENV, raising=False)
    assert needle in cli_error(main, argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["work", "--connect", "http://127.0.0.1:9", "--worker", "0"],
        ["work", "--connect", "tcp://127.0.0.1:9", "--worker", "0", "--pace", "0.5"],
        [
            "work",
            "--connect",
            "tcp://127.0.0.1:9",
            "--worker",
            "0",
            "--timeout-s",
            "5",
            "--deadline-s",
            "1",
        ],
        ["serve", "--heartbeat-s", "5", "--evict-after-s", "2"],
        ["serve", "--bind", "127.0.0.1:5555"],
        ["serve", "--max-mb", "0"],
        ["serve", "--status", "tcp://127.0.0.1"],
        ["work", "--connect", "tcp://127.0.0.1", "--worker", "0"],
        ["work", "--connect", "tcp://127.0.0.1:9", "--worker", "0", "--block", "0"],
        ["work", "--connect", "tcp://127.0.0.1:9", "--worker", "0", "--device", "bogus"],
        ["work", "--connect", "tcp://127.0.0.1:9", "--worker", "0", "--max-mb", "-1"],
        ["serve", "--config", "/nonexistent/run.toml"],
        ["launch", "--out", "/tmp/x", "--paces", "1,fast"],
    ],
)
def test_bad_flags_exit_2(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, cli_error: Callable[..., str]
) -> None:
    monkeypatch.setenv(SECRET_ENV, "a-test-secret-of-enough-bytes")
    assert cli_error(main, argv).startswith("heloco: error:")


@pytest.mark.parametrize(
    "argv",
    [
        ["launch", "--config", "/nonexistent/run.toml", "--out", "OUT"],
        ["launch", "--preset", "default", "--out", "OUT", "--paces", "1,2"],
        ["launch", "--preset", "default", "--out", "OUT", "--set", "method=bogus"],
        ["serve", "--preset", "default", "--set", "method=bogus"],
        ["serve", "--preset", "default", "--out", "FILE"],
        ["launch", "--preset", "default", "--out", "FILE"],
        ["serve", "--preset", "default", "--checkpoint-dir", "FILE/sub"],
        ["launch", "--preset", "default", "--out", "OUT", "--threads", "0"],
        ["launch", "--preset", "default", "--out", "OUT", "--timeout-s", "0"],
    ],
)
def test_bad_run_config_exits_2_before_starting(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli_error: Callable[..., str],
) -> None:
    monkeypatch.setenv(SECRET_ENV, "a-test-secret-of-enough-bytes")
    (tmp_path / "file").write_text("x")
    paths = {"OUT": tmp_path / "run", "FILE": tmp_path / "file", "FILE/sub": tmp_path / "file/sub"}
    err = cli_error(main, [str(paths[a]) if a in paths else a for a in argv])
    assert err.startswith("heloco: error:")


@pytest.mark.parametrize("content", [b"short", b"\xff\xfe\x00"])
def test_malformed_secret_file_exits_2(
    content: bytes,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli_error: Callable[..., str],
) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.delenv(SECRET_FILE_ENV, raising=False)
    secret = tmp_path / "secret"
    secret.write_bytes(content)
    argv = ["work", "--connect", "tcp://127.0.0.1:9", "--worker", "0"]
    err = cli_error(main, [*argv, "--secret-file", str(secret)])
    assert err.startswith("heloco: error: secret")


def test_negative_checkpoint_period_names_its_flag(
    monkeypatch: pytest.MonkeyPatch, cli_error: Callable[..., str]
) -> None:
    monkeypatch.setenv(SECRET_ENV, "a-test-secret-of-enough-bytes")
    err = cli_error(main, ["serve", "--checkpoint-every-s", "-1"])
    assert err.startswith("heloco: error: --checkpoint-every-s") and "-1" in err


def test_port_in_use_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(SECRET_ENV, "a-test-secret-of-enough-bytes")
    assert main(["keys", "--out", str(tmp_path / "keys"), "--workers", "1"]) == 0
    capsys.readouterr()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["serve", "--preset", "default", "--set", "workers=1", "--set", "paces=[1.0]"]
        argv += ["--keys", str(tmp_path / "keys" / "server"), "--out", str(tmp_path / "run")]
        code = main([*argv, "--bind", f"tcp://127.0.0.1:{port}"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("heloco: error: --bind") and "in use" in err
    assert len(err.splitlines()) == 1
