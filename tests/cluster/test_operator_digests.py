"""Verdicts belong to digests (issue 6, test 10a): a tag that moves changes nothing that serves
until a re-verify passes on the new digest; a re-verify that fails keeps the verified digest."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from clef_devcluster.images import put_image

from .conftest import Cluster, wait_for
from .operator_support import VERIFY_SECONDS, Models, clefmodel, image_of, operator_running
from .watches import GaplessWatch

pytestmark = pytest.mark.cluster

# The operator's resync, shortened for this test (300 s by default): the quiet window below
# outlasts one, so a resync that re-verified a moved tag would be seen.
RESYNC_SECONDS = 20


def test_moving_tag_serves_only_verified_digests(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    cluster.image_table()
    tag = f"registry.clef.test/clef-runtime:ci-{uuid.uuid4().hex[:8]}"
    first = put_image(cluster.core, tag, "good")
    with operator_running(cluster, namespace, tmp_path, ["--resync-seconds", str(RESYNC_SECONDS)]) as op:
        models = Models(cluster, namespace, op)
        models.create(clefmodel("flash", tag))
        models.wait_condition("flash", "Ready", "True", "Available", timeout=VERIFY_SECONDS + 120)
        status = models.get("flash")["status"]
        assert status["activeImage"] == first.image_id
        serving = models.deployment_of("flash", status["activeRevision"])
        assert image_of(serving) == first.image_id, "serving must name the digest, not the tag"

        # CI republishes the tag.  Nothing re-verifies by itself and nothing new serves.
        second = put_image(cluster.core, tag, "good")
        assert second.image_id != first.image_id
        # Watched without gaps for one full resync of the operator (and woken at once by a change
        # to the ClefModel that is not to its spec): no Job and no Deployment is created, however
        # briefly, and every Deployment keeps running the verified digest.
        selector = "clef.riotpiao.com/model=flash"
        with (
            GaplessWatch(cluster.batch.list_namespaced_job, namespace, label_selector=selector) as jobs,
            GaplessWatch(cluster.apps.list_namespaced_deployment, namespace, label_selector=selector) as deps,
        ):
            models.patch("flash", {"metadata": {"annotations": {"ci.clef.test/poke": "tag moved"}}})
            time.sleep(RESYNC_SECONDS + 5)
        created = [c.name for c in jobs.changes + deps.changes if c.type == "ADDED"]
        assert not created, f"created while nothing asked for a re-verify: {created}"
        moved = [c.name for c in deps.changes if image_of(c.obj) != first.image_id]
        assert not moved, f"a Deployment left the verified digest: {moved}"
        assert models.get("flash")["status"]["activeImage"] == first.image_id

        models.patch("flash", {"metadata": {"annotations": {"clef.riotpiao.com/reverify": "1"}}})
        models.wait_status(
            "flash",
            lambda s: s.get("activeImage") == second.image_id,
            "the re-verified digest to serve",
            VERIFY_SECONDS + 120,
        )
        new_revision = models.get("flash")["status"]["activeRevision"]
        assert new_revision != status["activeRevision"], "a new digest gets its own Deployment"
        wait_for(
            lambda: models.deployment_of("flash", status["activeRevision"]).spec.replicas == 0,
            60,
            "the first digest's revision at 0",
        )

        # The tag moves again, to an image with the key-band fault: the re-verify fails, and the
        # verified digest keeps serving.
        put_image(cluster.core, tag, "fault", fault="conv_key_band_zero")
        models.patch("flash", {"metadata": {"annotations": {"clef.riotpiao.com/reverify": "2"}}})
        verified = models.wait_condition("flash", "Verified", "False", timeout=VERIFY_SECONDS + 60)
        assert verified["reason"] == "KernelMismatch", verified
        status = models.get("flash")["status"]
        assert status["activeImage"] == second.image_id
        assert status["activeRevision"] == new_revision
        assert models.condition("flash", "Ready")["status"] == "True"
