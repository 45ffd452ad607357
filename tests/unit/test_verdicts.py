"""verdicts: the one codec of verdicts on Deployment annotations, and which verdicts count."""

from __future__ import annotations

from dataclasses import replace

import pytest
from clef_builders import GOOD, VERDICT_KEY, digest_for, passed_record

from clef_operator import labels
from clef_operator.api import ClefModelStatus, Verdict, VerificationRecord
from clef_operator.observed import DeploymentState, ModelRef
from clef_operator.verdicts import (
    NOT_REQUIRED,
    Verdicts,
    collect_verdicts,
    decode_verdict,
    encode_verdict,
    is_trusted,
    run_id,
    sign,
)

PINNED = f"registry.clef.test/clef-runtime@{digest_for(GOOD)}"


MODEL = ModelRef("clef-flash", "default", "uid-1", 1)


def passed(
    key: str = "k1", gpu_class: str | None = "Tesla-V100-SXM2-16GB", **changes: object
) -> VerificationRecord:
    """A passing verdict as the operator records it: signed with its key."""
    return sign(VERDICT_KEY, MODEL, passed_record(key, gpu_class=gpu_class, **changes))


def collect(key: str, token: str, status: ClefModelStatus, deployments: list[DeploymentState]) -> Verdicts:
    model = replace(MODEL, annotations={labels.REVERIFY: token} if token else {})
    return collect_verdicts(model, key, status, deployments, VERDICT_KEY)


@pytest.mark.parametrize("gpu_class", ["Tesla-V100-SXM2-16GB", None])
def test_a_passing_verdict_round_trips_through_annotations(gpu_class):
    record = passed(gpu_class=gpu_class)
    annotations = encode_verdict(GOOD, PINNED, "run-of-the-deployment", record)
    assert annotations[labels.REVERIFY_RUN] == record.run, "the run the verdict was reached in"
    assert (labels.GPU_CLASS in annotations) == (gpu_class is not None)
    assert decode_verdict(annotations) == record


def test_the_driver_of_the_pass_round_trips_through_annotations():
    record = passed(node_driver="550.127.05")
    annotations = encode_verdict(GOOD, PINNED, "run", record)
    assert annotations[labels.VERIFIED_NODE_DRIVER] == "550.127.05"
    decoded = decode_verdict(annotations)
    assert decoded is not None and decoded.node_driver == "550.127.05"
    assert is_trusted(VERDICT_KEY, MODEL, decoded), "still verifies after the round trip"


def test_the_summary_is_cut_to_fit_an_annotation():
    annotations = encode_verdict(GOOD, PINNED, "", passed(summary="x" * 1000))
    decoded = decode_verdict(annotations)
    assert decoded is not None and decoded.summary == "x" * 256


def test_no_verdict_is_written_as_not_required_and_reads_back_as_none():
    annotations = encode_verdict(GOOD, GOOD, "", None)
    assert annotations[labels.VERDICT] == NOT_REQUIRED
    assert labels.VERIFICATION_KEY not in annotations
    assert decode_verdict(annotations) is None


@pytest.mark.parametrize(
    "key",
    [
        labels.VERIFICATION_KEY,
        labels.IMAGE,
        labels.PINNED_IMAGE,
        labels.VERIFIED_DTYPE,
        labels.VERIFIED_SUITE,
    ],
)
def test_a_verdict_missing_a_required_annotation_does_not_count(key):
    annotations = encode_verdict(GOOD, PINNED, "", passed())
    del annotations[key]
    assert decode_verdict(annotations) is None


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (labels.VERIFIED_DTYPE, "f64"),
        (labels.VERIFIED_SUITE, "vibes"),
        (labels.VERDICT, Verdict.FAILED.value),
    ],
)
def test_a_verdict_with_a_malformed_annotation_does_not_count(key, value):
    annotations = {**encode_verdict(GOOD, PINNED, "", passed()), key: value}
    assert decode_verdict(annotations) is None


def deployment(record: VerificationRecord) -> DeploymentState:
    return DeploymentState(
        name="clef-flash-rev",
        revision="rev",
        replicas=0,
        annotations=encode_verdict(GOOD, PINNED, record.run, record),
    )


def test_a_verdict_on_a_deployment_answers_when_status_was_lost():
    verdicts = collect("k1", "", ClefModelStatus(), [deployment(passed())])
    assert verdicts.current == passed()
    assert verdicts.records == (passed(),), "status keeps it again"
    assert not verdicts.reverify_requested


def test_a_reverify_request_supersedes_the_verdicts_of_the_current_key_only():
    status = ClefModelStatus(verifications=[passed("k1"), passed("k2")])
    verdicts = collect("k1", "again", status, [deployment(passed("k1"))])
    assert verdicts.current is None, "neither status nor the Deployment made before the request counts"
    assert verdicts.reverify_requested
    assert [r.superseded for r in verdicts.records] == [True, False]
    assert all(is_trusted(VERDICT_KEY, MODEL, r) for r in verdicts.records), "re-signed when superseded"
    assert verdicts.passed("k2") == passed("k2")


def test_a_deployment_made_after_the_reverify_request_counts():
    status = ClefModelStatus(observed_reverify="again", reverify_runs=1)
    made = passed(run=run_id("again", 1))
    verdicts = collect("k1", "again", status, [deployment(made)])
    assert verdicts.current == made
    assert not verdicts.reverify_requested, "the request was seen on an earlier pass"


def test_gpu_memory_comes_from_a_verdict_of_the_key():
    status = ClefModelStatus(
        verifications=[passed("k2", gpu_memory_mib=80000), passed("k1", gpu_memory_mib=16384)]
    )
    assert collect("k1", "", status, []).gpu_memory_mib("k1") == 16384
    assert collect("k1", "", status, []).gpu_memory_mib("k3") is None
