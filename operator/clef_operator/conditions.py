"""The ClefModel's conditions: their types, every reason clef sets on them, and how they are built.

docs/api.md and docs/operations.md explain each type and reason here (tests/unit/test_docs.py and
test_operations_doc.py fail when one is missing).  Which condition says what is decided by the
planner (`plan_status.derive_conditions`); this module only names and builds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError

from clef_operator.api import Condition, ConditionStatus

READY = "Ready"
VERIFIED = "Verified"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
# Only with spec.verification.watch: what the latest probes of the serving pods found.
SERVING = "Serving"
CONDITION_TYPES = (READY, VERIFIED, PROGRESSING, DEGRADED, SERVING)

MAX_MESSAGE = 4096


class Reason:
    """Reasons of Verified (and of Degraded when verification failed or is stuck).  A record in
    `status.verifications` carries one of these too."""

    VERIFIED = "Verified"
    RUNNING = "VerificationRunning"
    PENDING = "VerificationPending"
    NOT_REQUIRED = "VerificationNotRequired"
    KERNEL_MISMATCH = "KernelMismatch"
    IMAGE_PULL_FAILED = "ImagePullFailed"
    TIMEOUT = "VerificationTimeout"
    REPORT_MISSING = "ReportMissing"
    REPORT_INVALID = "ReportInvalid"
    CRASHED = "VerificationCrashed"
    ERROR = "VerificationError"
    DIGEST_UNKNOWN = "ImageDigestUnknown"
    UNSCHEDULABLE = "Unschedulable"
    CONTAINER_CONFIG = "VerificationConfigError"
    # The API server refuses the verification Job's pod (the Job controller's FailedCreate: a
    # RuntimeClass that does not exist, a quota, a LimitRange, Pod Security).
    POD_REJECTED = "VerificationPodRejected"
    # A user-supplied verifier (spec.verification.image or .command) passed: clef's checks did not run.
    CUSTOM_VERIFIER_PASSED = "CustomVerifierPassed"
    # A pass on a node without the nvidia.com/gpu.product label: serving cannot be pinned to it.
    GPU_CLASS_UNKNOWN = "GpuClassUnknown"
    # Endpoint mode (docs/verification.md, "Endpoint verification").
    # The preview's engine answered a golden prompt with other tokens (exit 1).
    ENDPOINT_MISMATCH = "EndpointMismatch"
    # endpoint-check could not judge: timeouts, refused connections, garbage, another prompt
    # template (a prompt-length or prompt-id mismatch), unreadable goldens (exit 2).
    ENDPOINT_CHECK_ERROR = "EndpointCheckError"
    # The preview's engine failed a golden prompt itself: an HTTP 5xx answer or the connection lost
    # while it answered (endpoint-check exit 3): a broken engine, not a numeric mismatch.
    ENGINE_ERROR = "EngineError"
    # The goldens Job failed: the runtime image's kernels failed their own checks (exit 1), or it
    # could not run (exit 2, a crash, its deadline).
    GOLDENS_FAILED = "GoldensFailed"
    # The goldens Job's output cannot be trusted: report missing or invalid, its log gone, cut or
    # not matching the report's sha256 and size, too large to store.
    GOLDENS_INVALID = "GoldensInvalid"
    # Stored goldens failed a check (signature, sha256, size, data): deleted, never used.
    GOLDENS_UNTRUSTED = "GoldensUntrusted"
    # The preview replica did not become Ready within endpoint.readyTimeoutSeconds.
    PREVIEW_NOT_READY = "PreviewNotReady"
    # The preview's engine crash-loops.
    PREVIEW_CRASH_LOOP = "PreviewCrashLoop"
    # The preview pod the comparison asked went away, was replaced or restarted before the verdict.
    PREVIEW_LOST = "PreviewLost"


class Why:
    """Reasons of Ready, Progressing and Degraded."""

    AVAILABLE = "Available"
    PARKED = "Parked"
    NO_ACTIVE = "NoActiveRevision"
    UNAVAILABLE = "RevisionUnavailable"
    CANDIDATE_STARTING = "CandidateStarting"
    STOPPING_OLD = "StoppingOldRevision"
    SCALE_DOWN_PENDING = "ScaleDownPending"
    # An older revision's scale-down is due but waits: the active revision lacks available pods.
    SCALE_DOWN_HELD = "ScaleDownHeld"
    # The candidate is available; this pass patches the Service to select it.
    SWITCHING = "SwitchingService"
    # The active revision's pod template was changed outside clef (reverted in the same pass).
    TEMPLATE_DRIFT = "TemplateDrift"
    # The API server refused a child clef created or changed (its message follows).
    CHILD_REJECTED = "ChildRejected"
    COMPLETE = "RolloutComplete"
    HALTED = "VerificationFailed"
    SERVICE_CONFLICT = "ServiceConflict"
    # The Service was changed or deleted outside clef: this pass puts it back, and nothing can be
    # said to serve behind it until it selects clef's revision again.
    SERVICE_RESTORING = "ServiceRestoring"
    # What is wrong with a pod (`observed.PodState.problem`).
    CRASH_LOOP = "CrashLoopBackOff"
    UNSCHEDULABLE = "Unschedulable"
    IMAGE_PULL = "ImagePullFailed"
    CONTAINER_ERROR = "ContainerError"
    # A serving pod's node reports a driver its revision was not verified on (it changed under the
    # running pod): the pod lost the serving label (`plan_drivers.off_their_drivers`).
    UNVERIFIED_DRIVER = "UnverifiedDriver"
    AS_EXPECTED = "AsExpected"
    # Set by the pass (`reconcile`), not the planner: the stored spec does not validate.
    INVALID_SPEC = "InvalidSpec"
    # Serving (spec.verification.watch; plan_watch): every probed pod answered as the goldens say.
    CONSISTENT = "Consistent"
    # A serving pod answered a golden prompt with other tokens (policy alert: it keeps serving).
    PROBE_MISMATCH = "ProbeMismatch"
    # A serving pod's engine failed a golden prompt (HTTP 5xx, connection lost while answering).
    PROBE_ENGINE_ERROR = "ProbeEngineError"
    # A probe could not judge (it timed out, could not reach the pod, read other goldens).
    PROBE_ERROR = "ProbeError"
    # Policy cordon-pod: a pod whose probe failed lost the serving label and is probed no more.
    POD_CORDONED = "PodCordoned"
    # A serving pod has no finished probe yet.
    PROBE_PENDING = "ProbePending"
    # Nothing is probed: no revision of the current spec serves, or its goldens are not trusted.
    NOT_PROBED = "NotProbed"
    # Policy rollback: the current spec's revision failed in service; the rollback target is
    # being scaled up and switched to.
    ROLLING_BACK = "RollingBack"
    # Policy rollback: the current spec's revision failed in service and no kept revision is
    # verified on its GPU class; failing pods are cordoned, the others keep serving.
    NO_ROLLBACK_TARGET = "NoRollbackTarget"


@dataclass(frozen=True)
class Stamp:
    """Builds the conditions of one reconcile: all stamped `now`, for the spec of `generation`."""

    now: datetime
    generation: int

    def condition(self, type_: str, status: ConditionStatus, reason: str, message: str) -> Condition:
        return Condition(
            type=type_,
            status=status,
            reason=reason,
            message=message[:MAX_MESSAGE],
            last_transition_time=self.now.isoformat(),
            observed_generation=self.generation,
        )


def clause(text: str) -> str:
    """`text` without its closing period, for a message that goes on after it (an engine's or a
    check's own message often ends in one: "... root cause." + ". Re-verify" reads "cause..")."""
    return text.rstrip().rstrip(".")


def merge_conditions(old: list[Condition], new: list[Condition]) -> list[Condition]:
    """`new`, keeping each condition's lastTransitionTime when its status did not change."""
    before = {c.type: c for c in old}
    out = []
    for c in new:
        prev = before.get(c.type)
        if prev is not None and prev.status == c.status:
            c = c.model_copy(update={"last_transition_time": prev.last_transition_time})
        out.append(c)
    return out


def invalid_spec(old: list[Condition], error: ValidationError, at: Stamp) -> list[Condition]:
    """`old` with Degraded=True/InvalidSpec naming the first offending fields.  The CRD's schema
    rejects such specs; only an outdated CRD lets one through, so the message says where to look."""
    problem = "; ".join(
        f"spec.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in error.errors()[:3]
    )
    degraded = at.condition(
        DEGRADED,
        ConditionStatus.TRUE,
        Why.INVALID_SPEC,
        f"{problem}. Is crds/clefmodel.yaml up to date in this cluster?",
    )
    return [*(c for c in old if c.type != DEGRADED), degraded]


def child_rejected(conditions: list[Condition], message: str, at: Stamp) -> list[Condition]:
    """`conditions` with Degraded=True/ChildRejected: the API server refused a child clef made
    (set by the pass, `reconcile`, after the planner's status, in the words of the API server)."""
    degraded = at.condition(DEGRADED, ConditionStatus.TRUE, Why.CHILD_REJECTED, message)
    return merge_conditions(conditions, [*(c for c in conditions if c.type != DEGRADED), degraded])


def carried_rejection(old: list[Condition], new: list[Condition]) -> list[Condition]:
    """`new`, keeping a ChildRejected Degraded from `old`: only a pass whose actions all went
    through may clear it (so the condition does not flap while the refusal persists)."""
    kept = next((c for c in old if c.type == DEGRADED and c.reason == Why.CHILD_REJECTED), None)
    if kept is None:
        return new
    return [*(c for c in new if c.type != DEGRADED), kept]
