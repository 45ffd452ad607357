"""The goldens file (`goldens/v1`): what the bundled runtime answered, greedily, to each prompt of a
prompt set, with the provenance that says when the file is stale.

One JSON object::

    {"schemaVersion": "clef.riotpiao.com/goldens/v1",
     "provenance": {"checkpointDigest", "dtype", "runtimeVersion", "promptSetDigest", "gpuClass",
                    "opSet", "kernelChecks", "topK", "createdAt", "torch", "triton"},
     "cacheKey": sha256 of what decides the numbers (checkpoint, dtype, prompt set, runtime, op set),
     "stopIds": [...],
     "prompts": [{"name", "kind": "chat" | "tokens", "text" (chat: the one user turn),
                  "promptIds" (chat: after the template, thinking off), "maxNewTokens",
                  "ids", "logprobs", "topIds", "topLogprobs", "topPieces", "finishReason"}]}

`read_goldens` validates everything a comparison relies on (types, lengths, ids in the top-k,
the prompt-set digest recomputed from the prompts) and the size bound, so a truncated, edited or
foreign file is an error, never a comparison against garbage.  Standard library only: the
comparison Job runs without torch.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

GOLDENS_SCHEMA_VERSION: Final = "clef.riotpiao.com/goldens/v1"
# 8 prompts of up to ~8k ids with 64 steps of top-5 each take well under 1 MiB; the bound keeps a
# wrong file from exhausting a small Job's memory.
MAX_GOLDENS_BYTES: Final = 64 * 1024 * 1024
MIN_TOP_K: Final = 5
KINDS: Final = ("chat", "tokens")

PromptKind = Literal["chat", "tokens"]
PROVENANCE_FIELDS: Final = (
    "checkpointDigest",
    "dtype",
    "runtimeVersion",
    "promptSetDigest",
    "gpuClass",
    "opSet",
    "kernelChecks",
    "topK",
    "createdAt",
    "torch",
    "triton",
)


class GoldensError(ValueError):
    """A goldens file that cannot be trusted; the message says which field is wrong."""


@dataclass(frozen=True)
class PromptSpec:
    """A prompt before it is run: a chat turn (rendered with the checkpoint's template, thinking
    off) or raw token ids (only engines that take token-id prompts can be asked these)."""

    name: str
    kind: PromptKind
    text: str  # chat: the user's message; tokens: ""
    prompt_ids: tuple[int, ...]
    max_new_tokens: int

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "text": self.text,
            "promptIds": list(self.prompt_ids),
            "maxNewTokens": self.max_new_tokens,
        }


@dataclass(frozen=True)
class GoldenPrompt:
    spec: PromptSpec
    ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_ids: tuple[tuple[int, ...], ...]
    top_logprobs: tuple[tuple[float, ...], ...]
    top_pieces: tuple[tuple[str, ...], ...]
    finish_reason: str

    @property
    def name(self) -> str:
        return self.spec.name

    def to_json(self) -> dict[str, Any]:
        return {
            **self.spec.to_json(),
            "ids": list(self.ids),
            "logprobs": [round(x, 6) for x in self.logprobs],
            "topIds": [list(t) for t in self.top_ids],
            "topLogprobs": [[round(x, 6) for x in t] for t in self.top_logprobs],
            "topPieces": [list(t) for t in self.top_pieces],
            "finishReason": self.finish_reason,
        }

    def margin(self, position: int, token: int) -> float | None:
        """Golden logprob of the expected id minus that of `token` at `position`; None when
        `token` is not in the golden's top-k there."""
        top = self.top_ids[position]
        if token not in top:
            return None
        return self.logprobs[position] - self.top_logprobs[position][top.index(token)]

    def piece(self, position: int, token: int) -> str | None:
        top = self.top_ids[position]
        return self.top_pieces[position][top.index(token)] if token in top else None


@dataclass(frozen=True)
class Goldens:
    provenance: dict[str, Any]
    cache_key: str
    stop_ids: tuple[int, ...]
    prompts: tuple[GoldenPrompt, ...]

    @property
    def top_k(self) -> int:
        return int(self.provenance["topK"])

    @property
    def compared_tokens(self) -> int:
        return sum(len(p.ids) for p in self.prompts)

    def to_json(self) -> dict[str, Any]:
        return {
            "schemaVersion": GOLDENS_SCHEMA_VERSION,
            "provenance": self.provenance,
            "cacheKey": self.cache_key,
            "stopIds": list(self.stop_ids),
            "prompts": [p.to_json() for p in self.prompts],
        }


def prompt_set_digest(specs: Sequence[PromptSpec]) -> str:
    canonical = json.dumps([s.to_json() for s in specs], sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def cache_key(provenance: dict[str, Any]) -> str:
    """What decides the numbers; GPU class and time only describe where and when."""
    keys = ("checkpointDigest", "dtype", "promptSetDigest", "runtimeVersion", "opSet", "topK")
    canonical = json.dumps({k: provenance[k] for k in keys}, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def goldens_bytes(goldens: Goldens) -> bytes:
    """The file's bytes: one JSON line (GoldensError over the bound)."""
    data = (json.dumps(goldens.to_json(), ensure_ascii=False, separators=(",", ":")) + "\n").encode()
    if len(data) > MAX_GOLDENS_BYTES:
        raise GoldensError(f"goldens would be {len(data)} bytes, more than {MAX_GOLDENS_BYTES}")
    return data


def write_goldens(goldens: Goldens, path: str | Path) -> int:
    """Write the file; returns its size in bytes (GoldensError when over the bound)."""
    data = goldens_bytes(goldens)
    Path(path).write_bytes(data)
    return len(data)


# ---------------------------------------------------------------------------------- reading


def _field(obj: dict[str, Any], key: str, types: type | tuple[type, ...], where: str) -> Any:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, types):  # no field here is a boolean
        names = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        raise GoldensError(f"{where}.{key} is missing or not {names}")
    return value


def _ints(raw: object, where: str, *, nonempty: bool = True) -> tuple[int, ...]:
    if not isinstance(raw, list) or (nonempty and not raw):
        raise GoldensError(f"{where} must be a {'non-empty ' if nonempty else ''}list of token ids")
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in raw):
        raise GoldensError(f"{where} must hold non-negative integer token ids")
    return tuple(raw)


def _floats(raw: object, where: str) -> tuple[float, ...]:
    if not isinstance(raw, list) or not all(
        isinstance(x, int | float) and not isinstance(x, bool) and x <= 0 for x in raw
    ):
        raise GoldensError(f"{where} must be a list of logprobs (numbers ≤ 0)")
    return tuple(float(x) for x in raw)


def _per_step(raw: object, where: str, steps: int) -> list[Any]:
    if not isinstance(raw, list) or len(raw) != steps:
        raise GoldensError(f"{where} must have one entry per generated token ({steps})")
    return raw


def _prompt(raw: object, i: int, top_k: int) -> GoldenPrompt:
    where = f"prompts[{i}]"
    if not isinstance(raw, dict):
        raise GoldensError(f"{where} must be an object")
    name = _field(raw, "name", str, where)
    where = f"prompts[{i}] ({name})"
    kind = _field(raw, "kind", str, where)
    if kind not in KINDS:
        raise GoldensError(f"{where}.kind {kind!r} is not one of {', '.join(KINDS)}")
    max_new = _field(raw, "maxNewTokens", int, where)
    spec = PromptSpec(
        name,
        kind,
        _field(raw, "text", str, where),
        _ints(raw.get("promptIds"), f"{where}.promptIds"),
        max_new,
    )
    ids = _ints(raw.get("ids"), f"{where}.ids")
    if len(ids) > max_new:
        raise GoldensError(f"{where}: {len(ids)} generated ids, more than maxNewTokens {max_new}")
    steps = len(ids)
    logprobs = _floats(raw.get("logprobs"), f"{where}.logprobs")
    _per_step(list(logprobs), f"{where}.logprobs", steps)
    top_ids = tuple(
        _ints(t, f"{where}.topIds") for t in _per_step(raw.get("topIds"), f"{where}.topIds", steps)
    )
    top_lp = tuple(
        _floats(t, f"{where}.topLogprobs")
        for t in _per_step(raw.get("topLogprobs"), f"{where}.topLogprobs", steps)
    )
    pieces_raw = _per_step(raw.get("topPieces"), f"{where}.topPieces", steps)
    if not all(isinstance(t, list) and all(isinstance(s, str) for s in t) for t in pieces_raw):
        raise GoldensError(f"{where}.topPieces must be lists of strings")
    top_pieces = tuple(tuple(t) for t in pieces_raw)
    for s in range(steps):
        if not len(top_ids[s]) == len(top_lp[s]) == len(top_pieces[s]) == top_k:
            raise GoldensError(f"{where}: step {s} does not list exactly topK={top_k} candidates")
        if ids[s] not in top_ids[s]:
            raise GoldensError(f"{where}: step {s}: the generated id {ids[s]} is not in its own top-k")
    finish = _field(raw, "finishReason", str, where)
    if finish not in ("stop", "length"):
        raise GoldensError(f"{where}.finishReason {finish!r} is not stop or length")
    return GoldenPrompt(spec, ids, logprobs, top_ids, top_lp, top_pieces, finish)


def parse_goldens(text: str | bytes, where: str = "goldens") -> Goldens:
    size = len(text.encode() if isinstance(text, str) else text)
    if size > MAX_GOLDENS_BYTES:
        raise GoldensError(f"{where}: {size} bytes, more than {MAX_GOLDENS_BYTES}")
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise GoldensError(f"{where}: not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise GoldensError(f"{where}: must be a JSON object")
    if obj.get("schemaVersion") != GOLDENS_SCHEMA_VERSION:
        raise GoldensError(
            f"{where}: schemaVersion {obj.get('schemaVersion')!r} is not {GOLDENS_SCHEMA_VERSION!r}"
        )
    prov = _field(obj, "provenance", dict, where)
    missing = [k for k in PROVENANCE_FIELDS if k not in prov]
    if missing:
        raise GoldensError(f"{where}: provenance lacks {', '.join(missing)}")
    top_k = _field(prov, "topK", int, f"{where}.provenance")
    if top_k < MIN_TOP_K:
        raise GoldensError(f"{where}: topK {top_k} is below {MIN_TOP_K}")
    raw_prompts = _field(obj, "prompts", list, where)
    if not raw_prompts:
        raise GoldensError(f"{where}: no prompts")
    prompts = tuple(_prompt(p, i, top_k) for i, p in enumerate(raw_prompts))
    names = [p.name for p in prompts]
    if len(set(names)) != len(names):
        raise GoldensError(f"{where}: prompt names are not unique")
    digest = prompt_set_digest([p.spec for p in prompts])
    if prov["promptSetDigest"] != digest:
        raise GoldensError(
            f"{where}: the prompts do not match provenance.promptSetDigest (edited or truncated)"
        )
    if obj.get("cacheKey") != cache_key(prov):
        raise GoldensError(f"{where}: cacheKey does not match the provenance")
    stop_ids = _ints(obj.get("stopIds"), f"{where}.stopIds", nonempty=False)
    return Goldens(provenance=prov, cache_key=obj["cacheKey"], stop_ids=stop_ids, prompts=prompts)


def read_goldens(path: str | Path) -> Goldens:
    return parse_goldens(read_goldens_bytes(path), str(path))


def read_goldens_bytes(path: str | Path) -> bytes:
    """The goldens file as written (decompressed when gzip), read once: a caller that hashes these
    bytes and then parses them checks exactly what it compares with."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            data = f.read(MAX_GOLDENS_BYTES + 1)
    except OSError as exc:
        raise GoldensError(f"{p}: cannot read the goldens ({exc.strerror})") from None
    if len(data) > MAX_GOLDENS_BYTES:
        raise GoldensError(f"{p}: more than {MAX_GOLDENS_BYTES} bytes")
    if data[:2] == GZIP_MAGIC:
        # The operator stores goldens gzip-compressed in a ConfigMap and mounts them as they are.
        data = _gunzip(data, str(p))
    return data


def goldens_digest(data: bytes) -> str:
    """`sha256:<hex>` of the goldens file as written (what the goldens report and the operator's
    signed record name)."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


GZIP_MAGIC: Final = b"\x1f\x8b"


def _gunzip(data: bytes, where: str) -> bytes:
    """Decompress at most MAX_GOLDENS_BYTES (a small bomb must not exhaust the Job's memory)."""
    inflater = zlib.decompressobj(wbits=31)
    try:
        out = inflater.decompress(data, MAX_GOLDENS_BYTES + 1)
    except zlib.error as exc:
        raise GoldensError(f"{where}: not a readable gzip file ({exc})") from None
    if len(out) > MAX_GOLDENS_BYTES:
        raise GoldensError(f"{where}: more than {MAX_GOLDENS_BYTES} bytes once decompressed")
    if not inflater.eof:
        raise GoldensError(f"{where}: a truncated gzip file")
    return out
