"""The ClefModel API (`clef.riotpiao.com/v1alpha1`): pydantic models of spec and status.

These models are the single source of truth for the CRD: `crdgen` turns them (and the CEL rules
attached to their fields) into `crds/clefmodel.yaml`.  Every rule is a `checks.Check`, kept next
to the field it checks and enforced twice: by the API server at admission and by
`ClefModelSpec.model_validate`, which the operator applies to every spec it reads (and which also
fills in the same defaults the API server applied).  The rules refuse whatever Kubernetes would
refuse in a child object (labels, tolerations, quantities, image references, paths), so a stored
ClefModel never gets stuck on a Deployment or Job the API server rejects.

Every status field the operator writes is declared here: the API server prunes undeclared fields
silently, and a pruned status field is a bug that no test of the planner would catch.

The parts, each in its own module: `base` (names, the wire form, shared field rules), `enums`
(the spec's choices, each engine's defaults), `model_source` (`spec.model`), `pods`
(tolerations, resources, env), `verification` (`spec.verification`), `spec` (`ClefModelSpec`
and the rules across its parts) and `status` (`ClefModelStatus`, verification records).  This
package exports every public name of them.
"""

from __future__ import annotations

from clef_operator.api.base import (
    API_VERSION,
    GROUP,
    KIND,
    MAX_MODEL_NAME,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    ApiModel,
    image_reference,
    label_key_rule,
    no_nul,
    unique_names,
    wire_name,
)
from clef_operator.api.enums import (
    DEFAULT_MODE,
    DTYPE_BYTES,
    ENGINE_DIALECT,
    BuiltinPrompts,
    Dtype,
    Engine,
    Strategy,
    Suite,
    VerificationMode,
    WatchPolicy,
)
from clef_operator.api.model_source import (
    Architecture,
    HostPathSource,
    ModelSource,
    ModelVolume,
    PvcSource,
)
from clef_operator.api.pods import (
    EnvVar,
    Resources,
    Toleration,
)
from clef_operator.api.spec import (
    ClefModelSpec,
    RolloutSpec,
    ServiceSpec,
    effective_mode,
)
from clef_operator.api.status import (
    ClefModelStatus,
    Condition,
    ConditionStatus,
    FailingCheck,
    Step,
    Verdict,
    VerificationRecord,
    Verifier,
)
from clef_operator.api.verification import (
    EndpointPrompt,
    EndpointSpec,
    VerificationSpec,
    WatchSpec,
)

__all__ = [
    "API_VERSION",
    "DEFAULT_MODE",
    "DTYPE_BYTES",
    "ENGINE_DIALECT",
    "GROUP",
    "KIND",
    "MAX_MODEL_NAME",
    "PLURAL",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
    "ApiModel",
    "Architecture",
    "BuiltinPrompts",
    "ClefModelSpec",
    "ClefModelStatus",
    "Condition",
    "ConditionStatus",
    "Dtype",
    "EndpointPrompt",
    "EndpointSpec",
    "Engine",
    "EnvVar",
    "FailingCheck",
    "HostPathSource",
    "ModelSource",
    "ModelVolume",
    "PvcSource",
    "Resources",
    "RolloutSpec",
    "ServiceSpec",
    "Step",
    "Strategy",
    "Suite",
    "Toleration",
    "Verdict",
    "VerificationMode",
    "VerificationRecord",
    "VerificationSpec",
    "Verifier",
    "WatchPolicy",
    "WatchSpec",
    "effective_mode",
    "image_reference",
    "label_key_rule",
    "no_nul",
    "unique_names",
    "wire_name",
]
