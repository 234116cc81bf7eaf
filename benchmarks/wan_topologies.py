"""The shipped topologies' predictions under the current transfer model, one row per
topology and outer mode: WAN exchange per round, utilization, tokens/s and wall-clock.

    python benchmarks/wan_topologies.py                # this tree
    python benchmarks/wan_topologies.py --json out.json

docs/islands.md (section 10) compares them with the same script run on the tree before the
transfer model was corrected (one round trip per ring step, no default TCP window).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from shardmeter.estimate.islands import predict_topology
from shardmeter.specs.topology import load_topology

TOPOLOGIES = ("two-clouds", "four-regions", "eight-heterogeneous", "intellect1")
MODES = ("sync", "diloco", "streaming", "async")


def rows() -> list[dict[str, object]]:
    """Every shipped topology under every outer mode."""
    out: list[dict[str, object]] = []
    for name in TOPOLOGIES:
        topo = load_topology(name)
        for mode in MODES:
            est = predict_topology(topo, mode=mode)
            out.append(
                {
                    "topology": name,
                    "mode": mode,
                    "wan_comm_s": est.wan_comm_s,
                    "utilization": est.utilization,
                    "tokens_per_s": est.tokens_per_s,
                    "wall_days": est.wall_s / 86400.0,
                }
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    table = rows()
    print(f"{'topology':<20} {'mode':<10} {'WAN s/round':>11} {'util':>6} {'tokens/s':>10} "
          f"{'days':>7}")  # fmt: skip
    for r in table:
        print(f"{r['topology']:<20} {r['mode']:<10} {r['wan_comm_s']:>11.3g} "
              f"{r['utilization']:>6.1%} {r['tokens_per_s']:>10.4g} {r['wall_days']:>7.3g}")  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
