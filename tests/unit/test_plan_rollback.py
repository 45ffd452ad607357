"""Watch policy rollback (`plan_rollback`, `plan_watch`): a probe that finds the serving revision
answering wrong fails its verdict in service, and the newest kept revision verified on the same
GPU class serves again without a Job; with none kept, nothing is rolled back and that is said."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from clef_builders import GOOD2, VERDICT_KEY, World, digest_for
from test_endpoint_flow import RUNTIME, check_job, endpoint_message, preview, start_preview_pod
from test_plan_watch import answer, probe_of, probes, serving, watched_spec, wrong_answer

from clef_operator import labels
from clef_operator.actions import CreateJob, LabelPod, PatchServiceSelector
from clef_operator.api import ClefModelSpec, Step, Verdict, VerificationRecord
from clef_operator.plan_rollback import rollback_target
from clef_operator.verdicts import collect_verdicts, is_trusted

IMAGE2 = f"registry.clef.test/clef-runtime@{digest_for(GOOD2)}"


def with_image(image: str, **watch: Any) -> ClefModelSpec:
    body = watched_spec(2, **watch).to_wire()
    body["image"] = image
    return ClefModelSpec.model_validate(body)


def all_pass(w: World) -> None:
    for name, job in probes(w).items():
        if not job.finished:
            answer(w, name)
    w.step()


def upgrade(w: World, image: str = IMAGE2, gpu: str | None = None, tag: str = "b") -> str:
    """spec.image moves on; its preview passes and serves with two pods (`preview-<rev>` and
    `<tag>-1`), its verdict a minute after the one before."""
    w.advance(60)
    w.spec = with_image(image, policy="rollback")
    w.step()
    rev = preview(w)
    extra = {"node_gpu_product": gpu} if gpu else {}
    start_preview_pod(w, rev, image=image, ip="10.0.0.8", uid=f"{tag}0{tag}0{tag}0{tag}0-0", **extra)
    w.step()
    w.finish_job(
        check_job(w), message=endpoint_message(), image=RUNTIME, gpu_product=gpu or "Tesla-V100-SXM2-16GB"
    )
    w.step()
    w.pods[f"preview-{rev}"] = replace(w.pods[f"preview-{rev}"], revision_of=w.model.name)
    start_preview_pod(w, rev, image=image, name=f"{tag}-1", uid=f"{tag}1{tag}1{tag}1{tag}1-1", ip="10.0.0.31",
                      node_name="worker-2", revision_of=w.model.name, **extra)  # fmt: skip
    for _ in range(3):
        w.settle()
        w.step()
    active = w.active_deployment()
    assert active is not None and active.revision == rev
    return rev


def fail_probe_of(w: World, pod: str) -> None:
    answer(w, probe_of(w, pod, finished=False), wrong_answer(), exit_code=1)


def served_two() -> tuple[World, str, str]:
    """Revision A served and probed clean, then revision B of a new image serves."""
    w, a = serving(policy="rollback")
    all_pass(w)
    b = upgrade(w)
    return w, a, b


def test_a_wrong_answer_fails_the_revision_in_service_and_the_previous_one_serves_without_a_job() -> None:
    w, a, b = served_two()
    key_b = w.status.verification_key
    fail_probe_of(w, f"preview-{b}")
    answer(w, probe_of(w, "b-1", finished=False))
    plan = w.step()
    assert any(isinstance(x, LabelPod) and x.name == f"preview-{b}" for x in plan.actions), "cordoned at once"
    assert plan.requeue_after == 0.0, "the failure is acted on by the next pass, at once"
    failed = w.status.verifications[0]
    assert (failed.key, failed.verdict, failed.step, failed.reason) == (
        key_b,
        Verdict.FAILED,
        Step.PROBE,
        "ProbeMismatch",
    )
    assert failed.job == probe_of(w, f"preview-{b}") and f"preview-{b}" in failed.summary
    assert is_trusted(VERDICT_KEY, w.model, failed), "signed like every verdict"
    assert w.ledger is not None and w.ledger[key_b] == failed, "the ledger's latest run of the key"
    passes = [r for r in w.status.verifications if r.key == key_b and r.verdict is Verdict.PASSED]
    assert passes and all(r.superseded for r in passes), "the pass stays as history only"
    jobs_before = set(w.jobs)
    for _ in range(4):
        w.settle()
        w.step()
    active = w.active_deployment()
    assert active is not None and active.revision == a
    assert {n for n in set(w.jobs) - jobs_before if not n.startswith(f"{w.model.name}-probe-")} == set(), (
        "no verification Job: the older revision's verdict still counts"
    )
    verified = w.condition("Verified")
    assert verified[:2] == ("False", "ProbeMismatch") and "failed in service" in verified[2]
    assert w.condition("Degraded")[0] == "True"
    assert (
        "StaleVerdictIgnored" not in w.event_reasons() and "UntrustedVerdictIgnored" not in w.event_reasons()
    )
    assert w.status.active_spec is None, "what serves is not the current spec"


def test_the_serving_condition_says_rolling_back_until_the_target_serves() -> None:
    w, a, b = served_two()
    fail_probe_of(w, f"preview-{b}")
    answer(w, probe_of(w, "b-1", finished=False))
    w.step()
    w.step()
    status, reason, message = w.condition("Serving")
    assert (status, reason) == ("False", "RollingBack")
    assert (
        f"moving to revision {a}" in message and "failed in service" in message and f"preview-{b}" in message
    )


def test_with_no_earlier_revision_nothing_is_rolled_back_and_the_condition_says_so() -> None:
    w, rev = serving(policy="rollback")
    bad = f"preview-{rev}"
    fail_probe_of(w, bad)
    answer(w, probe_of(w, "serving-1", finished=False))
    w.step()
    plan = w.step()
    assert not any(isinstance(x, PatchServiceSelector) for x in plan.actions)
    active = w.active_deployment()
    assert active is not None and active.revision == rev, (
        "the failed revision still serves from its other pods"
    )
    status, reason, message = w.condition("Serving")
    assert (status, reason) == ("False", "NoRollbackTarget")
    assert "nothing is rolled back" in message and f"{bad}" in message
    assert not w.pods[bad].serving_label and w.pods["serving-1"].serving_label == w.model.name
    # The pods left are still probed.
    w.advance(120)
    plan = w.step()
    created = [x.manifest for x in plan.actions if isinstance(x, CreateJob)]
    assert [m["metadata"]["annotations"][labels.PROBE_POD_UID] for m in created] == [w.pods["serving-1"].uid]


def test_when_the_revision_rolled_back_to_fails_too_the_next_earlier_one_serves() -> None:
    w, a, b = served_two()
    c = upgrade(
        w, f"registry.clef.test/clef-runtime@{digest_for('registry.clef.test/clef-runtime:1.2')}", tag="c"
    )
    assert len({a, b, c}) == 3
    fail_probe_of(w, f"preview-{c}")
    answer(w, probe_of(w, "c-1", finished=False))
    for _ in range(4):
        w.settle()
        w.step()
    active = w.active_deployment()
    assert active is not None and active.revision == b, "the newest kept pass first"
    # Revision b's pods answer wrong as well: a is next.
    w.advance(120)
    w.pods[f"preview-{b}"] = replace(w.pods[f"preview-{b}"], serving_label=w.model.name)
    w.step()
    fail_probe_of(w, f"preview-{b}")
    w.step()
    for _ in range(4):
        w.settle()
        w.step()
    active = w.active_deployment()
    assert active is not None and active.revision == a
    failed = {r.key for r in w.status.verifications if r.step is Step.PROBE}
    assert len(failed) == 2


def test_a_revision_verified_on_another_gpu_class_or_not_counting_is_not_a_target() -> None:
    w, a, b = served_two()
    fail_probe_of(w, f"preview-{b}")
    answer(w, probe_of(w, "b-1", finished=False))
    w.step()
    assert w.ledger is not None
    failed = w.ledger[w.status.verification_key or ""]
    observed = w.observed()

    def target(failed: VerificationRecord, ledger: Any = w.ledger) -> str:
        verdicts = collect_verdicts(
            w.model, failed.key, w.status, observed.deployments, VERDICT_KEY, observed.jobs, ledger
        )
        found = rollback_target(observed.deployments, verdicts, failed)
        return found.revision if found is not None else ""

    assert target(failed) == a
    assert target(failed.model_copy(update={"gpu_class": "NVIDIA-H200"})) == "", "verified on V100 only"
    key_a = next(k for k in w.ledger if k != failed.key)
    gone = {failed.key: failed}
    assert target(failed, gone) == "", "a pass the ledger does not hold does not count"
    assert key_a not in gone


def test_a_reverify_request_lets_the_spec_serve_again_once_it_passes() -> None:
    w, a, b = served_two()
    fail_probe_of(w, f"preview-{b}")
    answer(w, probe_of(w, "b-1", finished=False))
    for _ in range(4):
        w.settle()
        w.step()
    assert w.active_deployment() is not None and w.active_deployment().revision == a  # type: ignore[union-attr]
    w.advance(60)  # later, the node looked at: the pod that answered wrong is still there
    w.model = replace(w.model, annotations={labels.REVERIFY: "after-the-node-was-fixed"})
    w.step()
    assert "ReverifyRequested" in w.event_reasons()
    assert w.condition("Verified")[:2] == ("Unknown", "VerificationRunning"), (
        "the failure in service holds no more"
    )
    active = w.active_deployment()
    assert active is not None and active.revision == a, "the target serves while the spec is verified again"
    check = next(n for n, j in w.jobs.items() if n.startswith(f"{w.model.name}-check-") and not j.finished)
    w.finish_job(check, message=endpoint_message(), image=RUNTIME)
    for _ in range(4):
        w.settle()
        w.step()
    active = w.active_deployment()
    assert active is not None and active.revision == b, "passed again: the spec's revision serves"
    assert w.condition("Verified")[:2] == ("True", "Verified")
