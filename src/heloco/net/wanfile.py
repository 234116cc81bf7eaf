"""The emulated WAN a launch ran over, saved in its run folder as ``wan.json``.

``heloco launch --wan/--wan-server/--topology`` writes it (atomically) once the links are up;
``heloco report`` reads it to draw each link's set rate beside the measured link use. A run
folder without it (an unshaped run, or one written before the file existed) has no set rates.

The file (``format`` 1; rates in bit/s, ``null`` = unshaped; round trips in seconds)::

    {"format": 1, "mtu": 2500, "shared": true,
     "server": {"up_bps": 10000000.0, "down_bps": 10000000.0, "rtt_s": 0.0},
     "workers": [{"up_bps": 20000000.0, "down_bps": 20000000.0, "rtt_s": 0.02}, ...]}

``server`` is the server's own link, one veth that every worker's traffic crosses: ``shared``
says whether it is shaped at all (then it is a shared uplink, docs/wan.md). Worker i's path
to the server has rate min(worker's up, server's down) for its pushes and min(server's up,
worker's down) for its dispatches, and round trip rtt_i + rtt_server (heloco.net.wan).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from heloco.net.wan import EmulatedWan, LinkSpec
from shardmeter.errors import UserInputError, from_pydantic
from shardmeter.io import write_atomic

WAN_FILE = "wan.json"


class LinkSetting(BaseModel):
    """One endpoint's access link as set: bit/s each way (None: unshaped), round trip (s)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    up_bps: float | None = Field(None, gt=0)
    down_bps: float | None = Field(None, gt=0)
    rtt_s: float = Field(0.0, ge=0)


class WanSettings(BaseModel):
    """Every link of a shaped launch: the server's (endpoint 0) and each worker's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal[1] = 1
    mtu: int = Field(gt=0)
    shared: bool  # the server's own link is shaped: every worker shares it
    server: LinkSetting
    workers: list[LinkSetting]

    def path_bps(self, worker: int, direction: Literal["send", "receive"]) -> float | None:
        """The set rate (bit/s) of ``worker``'s path to the server: ``send`` (its pushes)
        min(worker up, server down); ``receive`` (its dispatches) min(server up, worker
        down). None where neither end is shaped."""
        w = self.workers[worker]
        ends = (w.up_bps, self.server.down_bps) if direction == "send" else (
            self.server.up_bps, w.down_bps)  # fmt: skip
        rate = min((r for r in ends if r is not None), default=math.inf)
        return None if math.isinf(rate) else rate

    def server_bps(self, direction: Literal["send", "receive"]) -> float | None:
        """The shared server link's set rate (bit/s) for the workers' ``send`` (into the
        server: its down) or ``receive`` (out of it: its up); None: unshaped."""
        return self.server.down_bps if direction == "send" else self.server.up_bps


def _setting(link: LinkSpec) -> LinkSetting:
    return LinkSetting(up_bps=link.up_bps, down_bps=link.down_bps, rtt_s=link.rtt_s)


def settings_of(wan: EmulatedWan) -> WanSettings:
    """The settings of ``wan``, whose endpoint 0 is the server and 1 + i worker i (as
    `heloco launch` builds it)."""
    server = wan.links[0]
    return WanSettings(
        mtu=wan.mtu,
        shared=server.up_bps is not None or server.down_bps is not None,
        server=_setting(server),
        workers=[_setting(link) for link in wan.links[1:]],
    )


def write_settings(run_dir: Path, wan: EmulatedWan) -> Path:
    """Write ``run_dir/wan.json`` atomically; its path."""
    path = run_dir / WAN_FILE
    write_atomic(path, settings_of(wan).model_dump_json(indent=1) + "\n")
    return path


def read_settings(run_dir: Path) -> WanSettings | None:
    """``run_dir/wan.json``, or None when the run has none; a file that is not valid
    settings is a one-line error naming the file and the field."""
    path = run_dir / WAN_FILE
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserInputError(str(path), "(unreadable)", f"the JSON of a wan.json ({exc})") from None
    try:
        return WanSettings.model_validate(doc)
    except ValidationError as exc:
        raise from_pydantic(exc, str(path)) from None
