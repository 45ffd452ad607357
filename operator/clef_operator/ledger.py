"""The verdict ledgers (verdicts.py): ConfigMap `clef-ledger-<model uid>` in the operator's own
namespace, which a namespace editor cannot write, holding the latest final run of each key.  Read
from the API server once per model, then kept as this operator writes them (with the
resourceVersion each write tests)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clef_operator import labels
from clef_operator.apiclient import MERGE_PATCH
from clef_operator.observed import ModelRef
from clef_operator.verdicts import LEDGER_PREFIX, decode_ledger, encode_ledger, ledger_name

# The ledger ConfigMap's annotation naming the model it is for (its name carries the UID only).
LEDGER_FOR = f"{labels.PREFIX}/ledger-for"

log = logging.getLogger("clef.kube")


class Ledgers:
    """The ledgers of every model, by UID, with their resourceVersion.  `namespace` is the
    operator's (set with the verdict key at start-up: `Kube.load_verdict_key`); `verdict_key`
    says which records are this operator's."""

    def __init__(self, core: client.CoreV1Api, verdict_key: Callable[[], bytes]) -> None:
        self.core = core
        self.verdict_key = verdict_key
        self.namespace = ""
        self._ledgers: dict[str, tuple[dict[str, Any], str]] = {}
        self._lock = threading.Lock()

    def read(self, model: ModelRef) -> dict[str, Any]:
        """The model's verdict ledger (verdicts.py): ConfigMap `clef-ledger-<uid>` in the operator's
        namespace, which a namespace editor cannot write.  Absent: empty.  Records that are not
        this operator's signed final records are left out (and logged)."""
        with self._lock:
            kept = self._ledgers.get(model.uid)
        if kept is not None:
            return dict(kept[0])
        name = ledger_name(model)
        try:
            found: Any = self.core.read_namespaced_config_map(name, self.namespace)
        except ApiException as e:
            if e.status != 404:
                raise
            ledger: dict[str, Any] = {}
            version = ""
        else:
            ledger, problems = decode_ledger(found.data or {}, self.verdict_key(), model)
            for problem in problems:
                log.warning("%s/%s: ledger %s: %s", model.namespace, model.name, name, problem)
            version = found.metadata.resource_version or ""
        with self._lock:
            self._ledgers[model.uid] = (ledger, version)
        return dict(ledger)

    def delete(self, uid: str) -> None:
        """Delete the ledger of a model that is going away (by UID: a model made again under the
        same name starts a new one).  Already gone: nothing to do."""
        if not self.namespace or not uid:
            return
        with self._lock:
            self._ledgers.pop(uid, None)
        try:
            self.core.delete_namespaced_config_map(LEDGER_PREFIX + uid, self.namespace)
        except ApiException as e:
            if e.status != 404:
                raise

    def write(self, model: ModelRef, ledger: Mapping[str, Any]) -> None:
        """Write the model's ledger: a merge patch with the resourceVersion this operator read or
        wrote last as its precondition (keys it dropped sent as null), or a create when there is
        none.  A conflict forgets what was kept and raises: the pass is retried on a fresh read."""
        with self._lock:
            before, version = self._ledgers.get(model.uid, ({}, ""))
        name = ledger_name(model)
        data: dict[str, str | None] = {k: None for k in before if k not in ledger}
        data.update(encode_ledger(ledger))
        meta = {
            "name": name,
            "namespace": self.namespace,
            "labels": {labels.MANAGED_BY: labels.MANAGED_BY_VALUE, labels.COMPONENT: labels.COMPONENT_LEDGER},
            "annotations": {LEDGER_FOR: f"{model.namespace}/{model.name}"},
        }
        try:
            if version:
                patch = {"metadata": {"resourceVersion": version, "labels": meta["labels"]}, "data": data}
                written: Any = self.core.patch_namespaced_config_map(
                    name, self.namespace, patch, _content_type=MERGE_PATCH
                )
            else:
                body: Any = {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": meta,
                    "data": encode_ledger(ledger),
                }
                written = self.core.create_namespaced_config_map(self.namespace, body)
        except ApiException:
            with self._lock:
                self._ledgers.pop(model.uid, None)
            raise
        with self._lock:
            self._ledgers[model.uid] = (dict(ledger), written.metadata.resource_version or "")
