"""Revisions, verification keys and the names derived from them.

- A serving **revision** is a hash of the rendered serving pod template: by construction it
  changes exactly when something that changes the serving pod changes (image digest, argv, env,
  dtype, kvFraction, GPUs, volumes, scheduling), and never for replicas or Service settings.
  The image in that template is the verified digest, so a tag that moved and passed again gets a
  Deployment of its own and goes through blue-green like any other change.
- A **verification key** is a hash of the rendered verification pod (image as written, verify
  argv, scheduling, GPUs, env): a verdict answers "did this image pass this suite at this dtype on
  this kind of node", and the key is the question.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

REVISION_LENGTH = 10
REVERIFY_SUFFIX_LENGTH = 6

_DIGEST = re.compile(r"sha256:[a-f0-9]{64}")


def short_hash(value: Any, length: int = REVISION_LENGTH) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:length]


def deployment_name(model: str, revision: str) -> str:
    return f"{model}-{revision}"


def job_name(model: str, key: str, run: str) -> str:
    """`<model>-verify-<key>`, plus a short suffix per re-verify run so each gets its own Job."""
    name = f"{model}-verify-{key}"
    if run:
        name += "-" + run[:REVERIFY_SUFFIX_LENGTH]
    return name


def repository(image: str) -> str:
    """The image reference without tag or digest: `reg:5000/a/b:tag@sha256:..` -> `reg:5000/a/b`."""
    without_digest = image.split("@", 1)[0]
    head, _, last = without_digest.rpartition("/")
    last = last.split(":", 1)[0]
    return f"{head}/{last}" if head else last


def digest_of(image_id: str | None) -> str | None:
    """The `sha256:...` digest in a pod's `imageID`, whatever the runtime's prefix
    (`docker-pullable://repo@sha256:..`, `repo@sha256:..`, `sha256:..`); None if there is none."""
    if not image_id:
        return None
    found = _DIGEST.findall(image_id)
    return found[-1] if found else None


def pinned_reference(image: str, image_id: str | None) -> str | None:
    """`repo@sha256:<digest>` for the image a verification pod ran, or None when unknown."""
    digest = digest_of(image_id)
    return f"{repository(image)}@{digest}" if digest else None
