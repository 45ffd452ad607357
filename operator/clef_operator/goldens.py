"""Goldens for endpoint verification: which ones a spec needs, the Job that makes them, how they
are stored and when they are trusted.  Pure: `kube` reads the pod's log and the ConfigMaps.

* **Key.**  What the operator knows before any Job runs: the runtime image (as written), the dtype,
  the checkpoint's identity (its volume source, subPath and path: the weights are not read by the
  operator), the prompt set asked for (built-in choice, extra prompts, the new-token cap) and top-k.
  What only the Job knows (the checkpoint's sha256 digest, the runtime version, the prompt-set
  digest after templating, the GPU class) comes back in its report and is kept, signed, with the
  goldens.  Goldens are reused by every later image of the model while the key holds.
* **Transport.**  The Job (`clef-runtime goldens --out -`) prints the file, one JSON line, to
  stdout and a compact report (sha256, size, provenance) to its termination message.  The operator
  reads the log of the pod that belongs to the Job's UID and takes the line whose sha256 and size
  are the report's: a cut or mixed log matches nothing (`GoldensInvalid`).
* **Storage.**  One immutable ConfigMap `<model>-goldens-<key>` owned by the ClefModel: the file
  gzip-compressed in `binaryData` (at most MAX_STORED_BYTES, under the API server's 1 MiB), and an
  annotation with what it holds, HMAC-signed with the verdict key.
* **Trust.**  Every use re-checks the signature, the data's presence, size and sha256.  Goldens
  that fail any check are never used: the verification fails closed (`GoldensUntrusted`, saying
  which check), the ConfigMap is deleted, and a re-verify makes new ones.
"""

from __future__ import annotations

import base64
import copy
import gzip
import hashlib
import hmac
import json
import zlib
from dataclasses import dataclass
from typing import Any

from clef_contract.command import TERMINATION_LOG, TERMINATION_LOG_ENV
from clef_contract.goldens import STDOUT, GoldensReport, parse_goldens_report
from clef_contract.report import ReportInvalid, ReportMissing
from clef_operator import labels
from clef_operator.api import BuiltinPrompts, ClefModelSpec, EndpointSpec, Step
from clef_operator.conditions import Reason
from clef_operator.observed import ConfigMapState, JobState, ModelRef, PodState
from clef_operator.render import (
    TMP_MOUNT,
    TMP_VOLUME,
    VERIFIER_CONTAINER_SECURITY,
    VERIFIER_MODEL_PATH,
    VERIFIER_POD_SECURITY,
    Owner,
    env_with,
    job_manifest,
    model_volume,
    object_labels,
    scheduling,
    verifier_pull_policy,
)
from clef_operator.revision import pinned_reference, short_hash

GOLDENS_CONTAINER = "goldens"
GOLDENS_FILE = "goldens.json.gz"
TOP_K = 5
# The file as printed (uncompressed): what the operator reads of a log at most.
MAX_GOLDENS_BYTES = 16 * 1024 * 1024
# Compressed, in one ConfigMap: the API server refuses more than 1 MiB of data per object.
MAX_STORED_BYTES = 1000 * 1000


def endpoint_of(spec: ClefModelSpec) -> EndpointSpec:
    """The endpoint options (admission requires them, with a runtime image, in endpoint modes)."""
    endpoint = spec.verification.endpoint
    assert endpoint is not None and endpoint.runtime_image, "admission requires endpoint.runtimeImage"
    return endpoint


def goldens_key(spec: ClefModelSpec) -> str:
    endpoint = endpoint_of(spec)
    volume = spec.model.volume.to_wire() if spec.model.volume is not None else None
    return short_hash(
        {
            "runtimeImage": endpoint.runtime_image,
            "dtype": spec.dtype.value,
            "checkpoint": {"path": spec.model.path, "volume": volume},
            "argv": goldens_argv(spec),
            "topK": TOP_K,
        }
    )


def goldens_name(model: str, key: str) -> str:
    """The goldens Job and ConfigMap: `<model>-goldens-<key>` (at most 38 + 9 + 10 characters)."""
    return f"{model}-goldens-{key}"


def goldens_argv(spec: ClefModelSpec) -> list[str]:
    endpoint = endpoint_of(spec)
    argv = ["clef-runtime", "goldens", "--checkpoint", VERIFIER_MODEL_PATH, "--dtype", spec.dtype.value]
    argv += ["--out", STDOUT]
    if endpoint.builtin_prompts is BuiltinPrompts.SHORT:
        argv.append("--no-long")
    elif endpoint.builtin_prompts is BuiltinPrompts.NONE:
        argv.append("--no-builtin")
    if endpoint.prompts:
        prompts = [{"name": p.name, "text": p.text} for p in endpoint.prompts]
        argv += ["--prompts-json", json.dumps({"prompts": prompts}, ensure_ascii=False, sort_keys=True)]
    if endpoint.max_new_tokens is not None:
        argv += ["--max-new-tokens", str(endpoint.max_new_tokens)]
    return argv


def render_goldens_job(owner: Owner, spec: ClefModelSpec, key: str) -> dict[str, Any]:
    """The goldens Job of goldens key `key` (`goldens_key`): one GPU, the runtime image, the
    checkpoint mounted read-only, as the spec schedules its pods."""
    volumes, mounts = model_volume(spec, VERIFIER_MODEL_PATH)
    volumes.append(dict(TMP_VOLUME))
    mounts.append(dict(TMP_MOUNT))
    resources: dict[str, Any] = {"limits": {**spec.resources.limits, labels.GPU_RESOURCE: "1"}}
    if spec.resources.requests:
        resources["requests"] = dict(spec.resources.requests)
    container = {
        "name": GOLDENS_CONTAINER,
        "image": str(endpoint_of(spec).runtime_image),
        "imagePullPolicy": verifier_pull_policy(str(endpoint_of(spec).runtime_image)),
        "command": goldens_argv(spec),
        "env": env_with([], {TERMINATION_LOG_ENV: TERMINATION_LOG, "TRITON_CACHE_DIR": "/tmp/triton"}),
        "resources": resources,
        "volumeMounts": mounts,
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "File",
        "securityContext": copy.deepcopy(VERIFIER_CONTAINER_SECURITY),
    }
    pod_labels = {
        **object_labels(owner.name, labels.COMPONENT_VERIFICATION),
        labels.STEP: Step.GOLDENS.value,
        labels.GOLDENS_KEY: key,
    }
    pod = {
        **scheduling(spec),
        "restartPolicy": "Never",
        "securityContext": copy.deepcopy(VERIFIER_POD_SECURITY),
        "containers": [container],
        "volumes": volumes,
    }
    return job_manifest(owner, goldens_name(owner.name, key), pod_labels, {}, spec, pod)


# ------------------------------------------------------------------------------ storing


@dataclass(frozen=True)
class Unusable:
    """Why the goldens Job's output (or a stored ConfigMap) cannot be used."""

    reason: str
    message: str


def read_report(pod: PodState) -> GoldensReport | Unusable:
    try:
        report = parse_goldens_report(pod.termination_message)
    except ReportMissing as exc:
        return Unusable(Reason.GOLDENS_INVALID, f"the goldens pod {pod.name} left no report: {exc}")
    except ReportInvalid as exc:
        return Unusable(Reason.GOLDENS_INVALID, f"the goldens pod {pod.name} left an invalid report: {exc}")
    return report


def find_file(log: bytes, report: GoldensReport) -> bytes | None:
    """The line of `log` whose bytes (with their newline) have the report's size and sha256."""
    for line in log.split(b"\n"):
        if len(line) + 1 != report.bytes:
            continue
        data = line + b"\n"
        if "sha256:" + hashlib.sha256(data).hexdigest() == report.sha256:
            return data
    return None


def _signing_payload(model: ModelRef, name: str, meta: str) -> bytes:
    fields = {
        "namespace": model.namespace,
        "name": model.name,
        "uid": model.uid,
        "configMap": name,
        "meta": meta,
    }
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def _sign(secret: bytes, model: ModelRef, name: str, meta: str) -> str:
    return hmac.new(secret, _signing_payload(model, name, meta), hashlib.sha256).hexdigest()


def _checked_file(
    spec: ClefModelSpec, pod: PodState, log: bytes | None
) -> tuple[GoldensReport, bytes] | Unusable:
    """The report of a completed goldens pod and the file its log holds, or why they do not agree."""
    report = read_report(pod)
    if isinstance(report, Unusable):
        return report
    invalid = Reason.GOLDENS_INVALID
    if report.verdict != "pass" or pod.exit_code != 0:
        said = f"{report.verdict} (exit code {pod.exit_code})"
        return Unusable(invalid, f"the goldens Job completed but its report says {said}")
    dtype = report.provenance.get("dtype")
    if dtype != spec.dtype.value:
        return Unusable(invalid, f"the goldens are for dtype {dtype}, not {spec.dtype.value}")
    if report.bytes > MAX_GOLDENS_BYTES:
        return Unusable(
            invalid, f"the goldens are {report.bytes} bytes, more than the {MAX_GOLDENS_BYTES} clef reads"
        )
    if log is None:
        return Unusable(invalid, f"the log of the goldens pod {pod.name} is gone, and the goldens with it")
    data = find_file(log, report)
    if data is None:
        return Unusable(
            invalid,
            f"the log of the goldens pod {pod.name} holds no line of {report.bytes} bytes with {report.sha256}"
            " (the report's): the log was cut or mixed",
        )
    return report, data


def stored_goldens(
    model: ModelRef,
    owner: Owner,
    spec: ClefModelSpec,
    job: JobState,
    pod: PodState,
    log: bytes | None,
    secret: bytes,
    made_at: str,
) -> dict[str, Any] | Unusable:
    """The signed ConfigMap of a completed goldens Job's file, or why there is none."""
    checked = _checked_file(spec, pod, log)
    if isinstance(checked, Unusable):
        return checked
    report, data = checked
    packed = gzip.compress(data, mtime=0)
    if len(packed) > MAX_STORED_BYTES:
        return Unusable(
            Reason.GOLDENS_INVALID,
            f"the goldens take {len(packed)} bytes compressed, more than the {MAX_STORED_BYTES} one ConfigMap"
            " holds: ask fewer prompts or tokens (spec.verification.endpoint)",
        )
    key = goldens_key(spec)
    what = {
        "key": key,
        "sha256": report.sha256,
        "bytes": report.bytes,
        "storedBytes": len(packed),
        "cacheKey": report.cache_key,
        **report.provenance,
        "topK": report.top_k,
        "prompts": report.prompts,
        "tokens": report.tokens,
        "runtimeImage": pinned_reference(str(endpoint_of(spec).runtime_image), pod.image_id) or "",
        "job": job.name,
        "jobUid": job.uid,
        "madeAt": made_at,
    }
    meta = json.dumps(what, sort_keys=True, separators=(",", ":"))
    name = goldens_name(model.name, key)
    annotations = {labels.GOLDENS_META: meta, labels.GOLDENS_SIGNATURE: _sign(secret, model, name, meta)}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": owner.namespace,
            "labels": {**object_labels(owner.name, labels.COMPONENT_GOLDENS), labels.GOLDENS_KEY: key},
            "annotations": annotations,
            "ownerReferences": [owner.reference()],
        },
        "immutable": True,
        "binaryData": {GOLDENS_FILE: base64.b64encode(packed).decode()},
    }


# ------------------------------------------------------------------------------ trusting


@dataclass(frozen=True)
class Trusted:
    """Stored goldens that passed every check: the ConfigMap and what it holds."""

    name: str
    meta: dict[str, Any]

    @property
    def sha256(self) -> str:
        """The signed digest of the goldens file (uncompressed): what a comparison must read."""
        return str(self.meta.get("sha256", ""))

    def describe(self) -> str:
        m = self.meta
        return (
            f"goldens {self.name} ({m.get('prompts')} prompts, {m.get('tokens')} tokens, checkpoint"
            f" {str(m.get('checkpointDigest', ''))[:19]}…, runtime {m.get('runtimeVersion')}, made by Job {m.get('job')})"
        )


def _gunzip(packed: bytes) -> bytes | None:
    inflater = zlib.decompressobj(wbits=31)
    try:
        out = inflater.decompress(packed, MAX_GOLDENS_BYTES + 1)
    except zlib.error:
        return None
    return out if inflater.eof and len(out) <= MAX_GOLDENS_BYTES else None


def _untrusted(cm: ConfigMapState, why: str) -> Unusable:
    return Unusable(Reason.GOLDENS_UNTRUSTED, f"goldens ConfigMap {cm.name}: {why}")


def check_signature(model: ModelRef, key: str, cm: ConfigMapState, secret: bytes) -> Trusted | Unusable:
    """The signature over what the ConfigMap says it holds, for goldens key `key`, without reading
    the data: enough where the verifier itself checks the bytes it reads against the signed
    sha256 (a probe's `endpoint-check --goldens-sha256`), and cheap enough for every pass."""
    meta_text = cm.annotations.get(labels.GOLDENS_META, "")
    signature = cm.annotations.get(labels.GOLDENS_SIGNATURE, "")
    expected = _sign(secret, model, cm.name, meta_text)
    if not meta_text or not hmac.compare_digest(expected, signature):
        return _untrusted(cm, "its signature does not verify (edited, or not made by this operator)")
    meta = json.loads(meta_text)
    if meta.get("key") != key or cm.labels.get(labels.GOLDENS_KEY) != key:
        return _untrusted(cm, f"it was made for goldens key {meta.get('key')}, not {key}")
    return Trusted(cm.name, meta)


def check_stored(model: ModelRef, key: str, cm: ConfigMapState, secret: bytes) -> Trusted | Unusable:
    """Every check, every time: the signature over what the ConfigMap says it holds, then that it
    holds exactly that."""

    def untrusted(why: str) -> Unusable:
        return _untrusted(cm, why)

    signed = check_signature(model, key, cm, secret)
    if isinstance(signed, Unusable):
        return signed
    meta = signed.meta
    packed = cm.binary_data.get(GOLDENS_FILE)
    if packed is None or set(cm.data_keys) or set(cm.binary_data) != {GOLDENS_FILE}:
        return untrusted(f"it does not hold exactly binaryData {GOLDENS_FILE} (missing or extra data)")
    if len(packed) > MAX_STORED_BYTES:
        return untrusted(f"its data is {len(packed)} bytes, more than {MAX_STORED_BYTES}")
    data = _gunzip(packed)
    if data is None:
        return untrusted(
            f"its data is not a complete gzip file of at most {MAX_GOLDENS_BYTES} bytes (corrupt)"
        )
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    if len(data) != meta.get("bytes") or digest != meta.get("sha256"):
        return untrusted(
            f"its data ({len(data)} bytes, {digest}) is not the signed {meta.get('bytes')} bytes"
            f" {meta.get('sha256')} (edited)"
        )
    return Trusted(cm.name, meta)
