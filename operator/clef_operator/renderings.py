"""What one pass renders from the spec alone, rendered once at its start (`renderings`) and handed
to the phases, which render nothing of it again: the verification pod, the verification key, the
serving pod of spec.image where the key speaks for it, the goldens key.

The verification key is the scope a verdict speaks for (docs/architecture.md, "The operator":
revisions and verification keys).  What depends on a verdict (the serving Deployment pinned to the
digest and GPU class that passed) is rendered later in the pass, once, by the phase that decides
it (`desired_revision`)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from clef_operator import labels
from clef_operator.api import ClefModelSpec, EndpointSpec, VerificationMode, effective_mode
from clef_operator.goldens import goldens_key
from clef_operator.render import Owner, render_serving_pod_spec, render_verification_pod_spec
from clef_operator.revision import short_hash


@dataclass(frozen=True)
class Renderings:
    """The spec's renderings of one pass.  `tag_pod`: the serving pod of spec.image as written,
    unpinned, where the engine is asked (else None); `goldens`: the goldens key where the spec
    has endpoint options (else "")."""

    owner: Owner
    mode: VerificationMode
    key: str
    verification_pod: dict[str, Any]
    tag_pod: dict[str, Any] | None = None
    goldens: str = ""
    # What `tag_pod` was rendered for: spec.image, and the GPU class spec.nodeSelector names.
    tag: str = ""
    tag_class: str | None = None

    def serving_pod(
        self, image: str, gpu_class: str | None, drivers: tuple[str, ...] | None = None
    ) -> dict[str, Any] | None:
        """The serving pod of `image` on `gpu_class` and `drivers` (`render_serving_pod_spec`), if
        it is `tag_pod`: spec.image on the class spec.nodeSelector already names, no driver pin."""
        same = image == self.tag and gpu_class in (None, self.tag_class) and drivers is None
        return copy.deepcopy(self.tag_pod) if self.tag_pod is not None and same else None


def renderings(owner: Owner, spec: ClefModelSpec) -> Renderings:
    """Everything of `spec` a pass renders before it knows a verdict, each once."""
    mode = effective_mode(spec)
    asks = mode is not VerificationMode.KERNELS and spec.verification.required
    tag_pod = render_serving_pod_spec(spec, spec.image) if asks else None
    verification_pod = render_verification_pod_spec(spec)
    endpoint = spec.verification.endpoint
    goldens = goldens_key(spec) if endpoint is not None and endpoint.runtime_image else ""
    key = key_of(mode, spec.image, endpoint, verification_pod, tag_pod)
    tag_class = spec.node_selector.get(labels.NODE_GPU_PRODUCT)
    return Renderings(owner, mode, key, verification_pod, tag_pod, goldens, spec.image, tag_class)


def verification_key(spec: ClefModelSpec) -> str:
    """The verification key of `spec` alone (`renderings` gives the pass's)."""
    return renderings(Owner("", "", ""), spec).key


def key_of(
    mode: VerificationMode,
    image: str,
    endpoint: EndpointSpec | None,
    verification_pod: dict[str, Any],
    tag_pod: dict[str, Any] | None,
) -> str:
    """The scope a verdict speaks for: the verification pod (image, verifier, suite, dtype, shape,
    scheduling, env) and the serving `image` (spec.image), which the pod does not hold when a
    separate spec.verification.image runs: a new spec.image always needs a verdict of its own.
    Where the engine is asked (`tag_pod`, the serving pod of spec.image as rendered: engine argv,
    env, dtype, kvFraction, scheduling), also that pod, and the question (`endpoint`: runtime
    image, prompts, tokens)."""
    kernels = {"verification": verification_pod, "serving": image}
    if tag_pod is None:
        return short_hash(kernels)
    timeouts = {"request_timeout_seconds", "ready_timeout_seconds"}
    question = endpoint.model_dump(mode="json", exclude=timeouts) if endpoint is not None else None
    return short_hash(
        {
            "mode": mode.value,
            "serving": image,
            "servingPod": tag_pod,
            "endpoint": question,
            "kernels": kernels if mode is VerificationMode.BOTH else None,
        }
    )
