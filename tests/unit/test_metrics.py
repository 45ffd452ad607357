"""The metric updates of a reconcile pass (`metrics.derive_pass`), over the planner's own passes
(`clef_builders.World`), and the exposition endpoint served on a real socket."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import replace
from datetime import timedelta

import pytest
from clef_builders import FAULTY, GOOD2, KEY_BAND_FAILURE, World, make_spec, report
from test_endpoint_flow import RUNTIME, check_job, endpoint_message, endpoint_spec, to_comparison

from clef_operator import labels
from clef_operator.manager import metrics
from clef_operator.manager.metrics import PassFacts, derive_pass
from clef_operator.observed import ServiceState
from clef_operator.rollout import Plan


class MeteredWorld(World):
    """The planner's passes, each one's metric updates added up as the operator would."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.facts: list[PassFacts] = []

    def step(self) -> Plan:
        before, observed = self.status, self.observed()
        plan = super().step()
        self.facts.append(derive_pass(before, plan.status, plan.actions, observed, self.now))
        return plan

    def settle(self) -> None:
        """As the Deployment controller: every replica available, noted with its timestamp."""
        super().settle()
        for name, d in self.deployments.items():
            if d.available_at is None:
                self.deployments[name] = replace(d, available_at=self.now)

    @property
    def started(self) -> int:
        return sum(f.started for f in self.facts)

    @property
    def completed(self) -> int:
        return sum(f.completed for f in self.facts)

    @property
    def rejected(self) -> Counter[str]:
        return Counter(f.rejected for f in self.facts if f.rejected)

    @property
    def switches(self) -> list[float]:
        return [f.switch_seconds for f in self.facts if f.switch_seconds is not None]

    @property
    def verifications(self) -> list[metrics.VerificationDone]:
        return [v for f in self.facts for v in f.verifications]


def first_deploy(w: MeteredWorld, verify_seconds: float = 42, available_after: float = 3) -> None:
    w.step()
    w.advance(verify_seconds)
    w.finish_job()
    w.step()
    w.settle()
    w.advance(available_after)
    w.step()
    w.step()


def test_a_first_deploy_is_one_rollout_one_pass_and_one_switch():
    w = MeteredWorld(make_spec())
    first_deploy(w)
    assert (w.started, w.completed, w.rejected) == (1, 1, Counter())
    assert w.verifications == [
        metrics.VerificationDone("kernels", "Tesla-V100-SXM2-16GB", "Passed", "Verified", 42.0)
    ]
    assert w.switches == [3.0], "from the candidate available to the Service created for it"
    for _ in range(3):
        w.step()
    assert (w.started, w.completed, len(w.verifications), len(w.switches)) == (1, 1, 1, 1), "steady: nothing"


def test_a_blue_green_update_counts_its_switch_and_its_completion():
    w = MeteredWorld(make_spec())
    first_deploy(w)
    w.spec = w.spec.model_copy(update={"image": GOOD2})
    w.step()
    w.advance(10)
    w.finish_job()
    w.step()
    w.settle()
    w.advance(7)
    w.step()  # the switch
    assert w.switches == [3.0, 7.0]
    w.step()
    w.advance(30)
    w.step()  # the old revision's scale-down
    w.settle()
    w.step()
    assert w.condition("Progressing")[:2] == ("False", "RolloutComplete")
    assert (w.started, w.completed, w.rejected) == (2, 2, Counter())
    assert [v.seconds for v in w.verifications] == [42.0, 10.0]


def test_a_failed_verification_is_one_rejection_by_its_reason_however_many_passes_follow():
    w = MeteredWorld(make_spec())
    first_deploy(w)
    w.spec = w.spec.model_copy(update={"image": FAULTY})
    w.step()
    w.finish_job(exit_code=1, message=report("fail", failing=KEY_BAND_FAILURE, summary="token ids 0/420"))
    for _ in range(4):
        w.step()
    assert w.rejected == Counter({"KernelMismatch": 1})
    assert (w.started, w.completed) == (2, 1)
    assert [(v.outcome, v.reason) for v in w.verifications] == [
        ("Passed", "Verified"),
        ("Failed", "KernelMismatch"),
    ]


def test_a_selector_put_back_is_not_a_switch():
    w = MeteredWorld(make_spec())
    first_deploy(w)
    assert w.service is not None
    w.service = replace(w.service, selector={"app": "something-else"})
    w.step()
    assert w.switches == [3.0]


def test_a_service_conflict_is_a_rejection():
    w = MeteredWorld(make_spec())
    w.service = ServiceState(
        name="clef-serve", selector={labels.MODEL: "coder"}, annotations={labels.SERVICE_MODEL: "coder"}
    )
    first_deploy(w)
    w.step()
    assert w.rejected == Counter({"ServiceConflict": 1})
    assert w.switches == []


def test_a_restarted_operator_counts_nothing_twice():
    """A new process starts from the stored status: what earlier passes counted is in it."""
    w = MeteredWorld(make_spec())
    first_deploy(w)
    counted = list(w.facts)
    w.facts.clear()
    w.step()
    assert w.facts == [PassFacts()]
    assert counted


def test_a_refused_switch_is_not_timed():
    w = MeteredWorld(make_spec())
    w.step()
    w.finish_job()
    w.step()
    w.settle()
    w.advance(5)
    before, observed = w.status, w.observed()
    plan = w.plan()
    assert derive_pass(before, plan.status, plan.actions, observed, w.now).switch_seconds == 5.0
    assert (
        derive_pass(before, plan.status, plan.actions, observed, w.now, refused=True).switch_seconds is None
    )


def test_a_verdict_whose_job_is_gone_is_counted_without_a_duration():
    w = MeteredWorld(make_spec())
    w.step()
    w.finish_job()
    before = w.status
    plan = w.plan()
    observed = replace(w.observed(), jobs=())
    [done] = derive_pass(
        before, plan.status, plan.actions, observed, w.now + timedelta(seconds=1)
    ).verifications
    assert done.outcome == "Passed" and done.seconds is None


def _sample(metric: str, **labels_: str) -> float:
    value = metrics.REGISTRY.get_sample_value(metric, labels_ or None)
    return 0.0 if value is None else value


def test_record_pass_moves_the_counters():
    def read() -> tuple[float, ...]:
        return (
            _sample("clef_rollouts_started_total"),
            _sample("clef_rollouts_rejected_total", reason="VerificationTimeout"),
            _sample(
                "clef_verification_duration_seconds_count",
                suite="kernels",
                step="kernels",
                gpu_class="X",
                outcome="Failed",
            ),
            _sample("clef_candidate_available_to_switch_seconds_sum"),
        )

    before = read()
    metrics.record_pass(
        PassFacts(
            started=True,
            rejected="VerificationTimeout",
            verifications=(metrics.VerificationDone("kernels", "X", "Failed", "VerificationTimeout", 600.0),),
            switch_seconds=2.5,
        )
    )
    after = read()
    assert [b - a for a, b in zip(before, after, strict=True)] == [1, 1, 1, 2.5]


@pytest.mark.parametrize(
    ("value", "address"),
    [("0.0.0.0:9090", ("0.0.0.0", 9090)), (":9090", ("0.0.0.0", 9090)), ("[::1]:80", ("::1", 80))],
)
def test_bind_address(value: str, address: tuple[str, int]):
    assert metrics.parse_bind_address(value) == address


@pytest.mark.parametrize("value", ["9090", "host:", "host:http", ":0", ":70000"])
def test_bad_bind_address_names_the_flag(value: str):
    with pytest.raises(ValueError, match="--metrics-bind-address"):
        metrics.parse_bind_address(value)


def test_the_endpoint_serves_metrics_and_health():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    healthy = [True]
    server = metrics.serve(("127.0.0.1", port), lambda: healthy[0])
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
        assert "# TYPE clef_rollouts_started_total counter" in text
        assert "clef_operator_leader " in text
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            assert r.status == 200
        healthy[0] = False
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)
        assert e.value.code == 503
    finally:
        server.shutdown()
        server.server_close()


def test_a_progressing_model_has_a_since_series_until_it_settles_or_goes():
    w = MeteredWorld(make_spec())
    w.step()
    since = metrics.progressing_since(w.status)
    assert since == w.now.timestamp()
    metrics.record_model("ns", "m", w.status)
    assert _sample("clef_rollout_progressing_since_timestamp_seconds", namespace="ns", name="m") == since
    w.advance(60)
    w.step()
    assert metrics.progressing_since(w.status) == since, "the time it turned True, not the last pass"
    first_deploy(w)
    assert metrics.progressing_since(w.status) is None
    metrics.record_model("ns", "m", w.status)
    assert (
        metrics.REGISTRY.get_sample_value(
            "clef_rollout_progressing_since_timestamp_seconds", {"namespace": "ns", "name": "m"}
        )
        is None
    )
    metrics.record_model("ns", "gone", None)  # a model never seen: nothing to remove, no error


def test_an_endpoint_rollout_counts_each_step_under_its_own_label_and_starts_once():
    w = MeteredWorld(endpoint_spec())
    to_comparison(w)
    w.finish_job(check_job(w), message=endpoint_message(), image=RUNTIME)
    w.step()
    for _ in range(4):
        w.settle()
        w.step()
    assert w.condition("Ready")[0] == "True"
    assert [(v.step, v.outcome) for v in w.verifications] == [
        ("goldens", "Passed"),
        ("preview", "Passed"),
        ("endpoint", "Passed"),
    ]
    assert (w.started, w.completed) == (1, 1), "three step records, one rollout"


def test_a_serving_pod_that_answers_wrongly_has_a_series_until_serving_is_not_false():
    from test_plan_watch import answer, probe_of, serving, wrong_answer

    w, rev = serving()
    metrics.record_model("ns", "watched", w.status)
    assert metrics.serving_failed_since(w.status) is None
    assert _failed_since("watched") is None
    answer(w, probe_of(w, "serving-1"))
    answer(w, probe_of(w, f"preview-{rev}"), wrong_answer(), exit_code=1)
    w.step()
    metrics.record_model("ns", "watched", w.status)
    assert _failed_since("watched") == w.now.timestamp()
    metrics.record_model("ns", "watched", None)
    assert _failed_since("watched") is None


def _failed_since(name: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(
        "clef_serving_failed_since_timestamp_seconds", {"namespace": "ns", "name": name}
    )
