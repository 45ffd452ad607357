"""Label and annotation keys: the contract with the harness, kubectl users and dashboards
(docs/architecture.md, "Labels and names")."""

from __future__ import annotations

PREFIX = "clef.riotpiao.com"

MODEL = f"{PREFIX}/model"
# On verification pods (kernels verify, goldens, comparison) in place of MODEL: they never serve,
# so they carry no label that a Service selecting a model's serving pods would match.
VERIFIES = f"{PREFIX}/verifies"
# On the pods of a serving Deployment (its template and selector) in place of MODEL: MODEL is the
# serving label, which the operator adds to each pod only once its revision holds a signed, passed
# verdict (children.label_verified_pods), so a preview pod is never selected by it.
REVISION_OF = f"{PREFIX}/revision-of"
REVISION = f"{PREFIX}/revision"
COMPONENT = f"{PREFIX}/component"
VERIFICATION_KEY = f"{PREFIX}/verification-key"
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "clef"

COMPONENT_SERVING = "serving"
COMPONENT_VERIFICATION = "verification"
# Endpoint mode: the goldens Job and the CPU-only comparison Job are verification Jobs (their
# pods are verification pods) with a step label: `goldens` or `endpoint`.  The ConfigMap that
# keeps the goldens is component `goldens`.
COMPONENT_GOLDENS = "goldens"
# The verdict ledgers, in the operator's namespace (kube.write_ledger).
COMPONENT_LEDGER = "ledger"
STEP = f"{PREFIX}/verification-step"
GOLDENS_KEY = f"{PREFIX}/goldens-key"
# On a goldens ConfigMap: what it holds (JSON: key, sha256, sizes, provenance, the Job) and the
# HMAC of that with the operator's key; nothing else makes it trusted.
GOLDENS_META = f"{PREFIX}/goldens"
GOLDENS_SIGNATURE = f"{PREFIX}/goldens-signature"
# On a preview Deployment: the verification key it previews, and since when it must become Ready.
PREVIEW_FOR = f"{PREFIX}/preview-for"
PREVIEW_SINCE = f"{PREFIX}/preview-since"
# On a comparison Job: the preview pod it asks (UID, IP, imageID) and the goldens it uses.
PREVIEW_POD_UID = f"{PREFIX}/preview-pod-uid"
PREVIEW_POD_IP = f"{PREFIX}/preview-pod-ip"
PREVIEW_IMAGE_ID = f"{PREFIX}/preview-image-id"
GOLDENS_CONFIGMAP = f"{PREFIX}/goldens-configmap"
# The signed sha256 of the goldens a comparison Job was given (also in its argv, which is binding).
GOLDENS_SHA256 = f"{PREFIX}/goldens-sha256"

# Probes of the serving revision (spec.verification.watch): CPU-only Jobs with the step label
# `probe`; on each, the serving pod it asks (UID, IP, imageID) and which probe of that pod it is.
STEP_PROBE = "probe"
PROBE_POD_UID = f"{PREFIX}/probe-pod-uid"
PROBE_POD_IP = f"{PREFIX}/probe-pod-ip"
PROBE_IMAGE_ID = f"{PREFIX}/probe-image-id"
PROBE_ROUND = f"{PREFIX}/probe-round"

# A verification of the digest that passed, pinned to nodes of one driver version the verdict has
# not seen yet (plan_drivers): a kernels Job with the step label `driver`.  In modes endpoint and
# both (plan_endpoint_drivers) a comparison Job asking a serving pod on that driver in place (the
# probe annotations name the pod), the driver it verifies annotated.
STEP_DRIVER = "driver"
DRIVER = f"{PREFIX}/driver"

# On the ClefModel: any new value asks for a fresh verification of the current spec.
REVERIFY = f"{PREFIX}/reverify"
# On at least one ClefModel of each namespace clef writes children in, set by the operator
# (`anchor`): the admission policy clef-operator-model-namespaces admits clef's children only
# where a ClefModel carries it (kustomize/base/admission.yaml).
NAMESPACE_ANCHOR = f"{PREFIX}/namespace-anchor"
NAMESPACE_ANCHOR_VALUE = "true"

# On the Service: which model drives it and which revision it is meant to select.  Written in the
# same patch as the selector, so a selector that disagrees with it was edited by someone else.
SERVICE_MODEL = f"{PREFIX}/model"
SERVICE_ACTIVE_REVISION = f"{PREFIX}/active-revision"
# On an adopted Service: its selector before clef adopted it (JSON), put back when the ClefModel
# is deleted.
ORIGINAL_SELECTOR = f"{PREFIX}/original-selector"
# On a released Service that had no saved selector: which model left it, and why it selects nothing.
RELEASED_BY = f"{PREFIX}/released-by"

# On serving Deployments: the verdict they were created from, so a rollback needs no Job even
# when the ClefModel's status was lost.
IMAGE = f"{PREFIX}/image"
PINNED_IMAGE = f"{PREFIX}/pinned-image"
VERDICT = f"{PREFIX}/verdict"
VERDICT_SUMMARY = f"{PREFIX}/verdict-summary"
VERIFIED_SUITE = f"{PREFIX}/suite"
VERIFIED_DTYPE = f"{PREFIX}/dtype"
GPU_CLASS = f"{PREFIX}/gpu-class"
# The re-verify run a Deployment's verdict (or a Job) belongs to: each new reverify value is a new run.
REVERIFY_RUN = f"{PREFIX}/reverify-run"
VERIFIED_AT = f"{PREFIX}/verified-at"
VERIFIED_GENERATION = f"{PREFIX}/verified-generation"
# The driver of the node the verdict ran on (signed): what a revision's serving pods are held to.
VERIFIED_NODE_DRIVER = f"{PREFIX}/verified-node-driver"
VERIFICATION_JOB = f"{PREFIX}/verification-job"
VERIFICATION_JOB_UID = f"{PREFIX}/verification-job-uid"
VERIFIER = f"{PREFIX}/verifier"
# On serving Deployments, with the verdict: the step that concluded it (kernels or endpoint).
VERIFICATION_STEP = STEP
# HMAC of the verdict with the operator's key (verdicts.sign): what makes an annotation evidence.
VERDICT_SIGNATURE = f"{PREFIX}/verdict-signature"
# On serving Deployments: the pod template clef rendered (JSON), trusted only while its pod spec
# hashes to the revision (which the Deployment's immutable selector carries), so drift of any
# revision, also one the current spec no longer renders, is reverted to it.
POD_TEMPLATE = f"{PREFIX}/pod-template"
# When a revision that no longer serves may be scaled to 0 (RFC 3339).
SCALE_DOWN_AT = f"{PREFIX}/scale-down-at"

# Node labels published by NVIDIA's GPU feature discovery.
NODE_GPU_PRODUCT = "nvidia.com/gpu.product"
NODE_GPU_MEMORY = "nvidia.com/gpu.memory"
# The node's NVIDIA driver and CUDA runtime (user space), as GPU feature discovery reports them;
# older releases publish the driver only in the three deprecated parts.
NODE_DRIVER_VERSION = "nvidia.com/cuda.driver-version.full"
NODE_DRIVER_PARTS = (
    "nvidia.com/cuda.driver.major",
    "nvidia.com/cuda.driver.minor",
    "nvidia.com/cuda.driver.rev",
)
NODE_CUDA_RUNTIME = "nvidia.com/cuda.runtime-version.full"
GPU_RESOURCE = "nvidia.com/gpu"


def selector(model: str, revision: str) -> dict[str, str]:
    """The Service's selector: the verified pods (MODEL) of one revision."""
    return {MODEL: model, REVISION: revision}


def pod_selector(model: str, revision: str) -> dict[str, str]:
    """A serving Deployment's selector: every pod of the revision, verified or not."""
    return {REVISION_OF: model, REVISION: revision}
