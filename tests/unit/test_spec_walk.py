"""The walk of `spec` through one reconcile (issue 35): which modules a pass visits with the
ClefModelSpec in hand, and how often it renders each object.

`sys.settrace` follows one `plan_rollout` call.  A *stop* is a change of module among the calls
that receive the spec: as an argument, or as a field of an argument (a context object that
carries it).  A stop in a module the walk has already left is a *return*.  A *rendering* is a
call of a function named `render_*` or `*_key` in clef's operator; the same function giving the
same result twice in one pass is the same object rendered twice.

Each scenario (seven) is a model at rest or mid-way, built through the planner itself (`World`), so the
walk is that of a real pass.  Run with `-s` to see every walk printed."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import pytest
from clef_builders import GOOD2, VERDICT_KEY, World, make_spec
from test_endpoint_flow import RUNTIME, check_job, endpoint_message, endpoint_spec, to_comparison
from test_plan_drivers import NEW, _deployed, _node
from test_plan_watch import INTERVAL, serving

from clef_operator.api import ClefModelSpec
from clef_operator.rollout import plan_rollout

MAX_STOPS = 20
PACKAGE = "clef_operator"


@dataclass
class Walk:
    stops: list[tuple[str, list[str]]] = field(default_factory=list)
    renders: Counter[tuple[str, str]] = field(default_factory=Counter)
    calls: Counter[str] = field(default_factory=Counter)

    @property
    def returns(self) -> int:
        seen: set[str] = set()
        out = 0
        for module, _ in self.stops:
            out += module in seen
            seen.add(module)
        return out

    def twice(self) -> dict[str, int]:
        """Each function that gave one result more than once: the most times it did."""
        out: dict[str, int] = {}
        for (name, _), n in self.renders.items():
            if n > 1:
                out[name] = max(n, out.get(name, 0))
        return out

    def shown(self) -> str:
        lines = [f"  {m.removeprefix(PACKAGE + '.')}: {', '.join(fs)}" for m, fs in self.stops]
        lines.append(f"  {len(self.stops)} stops, {self.returns} returns; renderings {dict(self.calls)}")
        return "\n".join(lines)


def _holds(value: Any, spec: ClefModelSpec) -> bool:
    if value is spec:
        return True
    if isinstance(value, type):
        return False
    fields = getattr(value, "__dict__", None)
    if fields is None:
        fields = {s: getattr(value, s, None) for s in getattr(type(value), "__slots__", ())}
    return any(v is spec for v in fields.values())


def _is_rendering(module: str, name: str) -> bool:
    return module.startswith(PACKAGE) and (name.startswith("render_") or name.endswith("_key"))


def walk(w: World) -> Walk:
    """One pass of the planner over `w`, traced."""
    spec, observed, out = w.spec, w.observed(), Walk()

    def tracer(frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        module, name = str(frame.f_globals.get("__name__")), frame.f_code.co_name
        if event == "call":
            if any(_holds(v, spec) for v in frame.f_locals.values()):
                if out.stops and out.stops[-1][0] == module:
                    out.stops[-1][1].append(name)
                else:
                    out.stops.append((module, [name]))
            return tracer if _is_rendering(module, name) else None
        if event == "return":
            out.calls[name] += 1
            out.renders[(name, json.dumps(arg, sort_keys=True, default=repr))] += 1
        return None

    before = sys.gettrace()
    sys.settrace(tracer)
    try:
        plan_rollout(w.model, spec, observed, w.status, w.now, VERDICT_KEY)
    finally:
        sys.settrace(before)
    return out


def kernels_served() -> World:
    w = World(make_spec())
    w.deploy_first()
    return w


def kernels_verifying() -> World:
    """Served, and a new image's verification Job running."""
    w = kernels_served()
    w.spec = make_spec(image=GOOD2)
    w.step()
    return w


def kernels_rolling_out() -> World:
    """Served, the new image verified, its candidate Deployment coming up."""
    w = kernels_verifying()
    w.finish_job()
    w.step()
    return w


def kernels_new_driver() -> World:
    """Served, pinned to the driver its pass ran on; a node of another driver just joined."""
    w = _deployed()
    w.nodes.append(_node("worker-9", NEW))
    return w


def endpoint_comparing() -> World:
    """Nothing served yet; the preview answers the comparison Job."""
    w = World(endpoint_spec())
    to_comparison(w)
    return w


def endpoint_served() -> World:
    w = endpoint_comparing()
    w.finish_job(check_job(w), message=endpoint_message(), image=RUNTIME)
    for _ in range(3):
        w.settle()
        w.step()
    return w


def endpoint_probed() -> World:
    """Served under a watch, its probes due."""
    w, _ = serving()
    w.advance(INTERVAL)
    return w


SCENARIOS: dict[str, Callable[[], World]] = {
    "kernels, served": kernels_served,
    "kernels, verifying a new image": kernels_verifying,
    "kernels, rolling out": kernels_rolling_out,
    "kernels, verifying a new driver": kernels_new_driver,
    "endpoint, comparing": endpoint_comparing,
    "endpoint, served": endpoint_served,
    "endpoint, served, probes due": endpoint_probed,
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_one_pass_renders_each_object_once_and_walks_at_most_twenty_stops(scenario: str) -> None:
    w = SCENARIOS[scenario]()
    traced = walk(w)
    print(f"\n{scenario}:\n{traced.shown()}")
    assert traced.stops and traced.stops[0][0] == f"{PACKAGE}.rollout", traced.shown()
    assert traced.calls, "a pass renders something (the verification key at least)"
    assert not traced.twice(), f"rendered more than once: {traced.twice()}\n{traced.shown()}"
    assert len(traced.stops) <= MAX_STOPS, traced.shown()


def test_the_walk_sees_a_spec_passed_inside_a_context_and_a_repeated_rendering() -> None:
    """The tracer itself: a spec carried as a field counts, and a second identical rendering is
    reported (the test above could not fail otherwise)."""
    from clef_operator import renderings

    spec = make_spec()

    @dataclass(frozen=True)
    class Carrier:
        spec: ClefModelSpec

    assert _holds(Carrier(spec), spec) and _holds(spec, spec) and not _holds(make_spec(), spec)
    seen = Walk()

    def tracer(frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        name = frame.f_code.co_name
        if event == "call":
            return tracer if _is_rendering(str(frame.f_globals.get("__name__")), name) else None
        if event == "return":
            seen.renders[(name, json.dumps(arg, sort_keys=True, default=repr))] += 1
        return None

    before = sys.gettrace()
    sys.settrace(tracer)
    try:
        renderings.verification_key(spec)
        renderings.verification_key(spec)
    finally:
        sys.settrace(before)
    assert seen.twice().get("verification_key") == 2
