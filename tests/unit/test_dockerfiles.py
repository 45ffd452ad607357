"""The Dockerfiles in images/, linted (`make images` builds them, in minutes: tests/images is the
opt-in tier that does).  Rules: every base image pinned to an exact version (X.Y.Z in the tag, or a
digest), never `latest`; the base a build argument, so Docker and buildah build the same file;
wheels from the host only; the final image runs as a numeric non-root user and writes only under
/tmp; one Python version; the runtime image takes the CUDA_ARCH build argument for exactly the
generations clef supports and checks its torch has that arch.  The linter is tested on bad
Dockerfiles too, so it cannot pass by accident."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OPERATOR = REPO / "images" / "operator" / "Dockerfile"
RUNTIME = REPO / "images" / "runtime" / "Dockerfile"
CUDA_ARCHS = ("cpu", "sm70", "sm90")

PINNED_TAG = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+([-._][A-Za-z0-9._-]+)?$")
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
VAR = re.compile(r"\$\{(\w+)\}|\$(\w+)")


@dataclass
class Stage:
    base: str  # as written
    name: str | None
    user: str | None = None
    args: dict[str, str | None] = field(default_factory=dict)
    env: list[str] = field(default_factory=list)


@dataclass
class Dockerfile:
    global_args: dict[str, str | None]
    stages: list[Stage]


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) pairs, with comments dropped and continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            word, _, rest = full.partition(" ")
            out.append((word.upper(), rest.strip()))
    if pending:
        raise ValueError("the Dockerfile ends inside a continued line")
    return out


def _arg(rest: str) -> tuple[str, str | None]:
    name, sep, default = rest.partition("=")
    return name.strip(), default.strip().strip('"') if sep else None


def parse(text: str) -> Dockerfile:
    global_args: dict[str, str | None] = {}
    stages: list[Stage] = []
    for word, rest in instructions(text):
        if word == "FROM":
            parts = [p for p in rest.split() if not p.startswith("--platform")]
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base=parts[0], name=name))
        elif word == "ARG":
            name, default = _arg(rest)
            if stages:
                stages[-1].args[name] = default
            else:
                global_args[name] = default
        elif word == "USER":
            if not stages:
                raise ValueError("USER before the first FROM")
            stages[-1].user = rest
        elif word == "ENV" and stages:
            stages[-1].env.append(rest)
    if not stages:
        raise ValueError("no FROM")
    return Dockerfile(global_args, stages)


def expand(ref: str, values: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise ValueError(f"FROM {ref}: ${name} has no value")
        return values[name]

    return VAR.sub(sub, ref)


def lint(text: str, arg_values: dict[str, list[str]] | None = None) -> list[str]:
    """Problems with a Dockerfile, one line each (empty: clean).  `arg_values` gives every value a
    global ARG may take in a FROM line (e.g. CUDA_ARCH); each combination is checked."""
    try:
        df = parse(text)
    except ValueError as e:
        return [str(e)]
    problems: list[str] = []
    if re.search(r"(?i):latest\b", text):
        problems.append("a `latest` tag appears")
    choices = dict(arg_values or {})
    for name, default in df.global_args.items():
        choices.setdefault(name, [default] if default is not None else [])
    stage_names = {s.name for s in df.stages if s.name}
    for stage in df.stages:
        used = {m.group(1) or m.group(2) for m in VAR.finditer(stage.base)}
        combos: list[dict[str, str]] = [{}]
        for name in sorted(used):
            if not choices.get(name):
                problems.append(f"FROM {stage.base}: ${name} has no default and no known values")
                combos = []
                break
            combos = [{**c, name: v} for c in combos for v in choices[name]]
        for combo in combos:
            ref = expand(stage.base, combo)
            if ref in stage_names:
                continue  # an earlier stage, checked as itself
            problems += _pinned(ref)
    final = df.stages[-1]
    user = final.user
    if user is None:
        problems.append("the final stage sets no USER: it would run as root")
    else:
        uid, _, gid = user.partition(":")
        if not uid.isdigit():
            problems.append(f"USER {user}: use a numeric UID, so that runAsNonRoot can be enforced")
        elif int(uid) == 0 or (gid.isdigit() and int(gid) == 0):
            problems.append(f"USER {user}: runs as root")
    return problems


def _pinned(ref: str) -> list[str]:
    if DIGEST.search(ref):
        return []
    last = ref.rsplit("/", 1)[-1]
    if ":" not in last:
        return [f"FROM {ref}: no tag (that is `latest`)"]
    tag = last.split(":", 1)[1]
    if not PINNED_TAG.match(tag):
        return [f"FROM {ref}: tag {tag!r} is not an exact version (X.Y.Z...) and there is no digest"]
    return []


# --------------------------------------------------------------------------------- the files


def test_operator_dockerfile_is_clean() -> None:
    assert lint(OPERATOR.read_text()) == []


def test_runtime_dockerfile_is_clean_for_every_cuda_arch() -> None:
    assert lint(RUNTIME.read_text(), {"CUDA_ARCH": list(CUDA_ARCHS)}) == []


def test_runtime_takes_cuda_arch_and_checks_its_torch() -> None:
    df = parse(RUNTIME.read_text())
    assert df.global_args.get("CUDA_ARCH") in CUDA_ARCHS
    build, final = df.stages[0], df.stages[-1]
    assert "CUDA_ARCH" in build.args and "CUDA_ARCH" in final.args
    runs = " ".join(rest for word, rest in instructions(RUNTIME.read_text()) if word == "RUN")
    assert 'check_torch_arch.py "${CUDA_ARCH}"' in runs, "the build fails when torch lacks the GPU's arch"
    assert "clef-runtime version" in runs, "the build proves clef-runtime runs"
    assert any("PATH=/opt/clef/bin:" in e for e in final.env), "clef-runtime on the PATH"


def test_the_same_dockerfiles_serve_docker_and_buildah() -> None:
    """Base names are build arguments (make images passes a Debian-built base where the registry's
    cannot be pulled), and every stage is built FROM it; every wheel comes from the host
    (`--no-index`: pip inside a build container has no way out here)."""
    for dockerfile in (OPERATOR, RUNTIME):
        df = parse(dockerfile.read_text())
        assert (df.global_args.get("BASE") or "").startswith("python:"), dockerfile
        assert [s.base for s in df.stages] == ["${BASE}", "${BASE}"], dockerfile
        runs = " ".join(rest for word, rest in instructions(dockerfile.read_text()) if word == "RUN")
        installs = [c for c in runs.split("&&") if "pip install" in c]
        assert installs and all("--no-index --find-links /src/wheels" in c for c in installs), installs
        copies = [rest for word, rest in instructions(dockerfile.read_text()) if word == "COPY"]
        assert any(c.startswith(".images/wheels/") for c in copies), copies
        assert "SOURCE_DATE_EPOCH" in df.stages[0].args, "byte-compiled files from the commit's time"


def test_images_assume_no_user_and_write_only_under_tmp() -> None:
    for dockerfile in (OPERATOR, RUNTIME):
        text = dockerfile.read_text()
        final = parse(text).stages[-1]
        env = " ".join(final.env)
        assert "HOME=/tmp" in env
        assert not re.search(r"\b(useradd|groupadd|adduser)\b", text), "no passwd entry is made or needed"
        words = [w for w, _ in instructions(text)]
        assert "VOLUME" not in words
    env = " ".join(parse(RUNTIME.read_text()).stages[-1].env)
    for var in ("TRITON_CACHE_DIR", "TRITON_HOME", "XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR"):
        value = re.search(rf"\b{var}=(\S+)", env)
        assert value and value.group(1).startswith("/tmp"), var


def test_one_python_version() -> None:
    """The Makefile's PYTHON is the one version: the venv, the Debian base's package (make images)
    and the build argument each Dockerfile checks its base against; the registry default agrees."""
    makefile = (REPO / "Makefile").read_text()
    m = re.search(r"^PYTHON \?= python(3\.[0-9]+)$", makefile, re.M)
    assert m, "Makefile: PYTHON ?= python3.X"
    version = m.group(1)
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["tool"]["mypy"]["python_version"] == version
    assert pyproject["tool"]["ruff"]["target-version"] == "py" + version.replace(".", "")
    for dockerfile in (OPERATOR, RUNTIME):
        df = parse(dockerfile.read_text())
        assert (df.global_args["BASE"] or "").startswith(f"python:{version}."), dockerfile
        assert "PYTHON" in df.stages[0].args and df.stages[0].args["PYTHON"] is None, "no second default"
    mk = (REPO / "mk" / "images.mk").read_text()
    assert "IMAGE_PYTHON := $(patsubst python%,%,$(notdir $(PYTHON)))" in mk
    assert "--python $(IMAGE_PYTHON)" in mk
    assert "python3.11" not in RUNTIME.read_text() + OPERATOR.read_text()


def test_operator_image_has_no_torch() -> None:
    steps = " ".join(rest for word, rest in instructions(OPERATOR.read_text()) if word == "RUN")
    assert '"clef[operator]"' in steps
    assert "torch" not in steps and "runtime]" not in steps


def test_both_images_ship_the_contract() -> None:
    """clef_contract (the report schema, exit codes, env names) is in both images: clef arrives as
    the wheel `make images` builds from the repository, and the package list puts it there."""
    for dockerfile in (OPERATOR, RUNTIME):
        assert re.search(r'"clef\[(operator|runtime)\]"', dockerfile.read_text()), dockerfile
    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert "contract" in find["where"] and "clef_contract*" in find["include"]
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    assert "**" in ignore and "!.images/wheels/**" in ignore


def test_make_images_knows_the_archs_the_runtime_supports() -> None:
    mk = (REPO / "mk" / "images.mk").read_text()
    default = re.search(r"^CUDA_ARCHS \?= (.+)$", mk, re.M)
    assert default and set(default.group(1).split()) <= set(CUDA_ARCHS)
    spec = importlib.util.spec_from_file_location("images_script", REPO / "hack" / "images.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert tuple(module.ARCHS) == CUDA_ARCHS
    assert set(module.TORCH_INDEX) == set(CUDA_ARCHS)


# --------------------------------------------------------------------------------- the linter

GOOD = """
FROM python:3.11.13-slim-bookworm AS build
RUN echo hi
FROM python:3.11.13-slim-bookworm
USER 65532:65532
"""


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (GOOD.replace("3.11.13-slim-bookworm AS build", "latest AS build"), "latest"),
        (GOOD.replace("python:3.11.13-slim-bookworm\nUSER", "python\nUSER"), "no tag"),
        (
            GOOD.replace("python:3.11.13-slim-bookworm\nUSER", "python:3.11-slim\nUSER"),
            "not an exact version",
        ),
        (GOOD.replace("USER 65532:65532", "USER root"), "numeric"),
        (GOOD.replace("USER 65532:65532", "USER 0"), "runs as root"),
        (GOOD.replace("USER 65532:65532", "USER 1000:0"), "runs as root"),
        (GOOD.replace("USER 65532:65532\n", ""), "no USER"),
        ("ARG V\nFROM python:${V}\nUSER 1\n", "no default"),
        ("ARG V=3.11\nFROM python:${V}\nUSER 1\n", "not an exact version"),
    ],
)
def test_linter_catches(text: str, problem: str) -> None:
    problems = lint(text)
    assert any(problem in p for p in problems), problems


def test_linter_accepts_digests_and_stage_references() -> None:
    digest = "python@sha256:" + "a" * 64
    text = f"ARG A=x\nFROM {digest} AS base-x\nFROM base-${{A}}\nUSER 10001\n"
    assert lint(text) == []


def test_linter_checks_every_value_of_a_build_arg() -> None:
    text = "ARG A=x\nFROM python:3.11.13 AS base-x\nFROM python:3.11 AS base-y\nFROM base-${A}\nUSER 1\n"
    assert lint(text) != []  # base-y itself is not pinned
    only_stage_refs = "ARG A=x\nFROM python:3.11.13 AS base-x\nFROM base-${A}\nUSER 1\n"
    assert any("base-y" in p for p in lint(only_stage_refs, {"A": ["x", "y"]}))
