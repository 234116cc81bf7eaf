"""Key folders: CURVE key pairs for ZeroMQ's handshake security and the shared HMAC secret.

CURVE (CurveZMQ, ZeroMQ RFC 26: Curve25519 key exchange, XSalsa20-Poly1305 per frame) runs in
the connection handshake, before any message is delivered. The server accepts only clients
whose public key is in its allow list; its ZAP handler (ZeroMQ RFC 27) refuses every other
peer during the handshake, so an unknown peer never gets a byte buffered or parsed, and all
traffic is encrypted. The per-message HMAC (:mod:`heloco.net.auth`) stays on top of it.

:func:`generate` writes one folder per host, so distributing keys is copying folders::

    DIR/server/    server.key_secret  server.key  hmac.secret  allowed/{server,worker0,...}.key
    DIR/worker0/   worker0.key_secret server.key  hmac.secret
    DIR/worker1/   ...

Key files use ZeroMQ's certificate format (``zmq.auth.load_certificate`` reads them); files
holding a secret are created with mode 0600. The allow-list name of a key is its file name:
a key named ``worker<i>`` may speak only for worker slot ``i`` (see
:meth:`heloco.net.coordinator.Coordinator.handle`).
"""

from __future__ import annotations

import os
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from heloco.net import auth
from shardmeter.errors import UserInputError
from shardmeter.io import write_atomic

SERVER = "server"
ALLOWED = "allowed"
HMAC_FILE = "hmac.secret"
PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
Z85_KEY_CHARS = 40  # a 32-byte Curve25519 key in Z85 text


@dataclass(frozen=True)
class KeyPair:
    """A Curve25519 key pair in Z85 text (40 characters each)."""

    public: bytes
    secret: bytes = field(repr=False)


@dataclass(frozen=True)
class ServerKeys:
    """What a server needs: its key pair and the allow list (public key -> name)."""

    keypair: KeyPair
    allowed: dict[bytes, str]


@dataclass(frozen=True)
class ClientKeys:
    """What a client needs: the server's public key and its own key pair."""

    server_public: bytes
    keypair: KeyPair


def new_keypair() -> KeyPair:
    """A fresh Curve25519 key pair (libsodium via libzmq)."""
    public, secret = zmq.curve_keypair()
    return KeyPair(public, secret)


def _write(path: Path, text: str, private: bool) -> None:
    """Write ``text`` atomically and durably; a private file is 0600 from the start."""
    write_atomic(path, text, mode=0o600 if private else 0o644, fsync=True)


def _cert(name: str, keys: KeyPair, with_secret: bool) -> str:
    """A ZeroMQ certificate (ZPL text, as ``zmq.auth.create_certificates`` writes)."""
    kind = "secret" if with_secret else "public"
    lines = [
        f"#   ZeroMQ CURVE {kind} certificate of {name!r}, written by `heloco keys`",
        f"#   {time.strftime('%Y-%m-%d %H:%M:%S')}",
        "metadata",
        "curve",
        f'    public-key = "{keys.public.decode()}"',
    ]
    if with_secret:
        lines.append(f'    secret-key = "{keys.secret.decode()}"')
    return "\n".join(lines) + "\n"


def write_keypair(folder: Path, name: str, keys: KeyPair) -> None:
    """``folder/name.key`` (public) and ``folder/name.key_secret`` (mode 0600)."""
    _write(folder / f"{name}{PUBLIC_SUFFIX}", _cert(name, keys, False), private=False)
    _write(folder / f"{name}{SECRET_SUFFIX}", _cert(name, keys, True), private=True)


def write_public(folder: Path, name: str, public: bytes) -> None:
    """``folder/name.key`` holding only a public key."""
    _write(folder / f"{name}{PUBLIC_SUFFIX}", _cert(name, KeyPair(public, b""), False), False)


def _load_keypair(path: Path) -> KeyPair:
    public, secret = _load_cert(path)
    if secret is None:
        raise UserInputError("--keys", str(path), "a secret certificate (with a secret-key line)")
    _warn_if_shared(path)
    return KeyPair(public, secret)


def _load_cert(path: Path) -> tuple[bytes, bytes | None]:
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise UserInputError("--keys", str(path), f"a ZeroMQ certificate ({exc})") from None
    for key in (public, secret):
        if key is not None and len(key) != Z85_KEY_CHARS:
            raise UserInputError("--keys", str(path), "keys of 40 Z85 characters")
    return public, secret


def _warn_if_shared(path: Path) -> None:
    """Like ssh: a secret readable by other users is a mistake worth saying (not fatal:
    some filesystems cannot express modes)."""
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        print(
            f"heloco: warning: {path} is readable by other users; run `chmod 600 {path}`",
            file=sys.stderr,
        )


def _folder(path: Path) -> Path:
    if not path.is_dir():
        raise UserInputError("--keys", str(path), "a key folder written by `heloco keys`")
    return path


def load_server(folder: Path) -> ServerKeys:
    """The server's key pair and allow list from a server key folder."""
    folder = _folder(folder)
    keypair = _load_keypair(folder / f"{SERVER}{SECRET_SUFFIX}")
    allowed_dir = folder / ALLOWED
    if not allowed_dir.is_dir():
        raise UserInputError("--keys", str(folder), f"a server key folder (with {ALLOWED}/)")
    allowed = {
        _load_cert(p)[0]: p.name.removesuffix(PUBLIC_SUFFIX)
        for p in sorted(allowed_dir.glob(f"*{PUBLIC_SUFFIX}"))
    }
    if not allowed:
        raise UserInputError("--keys", str(allowed_dir), "at least one allowed *.key")
    return ServerKeys(keypair, allowed)


def load_client(folder: Path) -> ClientKeys:
    """The server's public key and this host's key pair from any key folder.

    The folder holds ``server.key`` and exactly one ``*.key_secret``, this host's own (in
    the server's folder that is the server's pair, which its allow list also holds, so
    ``heloco serve --status`` works from the server host).
    """
    folder = _folder(folder)
    server_public, _ = _load_cert(folder / f"{SERVER}{PUBLIC_SUFFIX}")
    own = sorted(folder.glob(f"*{SECRET_SUFFIX}"))
    if len(own) != 1:
        raise UserInputError("--keys", str(folder), "exactly one *.key_secret (this host's)")
    return ClientKeys(server_public, _load_keypair(own[0]))


def hmac_secret_file(folder: Path | None) -> Path | None:
    """The HMAC secret file of a key folder, if it has one."""
    if folder is None:
        return None
    path = folder / HMAC_FILE
    return path if path.is_file() else None


@dataclass(frozen=True)
class Generated:
    """What :func:`generate` wrote (created) and found in place (kept)."""

    created: list[Path]
    kept: list[Path]


def generate(out: Path, workers: int, secret: bytes | None = None) -> Generated:
    """Key folders for a server and ``workers`` workers under ``out`` (see the module doc).

    Growing: an existing server key pair and HMAC secret are kept and folders are added for
    the workers that lack one, so raising ``workers`` later adds workers without touching
    the others (restart the server to load its new allow list).
    """
    if not 1 <= workers <= 65536:
        raise UserInputError("--workers", workers, "an integer in [1, 65536]")
    server_dir = out / SERVER
    created: list[Path] = []
    kept: list[Path] = []
    (server_dir / ALLOWED).mkdir(parents=True, exist_ok=True)
    os.chmod(server_dir, 0o700)
    server_secret = server_dir / f"{SERVER}{SECRET_SUFFIX}"
    if server_secret.is_file():
        server = _load_keypair(server_secret)
        kept.append(server_dir)
    else:
        server = new_keypair()
        write_keypair(server_dir, SERVER, server)
        write_public(server_dir / ALLOWED, SERVER, server.public)
        created.append(server_dir)
    hmac_path = server_dir / HMAC_FILE
    if not hmac_path.is_file():
        _write(hmac_path, (secret or auth.new_secret()).decode() + "\n", private=True)
    hmac_text = hmac_path.read_text()
    for w in range(workers):
        name = f"worker{w}"
        folder = out / name
        if (folder / f"{name}{SECRET_SUFFIX}").is_file():
            kept.append(folder)
            continue
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
        pair = new_keypair()  # its public half goes to the server's allow list only
        _write(folder / f"{name}{SECRET_SUFFIX}", _cert(name, pair, True), private=True)
        write_public(folder, SERVER, server.public)
        _write(folder / HMAC_FILE, hmac_text, private=True)
        write_public(server_dir / ALLOWED, name, pair.public)
        created.append(folder)
    return Generated(created, kept)


# -- sockets ------------------------------------------------------------------------------------
class AllowList(ThreadAuthenticator):
    """A ZAP handler (ZeroMQ RFC 27) that admits the allow-listed CURVE keys, under their names.

    The name becomes the connection's ``User-Id``, which every message received on it carries.
    """

    def __init__(self, context: zmq.Context[Any], allowed: dict[bytes, str]) -> None:
        super().__init__(context)
        self.names = dict(allowed)
        self.certs["*"] = dict.fromkeys(self.names, True)

    def curve_user_id(self, client_public_key: bytes) -> str:
        """The allow-list name of an admitted key."""
        return self.names[zmq.utils.z85.encode(client_public_key)]


def serve_securely(sock: zmq.Socket[Any], keys: ServerKeys) -> None:
    """Make ``sock`` a CURVE server (call before ``bind``; an :class:`AllowList` must run on
    the socket's context)."""
    sock.curve_secretkey = keys.keypair.secret
    sock.curve_publickey = keys.keypair.public
    sock.curve_server = True


def connect_securely(sock: zmq.Socket[Any], keys: ClientKeys) -> None:
    """Make ``sock`` a CURVE client of the server with ``keys.server_public`` (before connect)."""
    sock.curve_serverkey = keys.server_public
    sock.curve_publickey = keys.keypair.public
    sock.curve_secretkey = keys.keypair.secret
