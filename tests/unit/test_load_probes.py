"""The probe load test's pure parts (`clef_devcluster.load.probes`): the models it creates are
specs the operator accepts, in endpoint mode with a watch, and the one hostPath they mount is the
one the admission policy is opened for."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from clef_devcluster.load import probes
from clef_operator.api import ClefModelSpec, VerificationMode

POLICY = {
    "kind": "ValidatingAdmissionPolicy",
    "metadata": {"name": "clef-operator-host-paths"},
    "spec": {"variables": [{"name": "allowed", "expression": "[]"}, {"name": "outside", "expression": "x"}]},
}
OTHER = {
    "kind": "ValidatingAdmissionPolicy",
    "metadata": {"name": "clef-operator-fence"},
    "spec": {"variables": []},
}


def test_the_seed_and_the_rest_are_endpoint_models_the_operator_accepts(tmp_path: Path) -> None:
    for image in (probes.SEED_ENGINE, probes.KWOK_ENGINE):
        body = probes.probed_model("m", image, probes.checkpoint_dir(tmp_path), 600)
        spec = ClefModelSpec.model_validate(body["spec"])
        assert spec.verification.mode is VerificationMode.ENDPOINT and spec.image == image
        assert spec.verification.watch is not None and spec.verification.watch.interval_seconds == 600
        assert body["spec"]["model"]["volume"]["hostPath"]["path"] == str(tmp_path / "probe-checkpoint")


def test_only_the_host_paths_policy_is_opened_and_only_for_the_checkpoint(tmp_path: Path) -> None:
    docs = [copy.deepcopy(POLICY), copy.deepcopy(OTHER)]
    out = probes.allow_checkpoint(docs, tmp_path)
    assert json.loads(out[0]["spec"]["variables"][0]["expression"]) == [str(probes.checkpoint_dir(tmp_path))]
    assert out[0]["spec"]["variables"][1] == POLICY["spec"]["variables"][1]
    assert out[1] == OTHER
