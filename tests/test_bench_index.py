"""The index benchmark runs end to end (small, counting bytes) and prints its three phases."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_index.py"


def test_benchmark_prints_three_phases():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--bytes", "--limit", "40", "--workers", "2"],
        capture_output=True, text=True, timeout=120, check=True,
    )
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("    1 ")]
    assert [row[1] for row in rows] == ["cold", "no-change", "one-file"]
    parsed = {row[1]: int(row[5]) for row in rows}
    # Every blob once (identical files are one blob), then none, then the edited file.
    assert parsed["cold"] > 30 and (parsed["no-change"], parsed["one-file"]) == (0, 1)
    assert "token counter: bytes (--bytes)" in done.stdout
