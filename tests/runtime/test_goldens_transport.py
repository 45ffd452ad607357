"""How the operator's Jobs move goldens (issue 16): `goldens --out -` prints exactly the file,
and `endpoint-check` reads the gzip-compressed copy the operator mounts, bounded and whole."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from clef_runtime.goldens.schema import (
    GoldenPrompt,
    Goldens,
    GoldensError,
    PromptSpec,
    cache_key,
    goldens_bytes,
    prompt_set_digest,
    read_goldens,
)


def tiny_goldens() -> Goldens:
    spec = PromptSpec("hello", "chat", "Hello.", (1, 2, 3), 2)
    prompt = GoldenPrompt(
        spec=spec,
        ids=(7, 8),
        logprobs=(-0.1, -0.2),
        top_ids=((7, 1, 2, 3, 4), (8, 1, 2, 3, 4)),
        top_logprobs=((-0.1, -3.0, -4.0, -5.0, -6.0), (-0.2, -3.0, -4.0, -5.0, -6.0)),
        top_pieces=(("a", "b", "c", "d", "e"), ("f", "b", "c", "d", "e")),
        finish_reason="length",
    )
    prov = {
        "checkpointDigest": "sha256:" + "0" * 64,
        "dtype": "f16",
        "runtimeVersion": "0.1.0",
        "promptSetDigest": prompt_set_digest([spec]),
        "gpuClass": "cpu",
        "opSet": "reference",
        "kernelChecks": "not run (reference op set)",
        "topK": 5,
        "createdAt": "2026-12-01T00:00:00Z",
        "torch": "x",
        "triton": "x",
    }
    return Goldens(prov, cache_key(prov), (0,), (prompt,))


def test_a_gzip_copy_reads_as_the_file(tmp_path: Path) -> None:
    data = goldens_bytes(tiny_goldens())
    assert data.endswith(b"\n") and data.count(b"\n") == 1, "one line: the operator finds it in a log"
    (tmp_path / "g.json.gz").write_bytes(gzip.compress(data))
    (tmp_path / "g.json").write_bytes(data)
    assert read_goldens(tmp_path / "g.json.gz") == read_goldens(tmp_path / "g.json")


def test_a_truncated_gzip_copy_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "g.json.gz").write_bytes(gzip.compress(goldens_bytes(tiny_goldens()))[:-8])
    with pytest.raises(GoldensError, match=r"truncated|readable"):
        read_goldens(tmp_path / "g.json.gz")
