"""The decisive checkpoint's margins (`clef_devcluster.decisive`, trained by `make decisive`,
which `make test-engines` runs first): its goldens over the built-in set must be decisive, or a
correct engine's bf16 rounding flips near-ties and the tier's false-alarm count means nothing.
About 2 minutes per dtype on two cores, so here rather than in `make test`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clef_devcluster import decisive

REPO = Path(__file__).resolve().parents[2]
# What docs/verification.md publishes ("The decisive checkpoint"), with a little room: at least
# this share of the built-in set's golden positions have a margin of 1 nat or more, and none is
# below the near-tie margin of the comparison rule.
MIN_SHARE_1NAT = 0.95
MIN_MARGIN = 0.5


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_decisive_goldens_have_decisive_margins(dtype: str, tmp_path: Path) -> None:
    """Goldens of the trained checkpoint over the built-in set (without the 8197-token prompt):
    at least MIN_SHARE_1NAT of the positions at a margin of ≥ 1 nat, none under MIN_MARGIN."""
    where = decisive.cache_dir()
    assert (where / "TRAINED.json").is_file(), (
        f"the decisive checkpoint is not trained here ({where}): `make decisive` trains it (a few minutes of CPU)"
    )
    out = tmp_path / "goldens.json"
    proc = subprocess.run(
        [sys.executable, "-m", "clef_runtime", "goldens", "--checkpoint", str(where / dtype), "--out", str(out),
         "--device", "cpu", "--dtype", dtype, "--ops", "reference", "--no-long"],
        capture_output=True, text=True, cwd=REPO, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, f"goldens failed: {proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    per = decisive.margins(out)
    values = [m for v in per.values() for m in v]
    share = sum(m >= 1.0 for m in values) / len(values)
    low = {name: [round(m, 3) for m in v if m < MIN_MARGIN] for name, v in per.items()}
    assert share >= MIN_SHARE_1NAT, (
        f"{share:.3f} of {len(values)} positions ≥ 1 nat: {decisive.distribution(values)}"
    )
    assert not any(low.values()), f"positions under {MIN_MARGIN} nats: {low}"
