"""`import shardmeter` needs numpy and pydantic only: the planner runs with rich and matplotlib
unimportable (they draw tables and plots, which only the CLI and the report modules need)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

BLOCKED = ("rich", "matplotlib")

SCRIPT = textwrap.dedent(
    """
    import sys

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {blocked!r}:
                raise ImportError(f"blocked for this test: {{name}}")
            return None

    sys.meta_path.insert(0, Block())
    import shardmeter as sm
    import shardmeter.quality

    est = sm.predict("llama-3.1-8b", "dgx-h100", sm.Plan(dp=8, sharding="zero3", global_batch=8))
    topo = sm.predict_topology(sm.load_topology("two-clouds"))
    assert est.tokens_per_s_per_gpu > 0 and topo.tokens_per_s > 0
    loaded = sorted({{m.split(".")[0] for m in sys.modules}} & set({blocked!r}))
    print("loaded:", loaded)
    """
)


def test_import_shardmeter_without_rich_or_matplotlib() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(blocked=BLOCKED)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("loaded: []")


def test_the_block_really_blocks() -> None:
    """The same finder makes the CLI's table module fail, so the test above can fail."""
    script = SCRIPT.format(blocked=BLOCKED).replace(
        "import shardmeter.quality", "import shardmeter.report.quality"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert proc.returncode != 0 and "blocked for this test: rich" in proc.stderr
