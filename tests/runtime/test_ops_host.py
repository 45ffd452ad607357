"""The ops' host side: the integer helpers the launches are sized with, and that a chunked call
checks its inputs once.  Host time matters where a serving engine launches prefill eagerly (24
GDN layers a forward): on the H200 a chunked call cost 161-261 µs of host time before these
(docs/performance.md, "fourteenth pass")."""

from __future__ import annotations

import pytest
import torch
import triton

from clef_runtime.inputs import gdn_inputs
from clef_runtime.ops import _common
from clef_runtime.ops import delta_rule_chunk as dc
from clef_runtime.ops.delta_rule_common import pow2_at_least


def test_host_integer_helpers_match_triton() -> None:
    """`next_pow2` and `cdiv` are plain Python (Triton's are constexpr functions, ~13 µs a call
    on the host) and must agree with Triton's everywhere the ops use them."""
    for n in range(0, 5000):
        assert _common.next_pow2(n) == triton.next_power_of_2(max(n, 1)), n
    assert _common.next_pow2(-3) == 1
    for a in range(0, 700):
        for b in (1, 2, 3, 16, 64, 128):
            assert _common.cdiv(a, b) == triton.cdiv(a, b), (a, b)
    assert pow2_at_least(20) == 32 and pow2_at_least(3, 1) == 4 and pow2_at_least(128) == 128


def test_a_chunked_call_checks_its_inputs_once(
    rng: torch.Generator, device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default path hands long sequences (or 128 chains or more) to the split design without
    checking the inputs again (`delta_rule_chunk_split.run_split`); the split design's own entry point still
    checks them."""
    from clef_runtime.ops import delta_rule_chunk_split as ds

    calls: list[str] = []
    real = dc.check_gdn_inputs

    def counted(*args: object) -> object:
        calls.append(str(args[0]))
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(dc, "check_gdn_inputs", counted)
    # one sequence of 2048 tokens: the split design, in 8 segments (the fewest programs that take it)
    q, k, v, g, beta = gdn_inputs(rng, device, torch.bfloat16, B=1, T=2048, H=1, HV=1, K=16, V=16)
    assert ds.takes_default_path(torch.bfloat16, True, 1, 1, 16, 16, 2048)
    o, h = dc.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, tensor_cores=True)
    assert calls == [dc.OP]
    calls.clear()
    o2, h2 = ds.chunk_gated_delta_rule_split(q, k, v, g, beta, output_final_state=True)
    assert calls == [dc.OP]
    assert h is not None and h2 is not None
    assert torch.equal(o, o2) and torch.equal(h, h2)
