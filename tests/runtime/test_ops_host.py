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
from clef_runtime.ops import delta_rule_prepare as dp
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
    real = dp.check_gdn_inputs

    def counted(*args: object) -> object:
        calls.append(str(args[0]))
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(dp, "check_gdn_inputs", counted)
    # one sequence of 2048 tokens: the split design, in 8 segments (the fewest programs that take it)
    q, k, v, g, beta = gdn_inputs(rng, device, torch.bfloat16, B=1, T=2048, H=1, HV=1, K=16, V=16)
    assert ds.takes_default_path(torch.bfloat16, True, 1, 1, 16, 16, 2048)
    o, h = dc.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, tensor_cores=True)
    assert calls == [dp.OP]
    calls.clear()
    o2, h2 = ds.chunk_gated_delta_rule_split(q, k, v, g, beta, output_final_state=True)
    assert calls == [dp.OP]
    assert h is not None and h2 is not None
    assert torch.equal(o, o2) and torch.equal(h, h2)


# --- plans: a layout's host work done once (delta_rule_plan, fast_launch) --------------------


def test_workspace_layout_aligns_every_intermediate() -> None:
    from clef_runtime.ops.delta_rule_plan import ALIGN, layout

    total, offsets = layout([((3, 5), torch.bfloat16), None, ((7,), torch.float32), ((0, 4), torch.int32)])
    assert offsets == [0, None, ALIGN, 2 * ALIGN]
    assert total == 2 * ALIGN  # an empty tensor takes no room
    assert all(o is None or o % ALIGN == 0 for o in offsets)


def test_no_plan_under_the_interpreter_or_an_unknown_triton(
    rng: torch.Generator, device: torch.device
) -> None:
    """The CPU tier runs the kernels interpreted: the direct launch must stay off there (and on
    any Triton this was not written against), and every call takes the plain path."""
    from clef_runtime.interpreter import interpreted
    from clef_runtime.ops import fast_launch

    kernel = dp._chunk_prepare_kernel
    if interpreted(kernel):
        assert not fast_launch.supported(kernel)
    real = triton.__version__
    triton.__version__ = "99.0.0"
    fast_launch._internals.cache_clear()
    try:
        assert fast_launch._internals() is None
        assert not fast_launch.supported(kernel)
        q, k, v, g, beta = gdn_inputs(rng, device, torch.bfloat16, B=1, T=80, H=1, HV=2, K=16, V=16)
        before = len(dc._PLANS)
        o, _ = dc.chunk_gated_delta_rule(q, k, v, g, beta, tensor_cores=True)
        assert len(dc._PLANS) == before and torch.isfinite(o.float()).all()
    finally:
        triton.__version__ = real
        fast_launch._internals.cache_clear()


def test_a_plan_passes_what_the_recorded_launch_passed() -> None:
    """A plan's launch arguments (built by one generated function) are the recorded call's: input
    and output addresses where it passed those tensors, workspace addresses at each intermediate's
    offset, the scalars and the constexprs as recorded, the global scratch inside the workspace."""
    from clef_runtime.ops import delta_rule_plan as dp
    from clef_runtime.ops import fast_launch

    seen: list[tuple[object, ...]] = []
    rec = fast_launch.Recorded(
        "k",
        lambda *a: None,
        1234,
        (4, 1, 0),
        5,
        (16, "x"),
        lambda *a: seen.append(a),
        (False, True),
        (64, 128),
    )
    inputs = [torch.zeros(3), torch.zeros(2), None, torch.zeros(1), torch.zeros(1), None, None]
    r = dp.Recorder(inputs)
    specs = [((10,), torch.float32), None, ((4, 4), torch.bfloat16)]
    _, _, w2 = dp.carve(specs, torch.device("cpu"), r)
    o, final = torch.zeros(2), None
    r.outputs(o, final)
    r.launches.append((rec, (3, 2), [r._source(a) for a in (inputs[1], w2, o, 7, 0.5)]))  # type: ignore[misc]
    assert r._source(torch.zeros(1)) is None and r._source(True) is None
    plan = r.plan()
    assert plan is not None
    total, offsets = dp.layout(specs)
    scratch_off = -(-total // 256) * 256
    assert plan.ws_bytes == scratch_off + 3 * 2 * 64
    out, fin = plan(99, inputs, [11, 22, 0, 44, 55, 0, 0, 0, 0])
    assert fin is None and out.shape == o.shape and out.dtype == o.dtype
    assert plan.o_like == 0 and plan.ws_like == 0  # allocated like q (float32 here)
    (args,) = seen
    base = args[7] - scratch_off
    assert args[:7] == (3, 2, 1, 99, 1234, False, True) and args[8:13] == (None, (4, 1, 0), None, None, None)
    assert args[13:] == (22, base + offsets[2], out.data_ptr(), 7, 0.5, 16, "x")


PLAN_CASES = {
    "three-launch": dict(B=1, T=512),
    "split-segments": dict(B=1, T=4096),
    "unsplit-b4": dict(B=4, T=2048),
    "varlen": dict(lens=[1, 64, 200, 4000]),
    "initial-state": dict(B=2, T=300, initial=True),
    "no-final": dict(B=1, T=2048, final=False),
    "f16": dict(B=1, T=700, dtype=torch.float16),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(PLAN_CASES))
def test_planned_calls_match_the_plain_path_gpu(
    case: str, rng: torch.Generator, gpu_device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second call of a layout runs its recorded plan (one workspace, direct launches): the
    same outputs to the bit as the plain path, on fresh inputs of that layout, and on inputs of
    another layout (a new plan)."""
    from clef_runtime.ops import fast_launch

    kw = dict(PLAN_CASES[case])
    dtype = kw.pop("dtype", torch.bfloat16)
    initial, final = kw.pop("initial", False), kw.pop("final", True)
    lens = kw.pop("lens", None)
    B, T = (1, sum(lens)) if lens else (kw["B"], kw["T"])
    Hs = dict(H=16, HV=32, K=128, V=128)
    cu = None
    if lens:
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=gpu_device)
    N = len(lens) if lens else B

    def call() -> tuple[torch.Tensor, torch.Tensor | None]:
        q, k, v, g, beta = gdn_inputs(rng, gpu_device, dtype, B=B, T=T, **Hs)
        h0 = (torch.randn(N, 32, 128, 128, generator=rng) * 0.1).to(gpu_device) if initial else None
        args = (q, k, v, g, beta)
        opts = dict(initial_state=h0, output_final_state=final, cu_seqlens=cu, use_qk_l2norm=True)
        monkeypatch.setattr(fast_launch, "ENABLED", False)
        ref = dc.chunk_gated_delta_rule(*args, **opts)  # type: ignore[arg-type]
        monkeypatch.setattr(fast_launch, "ENABLED", True)
        for _ in range(2):  # a layout's first call notes it, the second records its plan
            dc.chunk_gated_delta_rule(*args, **opts)  # type: ignore[arg-type]
        n = len(dc._PLANS)
        out = dc.chunk_gated_delta_rule(*args, **opts)  # type: ignore[arg-type]
        assert len(dc._PLANS) == n
        assert torch.equal(out[0], ref[0]), case
        assert (out[1] is None) == (ref[1] is None) == (not final)
        if out[1] is not None:
            assert ref[1] is not None and torch.equal(out[1], ref[1]), case
        return out

    call()
    key_count = len(dc._PLANS)
    call()  # fresh inputs, the same layout: no new plan
    assert len(dc._PLANS) == key_count


@pytest.mark.gpu
def test_a_planned_call_in_a_graph_capture_keeps_its_own_workspace_gpu(
    rng: torch.Generator, gpu_device: torch.device
) -> None:
    """Eager planned calls share one workspace a stream (`delta_rule_plan.KEEP_WORKSPACE_BYTES`);
    a call captured into a CUDA graph must not: its intermediates come from the graph's pool, so
    eager calls between replays leave the graph's results right."""
    from clef_runtime.ops import delta_rule_plan as dp

    def inputs() -> tuple[torch.Tensor, ...]:
        return gdn_inputs(rng, gpu_device, torch.bfloat16, B=1, T=512, H=16, HV=32, K=128, V=128)

    opts = dict(output_final_state=True, use_qk_l2norm=True)
    a = inputs()
    for _ in range(3):  # the layout's plan is recorded on its second call, then replayed
        dc.chunk_gated_delta_rule(*a, **opts)  # type: ignore[arg-type]
    stream = torch.cuda.current_stream(gpu_device).cuda_stream
    kept = dp._KEPT[(gpu_device.index or 0, stream)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, h = dc.chunk_gated_delta_rule(*a, **opts)  # type: ignore[arg-type]
    assert h is not None
    b = inputs()
    for t, u in zip(a, b, strict=True):
        t.copy_(u)
    graph.replay()
    c = inputs()
    dc.chunk_gated_delta_rule(*c, **opts)  # type: ignore[arg-type]  # an eager call on the kept workspace
    assert dp._KEPT[(gpu_device.index or 0, stream)] is kept
    torch.cuda.synchronize(gpu_device)
    ref_o, ref_h = dc.chunk_gated_delta_rule(*b, **opts)  # type: ignore[arg-type]
    assert ref_h is not None
    assert torch.equal(o, ref_o) and torch.equal(h, ref_h)
