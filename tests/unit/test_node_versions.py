"""The node's driver and CUDA runtime, as GPU feature discovery labels them, recorded in each
verification record (`observed.node_versions`; recorded, not part of the verification key)."""

from __future__ import annotations

from clef_builders import World, make_spec
from test_endpoint_flow import (
    RUNTIME,
    check_job,
    endpoint_message,
    endpoint_spec,
    finish_goldens,
    preview,
    start_preview_pod,
)

from clef_operator.api import Step
from clef_operator.observed import node_versions

FULL = "nvidia.com/cuda.driver-version.full"
PARTS = {
    "nvidia.com/cuda.driver.major": "550",
    "nvidia.com/cuda.driver.minor": "127",
    "nvidia.com/cuda.driver.rev": "05",
}
RUNTIME_LABEL = "nvidia.com/cuda.runtime-version.full"


def test_the_full_label_is_read_and_the_deprecated_parts_stand_in_for_it() -> None:
    assert node_versions({FULL: "570.86.15", **PARTS, RUNTIME_LABEL: "12.8"}) == ("570.86.15", "12.8")
    assert node_versions(PARTS) == ("550.127.05", "")
    assert node_versions({"nvidia.com/cuda.driver.major": "550"}) == ("", ""), "part of a version is none"
    assert node_versions({}) == ("", "")


def test_an_endpoint_verification_records_the_preview_nodes_driver_and_runtime() -> None:
    w = World(endpoint_spec())
    w.step()
    finish_goldens(w)
    w.step()
    w.step()
    rev = preview(w)
    start_preview_pod(w, rev, node_driver="550.127.05", node_cuda_runtime="12.4")
    w.step()
    w.finish_job(check_job(w), message=endpoint_message(), image=RUNTIME)
    w.step()
    by_step = {r.step: r for r in w.status.verifications}
    for step in (Step.PREVIEW, Step.ENDPOINT):
        assert (by_step[step].node_driver, by_step[step].node_cuda_runtime) == ("550.127.05", "12.4"), step


def test_a_kernels_verification_records_them_and_an_unlabelled_node_records_none() -> None:
    w = World(make_spec())
    w.step()
    job = w.finish_job()
    w.set_job_pod(job, node_driver="570.86.15", node_cuda_runtime="12.8")
    w.step()
    record = w.status.verifications[0]
    assert (record.node_driver, record.node_cuda_runtime) == ("570.86.15", "12.8")
    other = World(make_spec())
    other.step()
    other.finish_job()
    other.step()
    assert (other.status.verifications[0].node_driver, other.status.verifications[0].node_cuda_runtime) == (
        None,
        None,
    )
