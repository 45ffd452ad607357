"""Issue 13: a verdict speaks for one scope, is signed by the operator, and comes from the Job's
own pod; each re-verify request is a new run; a user-supplied verifier is never called clef's."""

from __future__ import annotations

from dataclasses import replace

import pytest
from clef_builders import GOOD, GOOD2, T0, VERDICT_KEY, World, digest_for, make_spec, passed_record, report

from clef_operator import labels
from clef_operator.actions import CreateJob, Event
from clef_operator.api import ClefModelStatus, Dtype, Suite, Verdict, VerificationRecord, Verifier
from clef_operator.apiclient import operator_namespace
from clef_operator.conditions import Reason
from clef_operator.observed import JobState, ModelRef, Observed, PodState
from clef_operator.render import gpu_pin, render_serving_pod_spec, serving_revision
from clef_operator.renderings import verification_key
from clef_operator.revision import job_name
from clef_operator.verdicts import (
    MAX_MARKER,
    collect_verdicts,
    fingerprint,
    is_trusted,
    reverify_marker,
    run_id,
    sign,
    signing_payload,
    verifier_of,
)
from clef_operator.verification import Outcome, judge

MODEL = ModelRef("clef-flash", "default", "uid-1", 1)
V100 = "Tesla-V100-SXM2-16GB"
DIGEST_IMAGE = f"registry.clef.test/clef-runtime@{digest_for(GOOD)}"


def record(**changes: object) -> VerificationRecord:
    return passed_record(**changes)


# ------------------------------------------------------------------------------ signatures


def test_a_signed_record_verifies_and_an_unsigned_one_does_not():
    assert is_trusted(VERDICT_KEY, MODEL, sign(VERDICT_KEY, MODEL, record()))
    assert not is_trusted(VERDICT_KEY, MODEL, record())


@pytest.mark.parametrize(
    "change",
    [
        {"key": "k2"},
        {"image": GOOD2},
        {"digest": "registry.clef.test/clef-runtime@" + digest_for("other")},
        {"gpu_class": "NVIDIA-L4"},
        {"dtype": Dtype.BF16},
        {"suite": Suite.FULL},
        {"verifier": Verifier.CUSTOM},
        {"verdict": Verdict.FAILED},
        {"reason": Reason.KERNEL_MISMATCH},
        {"job": "other-job"},
        {"job_uid": "other-uid"},
        {"finished_at": "2030-01-01T00:00:00+00:00"},
        {"run": "abc"},
        {"superseded": True},
        {"node_driver": "570.86.15"},
    ],
    ids=lambda c: next(iter(c)),
)
def test_editing_any_field_a_verdict_speaks_for_voids_its_signature(change):
    signed = sign(VERDICT_KEY, MODEL, record())
    assert not is_trusted(VERDICT_KEY, MODEL, signed.model_copy(update=change))


def test_the_driver_a_pass_ran_on_is_signed_since_it_decides_where_pods_serve():
    signed = sign(VERDICT_KEY, MODEL, record(node_driver="550.127.05"))
    assert is_trusted(VERDICT_KEY, MODEL, signed)
    for edited in ("570.86.15", None):
        assert not is_trusted(VERDICT_KEY, MODEL, signed.model_copy(update={"node_driver": edited}))


def test_a_signature_is_for_one_model_and_one_key():
    signed = sign(VERDICT_KEY, MODEL, record())
    assert not is_trusted(VERDICT_KEY, replace(MODEL, uid="uid-2"), signed), "a recreated model"
    assert not is_trusted(VERDICT_KEY, replace(MODEL, namespace="other"), signed)
    assert not is_trusted(b"another-operators-key-32-bytes!!", MODEL, signed)


def test_descriptive_fields_are_not_signed_but_the_payload_is_canonical():
    signed = sign(VERDICT_KEY, MODEL, record())
    assert is_trusted(VERDICT_KEY, MODEL, signed.model_copy(update={"summary": "edited", "device": "x"}))
    assert signing_payload(MODEL, record()) == signing_payload(MODEL, record())
    assert VERDICT_KEY not in signing_payload(MODEL, record())


def test_a_forged_record_in_status_is_ignored_dropped_and_announced_once():
    forged = record(signature="0" * 64)
    status = ClefModelStatus(verifications=[forged])
    verdicts = collect_verdicts(MODEL, "k1", status, [], VERDICT_KEY)
    assert verdicts.current is None and verdicts.records == ()
    assert [i.fingerprint for i in verdicts.new_ignored()] == [fingerprint(forged)]
    again = collect_verdicts(
        MODEL, "k1", status.model_copy(update={"ignored_verdicts": [fingerprint(forged)]}), [], VERDICT_KEY
    )
    assert again.new_ignored() == (), "announced once"


def test_a_forged_passed_record_never_promotes_in_the_planner():
    w = World(make_spec())
    w.status = ClefModelStatus(verifications=[record(key=verification_key(w.spec))])
    p = w.step()
    assert any(isinstance(a, CreateJob) for a in p.actions), "a Job, not the forged record"
    warned = [a for a in p.actions if isinstance(a, Event) and a.reason == "UntrustedVerdictIgnored"]
    assert len(warned) == 1 and warned[0].type == "Warning"
    assert w.status.verifications == [] and w.deployments == {}
    assert [a.reason for a in w.step().actions if isinstance(a, Event)] == [], "once"


# ------------------------------------------------------------------------------ re-verify runs


def test_a_long_reverify_value_is_stored_as_a_bounded_hash():
    long = "x" * 5000
    assert reverify_marker("short") == "short"
    marker = reverify_marker(long)
    assert marker.startswith("sha256:") and len(marker) <= 256 and marker == reverify_marker(long)
    assert reverify_marker("y" * MAX_MARKER) == "y" * MAX_MARKER
    ClefModelStatus(observed_reverify=marker)  # the CRD's bound holds


def test_every_request_is_a_new_run_even_for_a_value_seen_before():
    assert run_id("", 0) == ""
    runs = [run_id("1", 1), run_id("2", 2), run_id("1", 3)]
    assert len(set(runs)) == 3


def test_reverify_1_2_1_runs_a_third_job_and_never_rejudges_the_first():
    w = World(make_spec())
    w.deploy_first()
    jobs = []
    for token in ("1", "2", "1"):
        w.model = replace(w.model, annotations={labels.REVERIFY: token})
        w.step()
        jobs.append(w.current_job())
        w.finish_job(image_id="registry.clef.test/clef-runtime@" + digest_for(f"run-{len(jobs)}"))
        w.step()
        w.settle()
        w.step()
    assert len(set(jobs)) == 3, jobs
    image = w.manifests[w.active_deployment().name]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.endswith(digest_for("run-3")), "the newest run's digest serves"


def test_a_reverify_request_after_status_was_lost_never_reuses_an_earlier_run():
    """status.reverifyRuns is a cache: lost, the run counter starts again, and a value seen
    before (b, after a -> b -> c) would name an earlier run, whose Job (within its TTL) or
    Deployment still answers for it.  A request is a run no child of the model carries."""
    w = World(make_spec())
    w.deploy_first()
    jobs: list[str] = []

    def request(token: str) -> None:
        w.model = replace(w.model, annotations={labels.REVERIFY: token})
        w.step()
        job = w.current_job()
        assert job not in jobs, f"request {token} was answered by the Job of an earlier run"
        jobs.append(job)
        w.finish_job(image_id="registry.clef.test/clef-runtime@" + digest_for(f"run-{len(jobs)}"))
        w.step()
        w.settle()
        w.step()

    for token in ("a", "b", "c"):
        request(token)
    w.status = ClefModelStatus()  # lost: restored from an old backup, or edited by hand
    for token in ("c", "b"):
        request(token)
    image = w.manifests[w.active_deployment().name]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.endswith(digest_for("run-5")), "the newest run's digest serves"


def test_a_reverify_value_too_long_for_status_still_works():
    w = World(make_spec())
    w.deploy_first()
    w.model = replace(w.model, annotations={labels.REVERIFY: "z" * 1000})
    w.step()
    assert w.status.observed_reverify is not None and len(w.status.observed_reverify) <= 256
    assert w.current_job() != job_name("clef-flash", verification_key(w.spec), "")


# ------------------------------------------------------------------------------ scope


def test_the_verification_key_changes_with_the_serving_image_even_with_a_verification_image():
    verify = {"image": "registry.clef.test/verify:1.0"}
    a = make_spec(image=f"registry.clef.test/a@{digest_for('a')}", verification=verify)
    b = make_spec(image=f"registry.clef.test/a@{digest_for('b')}", verification=verify)
    assert verification_key(a) != verification_key(b)


def test_the_gpu_pin_is_part_of_the_serving_pod_and_its_revision():
    spec = make_spec()
    assert gpu_pin(spec, None) == {}
    assert gpu_pin(spec, V100) == {labels.NODE_GPU_PRODUCT: V100}
    pinned = render_serving_pod_spec(spec, DIGEST_IMAGE, V100)
    assert pinned["nodeSelector"] == {labels.NODE_GPU_PRODUCT: V100}
    assert "nodeSelector" not in render_serving_pod_spec(spec, DIGEST_IMAGE)
    assert serving_revision(spec, DIGEST_IMAGE, V100) != serving_revision(spec, DIGEST_IMAGE, "NVIDIA-L4")
    other = make_spec(nodeSelector={"pool": "a"})
    assert gpu_pin(other, V100) == {"pool": "a", labels.NODE_GPU_PRODUCT: V100}


def test_serving_is_pinned_to_the_class_verification_passed_on():
    w = World(make_spec())
    w.deploy_first()
    pod = w.manifests[w.active_deployment().name]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {labels.NODE_GPU_PRODUCT: V100}


def test_a_pass_on_a_node_without_a_gpu_class_fails_closed():
    w = World(make_spec())
    w.step()
    w.finish_job(gpu_product="")
    w.step()
    assert w.condition("Verified")[:2] == ("False", Reason.GPU_CLASS_UNKNOWN)
    assert "nvidia.com/gpu.product" in w.condition("Verified")[2]
    assert w.deployments == {}
    assert w.status.verifications[0].verdict is Verdict.PASSED, "the evidence is kept as it was"


def test_an_explicit_gpu_selector_makes_an_unlabelled_pass_pinnable():
    w = World(make_spec(nodeSelector={labels.NODE_GPU_PRODUCT: V100}))
    w.step()
    w.finish_job(gpu_product="")
    w.step()
    assert w.condition("Verified")[:2] == ("True", Reason.VERIFIED)


# ------------------------------------------------------------------------------ custom verifier


def test_a_custom_verifier_pass_says_so_and_never_uses_clefs_words():
    spec = make_spec(verification={"command": ["/bin/true-verifier"]})
    assert verifier_of(spec) is Verifier.CUSTOM and verifier_of(make_spec()) is Verifier.CLEF
    w = World(spec)
    w.step()
    w.finish_job()
    w.step()
    status, reason, message = w.condition("Verified")[:3]
    assert (status, reason) == ("True", Reason.CUSTOM_VERIFIER_PASSED)
    assert "user-supplied verifier" in message and "/bin/true-verifier" in message
    assert "did not run" in message and "passed the kernels suite" not in message
    assert w.status.verifications[0].verifier is Verifier.CUSTOM


# ------------------------------------------------------------------------------ provenance


def test_only_a_pod_owned_by_the_jobs_uid_speaks_for_it():
    spec = make_spec()
    name = job_name("clef-flash", verification_key(spec), "")
    job = JobState(name, verification_key(spec), uid="job-uid", complete=True)
    stray = PodState(
        name="stray",
        component=labels.COMPONENT_VERIFICATION,
        job_name=name,
        terminated=True,
        exit_code=0,
        termination_message=report(),
        image_id="registry.clef.test/clef-runtime@" + digest_for("stray"),
        node_gpu_product=V100,
        created_at=T0,
    )
    observed = Observed(jobs=(job,), pods=(stray,))
    assert observed.pods_of_job(job) == [], "a label is not ownership"
    judged = judge(spec, job, observed.pods_of_job(job), T0)
    assert isinstance(judged, Outcome) and judged.record.verdict is Verdict.FAILED
    owned = replace(stray, name="own", owner_uids=("job-uid",))
    assert Observed(jobs=(job,), pods=(stray, owned)).pods_of_job(job) == [owned]


# ------------------------------------------------------------------------------ the key's home


def test_the_operator_namespace_is_its_pods_then_the_override(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("POD_NAMESPACE", "clef-system")
    monkeypatch.setenv("CLEF_OPERATOR_NAMESPACE", "elsewhere")
    assert operator_namespace() == "clef-system"
    monkeypatch.delenv("POD_NAMESPACE")
    assert operator_namespace() == "elsewhere"
