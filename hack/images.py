#!/usr/bin/env python3
"""Build clef's images with what this machine has (`make images`; docs/operations.md, "Images").

    images.py build  --out .images --pip PIP --python 3.11 --registry R --version V [--operator] [--runtime ARCH...]
    images.py pin    --digests .images/digests.json --out kustomize/overlays/pinned
    images.py digest ARCHIVE          (the manifest digest of an OCI archive)

Steps, for each image:
  1. wheels on the host (`pip wheel -c constraints.txt`): pip inside a build container cannot
     reach PyPI here (the workplace's TLS CA is only in the host's bundle), and the Dockerfiles
     install with `--no-index` from these wheels on every path;
  2. the build, from the same Dockerfile: with a Docker engine when `docker info` answers, else
     with buildah (vfs storage, chroot isolation), on a Debian bookworm base that mmdebstrap
     builds (the registry's python image cannot be pulled here);
  3. the outputs under --out: NAME.oci.tar (an OCI archive: its manifest digest is what a
     registry keeps when it is pushed with `skopeo copy`), NAME.tar (a docker-archive, for
     `docker load`), and digests.json / digests.txt;
  4. a smoke run of the image as UID 65532 (no passwd entry) on a read-only root.
SOURCE_DATE_EPOCH is the last commit's time: image config, file times and byte-compiled files
all come from it, so the same commit builds the same digests.
Only the standard library: it runs before any virtualenv exists.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEELS = REPO / ".images" / "wheels"
ARCHS = ("cpu", "sm70", "sm90")
# Where each runtime variant's torch comes from.  PyPI's default torch 2.11 (CUDA 13) runs on a
# CPU and on sm_75..sm_120 (H100/H200 included); CUDA 13 dropped Volta, so V100 needs the cu126
# build from PyTorch's own index.
TORCH_INDEX = {
    "cpu": None,
    "sm90": None,
    "sm70": "https://download.pytorch.org/whl/cu126",
}
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SMOKE_USER = "65532:65532"
BUILDAH = ["buildah", "--storage-driver", "vfs"]
PODMAN = ["podman", "--storage-driver", "vfs"]
APT_TOOLS = {
    "buildah": "buildah",
    "podman": "podman",
    "skopeo": "skopeo",
    "mmdebstrap": "mmdebstrap",
    "runc": "runc",
}


class BuildError(Exception):
    pass


def log(msg: str) -> None:
    print(f"images: {msg}", flush=True)


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    log("$ " + " ".join(cmd))
    result = subprocess.run(cmd, text=True, **kw)  # type: ignore[call-overload]
    if result.returncode != 0:
        raise BuildError(f"{cmd[0]} exited {result.returncode}: {' '.join(cmd)}")
    return result


def source_date_epoch() -> int:
    env = os.environ.get("SOURCE_DATE_EPOCH")
    if env:
        return int(env)
    out = subprocess.run(["git", "log", "-1", "--format=%ct"], cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0 or not out.stdout.strip():
        raise BuildError("no SOURCE_DATE_EPOCH and no git commit to take it from")
    return int(out.stdout.strip())


def git_commit() -> str:
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
    )
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def docker_engine(docker: str) -> bool:
    if not shutil.which(docker):
        return False
    return subprocess.run([docker, "info"], capture_output=True).returncode == 0


def ensure_tools(names: list[str]) -> None:
    missing = [n for n in names if not shutil.which(n)]
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise BuildError(
            f"no Docker engine and no {', '.join(missing)} on PATH; install them "
            f"(Debian: apt-get install {' '.join(APT_TOOLS[n] for n in missing)}) or use a machine with Docker"
        )
    log(f"installing {' '.join(missing)} from Debian (no Docker engine here)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-qq"], env=env)
    run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *(APT_TOOLS[n] for n in missing)],
        env=env,
    )


# ------------------------------------------------------------------------------------- wheels


def constraints_for(arch: str | None) -> str:
    """constraints.txt as the image installs with it.  For a torch from another index (sm70) the
    torch/CUDA lines (which describe PyPI's CUDA 13 build) are left out: that index's torch
    brings its own CUDA libraries."""
    text = (REPO / "constraints.txt").read_text()
    if arch is None or TORCH_INDEX[arch] is None:
        return text
    skip = ("torch==", "triton==", "nvidia-", "cuda-")
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith(skip))


def wheels(pip: str, extra: str, arch: str | None, sde: int) -> Path:
    """Every wheel the image installs, built on the host into .images/wheels/NAME (in the build
    context, where the Dockerfiles COPY them from, whatever --out is)."""
    name = extra if arch is None else f"{extra}-{'pypi' if TORCH_INDEX[arch] is None else 'cu126'}"
    wheel_dir = WHEELS / name
    wheel_dir.mkdir(parents=True, exist_ok=True)
    for old in wheel_dir.glob("clef-*.whl"):
        old.unlink()  # clef itself is rebuilt every time (the source changes); the rest is reused
    constraints = wheel_dir / "constraints.txt"
    constraints.write_text(constraints_for(arch))
    # --find-links: the wheels already there are reused, not downloaded again (2.7 GB for torch).
    cmd = [pip, "wheel", "-q", "--disable-pip-version-check", "-w", str(wheel_dir), "-c", str(constraints)]
    cmd += ["--find-links", str(wheel_dir)]
    cmd += [a for link in os.environ.get("PIP_FIND_LINKS", "").split() for a in ("--find-links", link)]
    index = TORCH_INDEX.get(arch) if arch else None
    if index:
        cmd += ["--index-url", index, "--extra-index-url", "https://pypi.org/simple"]
    cmd.append(f".[{extra}]")
    t = time.monotonic()
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(sde)}
    try:
        run(cmd, cwd=REPO, env=env)
    except BuildError as e:
        if index:
            raise BuildError(
                f"{e}\n  the {arch} runtime needs torch from {index}: it is unreachable from this "
                "machine (build the sm70 image where it is)"
            ) from None
        raise
    log(f"wheels for {name}: {time.monotonic() - t:.0f} s, {dir_size(wheel_dir) / 1e6:.0f} MB")
    return wheel_dir


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ------------------------------------------------------------------------------------- bases


def debian_base(python: str, with_compiler: bool, sde: int, rebuild: bool) -> str:
    """A Debian bookworm image with python{python} (and gcc/headers for Triton's launcher when
    `with_compiler`), built by mmdebstrap into buildah's storage; reused when it exists."""
    # Named by its SOURCE_DATE_EPOCH: a base is reused by the builds of one commit only (its
    # file times and date come from it, so another commit's base would change the digest).
    flavor = f"{python}-{DEBIAN_SUITE}{'-dev' if with_compiler else ''}"
    name = f"localhost/clef/debian-python:{flavor}-{sde}"
    exists = (
        subprocess.run([*BUILDAH, "inspect", "--type", "image", name], capture_output=True).returncode == 0
    )
    if exists and not rebuild:
        log(f"base {name}: exists (REBUILD_BASE=1 rebuilds it)")
        return name
    packages = [f"python{python}", f"python{python}-venv", "ca-certificates"]
    if with_compiler:
        packages += ["gcc", "libc6-dev", f"libpython{python}-dev"]
    t = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="clef-base-") as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(sde)}
        run(
            [
                "mmdebstrap",
                "--variant=minbase",
                "--include=" + ",".join(packages),
                # python3 on the PATH, as in the registry's image (no python3 metapackage: it
                # would pull the suite's default Python, which is the same one in bookworm).
                f'--customize-hook=chroot "$1" ln -sf python{python} /usr/bin/python3',
                '--customize-hook=rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*',
                DEBIAN_SUITE,
                str(rootfs),
                *DEBIAN_MIRRORS,
            ],
            env=env,
        )
        ctr = run([*BUILDAH, "from", "scratch"], capture_output=True).stdout.strip()
        try:
            run([*BUILDAH, "add", ctr, str(rootfs), "/"])
            run(
                [
                    *BUILDAH,
                    "config",
                    "--env",
                    f"PATH={BASE_PATH}",
                    "--env",
                    "LANG=C.UTF-8",
                    "--cmd",
                    "python3",
                    ctr,
                ]
            )
            run([*BUILDAH, "commit", "--timestamp", str(sde), "--rm", ctr, name])
        except BuildError:
            subprocess.run([*BUILDAH, "rm", ctr], capture_output=True)
            raise
    log(f"base {name}: built in {time.monotonic() - t:.0f} s")
    # Other commits' bases of this flavor are not needed any more (an image still built on one
    # keeps its layers: buildah refuses to remove a base in use, which is fine).
    listing = subprocess.run(
        [*BUILDAH, "images", "--format", "{{.Name}}:{{.Tag}}", "localhost/clef/debian-python"],
        capture_output=True,
        text=True,
    )
    for old in listing.stdout.split():
        tag = old.rsplit(":", 1)[-1]
        if old != name and tag.startswith(flavor + "-") and tag[len(flavor) + 1 :].isdigit():
            subprocess.run([*BUILDAH, "rmi", old], capture_output=True)
    return name


# ------------------------------------------------------------------------------------- builds


def oci_digests(archive: Path) -> tuple[str, str, int]:
    """(manifest digest, config digest, compressed layer bytes) of a one-image OCI archive, read
    from the archive itself."""
    with tarfile.open(archive) as tar:

        def blob(digest: str) -> bytes:
            f = tar.extractfile("blobs/" + digest.replace(":", "/"))
            assert f is not None
            return f.read()

        index_file = tar.extractfile("index.json")
        assert index_file is not None
        index = json.load(index_file)
        [desc] = index["manifests"]
        manifest_bytes = blob(desc["digest"])
        assert "sha256:" + hashlib.sha256(manifest_bytes).hexdigest() == desc["digest"]
        manifest = json.loads(manifest_bytes)
    return desc["digest"], manifest["config"]["digest"], sum(layer["size"] for layer in manifest["layers"])


def image_size(name: str) -> int:
    """The image's unpacked size: its uncompressed layers, as buildah's local manifest lists them."""
    out = run(
        [*BUILDAH, "inspect", "--type", "image", "--format", "{{.Manifest}}", name], capture_output=True
    )
    return sum(int(layer["size"]) for layer in json.loads(out.stdout)["layers"])


def build_one(
    *,
    dockerfile: str,
    name: str,
    ref: str,
    build_args: dict[str, str],
    out: Path,
    sde: int,
    engine: str,
    docker: str,
) -> dict[str, object]:
    args = [a for k, v in build_args.items() for a in ("--build-arg", f"{k}={v}")]
    t0 = time.monotonic()
    oci, dock = out / f"{name}.oci.tar", out / f"{name}.tar"
    for f in (oci, dock):
        f.unlink(missing_ok=True)
    if engine == "docker":
        run(
            [docker, "build", "-f", dockerfile, *args, "-t", ref, "."],
            cwd=REPO,
            env={**os.environ, "DOCKER_BUILDKIT": "1"},
        )
        built = time.monotonic()
        run([docker, "save", "-o", str(dock), ref])
        # Docker has no OCI archive export without buildx; skopeo turns the save into one.
        run(["skopeo", "copy", f"docker-archive:{dock}", f"oci-archive:{oci}:{ref}"])
        size = int(
            run([docker, "image", "inspect", "--format", "{{.Size}}", ref], capture_output=True).stdout
        )
    else:
        run(
            [*BUILDAH, "bud", "--isolation", "chroot", "--timestamp", str(sde), "--pull-never", "--no-cache",
             "-f", dockerfile, *args, "-t", ref, "."],
            cwd=REPO,
        )  # fmt: skip
        built = time.monotonic()
        run([*BUILDAH, "push", "--quiet", ref, f"oci-archive:{oci}:{ref}"])
        run([*BUILDAH, "push", "--quiet", ref, f"docker-archive:{dock}:{ref}"])
        size = image_size(ref)
    digest, config, pulled = oci_digests(oci)
    done = time.monotonic()
    log(
        f"{ref}: {digest} (build {built - t0:.0f} s, archives {done - built:.0f} s; "
        f"{size / 1e6:.0f} MB unpacked, {pulled / 1e6:.0f} MB compressed)"
    )
    return {
        "ref": ref,
        "digest": digest,
        "image_id": config,
        "oci_archive": oci.name,
        "docker_archive": dock.name,
        "size_bytes": size,
        "compressed_bytes": pulled,
        "build_seconds": round(built - t0, 1),
        "archive_seconds": round(done - built, 1),
        "engine": engine,
        "base": build_args.get("BASE", "(the Dockerfile's default)"),
    }


def smoke(engine: str, docker: str, ref: str, argv: list[str], env: dict[str, str]) -> None:
    """Run the image as a UID with no passwd entry, on a read-only root with /tmp a tmpfs: how
    the pod runs it."""
    flags = ["--rm", "--network", "none", "--user", SMOKE_USER, "--read-only", "--tmpfs", "/tmp"]
    flags += [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
    if engine == "docker":
        run([docker, "run", *flags, ref, *argv])
        return
    # podman's defaults assume a systemd host; these are what work on clef's machines (runc, not
    # crun; explicit ulimits: podman's would exceed the hard limits here).
    run(
        [*PODMAN, "run", "--runtime", "runc", "--cgroup-manager", "cgroupfs", "--events-backend", "none",
         "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096", *flags, ref, *argv]
    )  # fmt: skip


def build(ns: argparse.Namespace) -> int:
    out = (REPO / ns.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    bad = [a for a in ns.runtime if a not in ARCHS]
    if bad:
        raise BuildError(f"CUDA_ARCHS: {' '.join(bad)} is not one of {' '.join(ARCHS)}")
    sde = source_date_epoch()
    engine = "docker" if docker_engine(ns.docker) else "buildah"
    log(f"engine: {engine}; SOURCE_DATE_EPOCH={sde} (the last commit); outputs in {out}")
    if engine == "buildah":
        ensure_tools(["buildah", "podman", "skopeo", "mmdebstrap", "runc"])
    else:
        ensure_tools(["skopeo"])
    digests_file = out / "digests.json"
    results: dict[str, dict[str, object]] = (
        json.loads(digests_file.read_text()) if digests_file.exists() else {}
    )
    common = {"PYTHON": ns.python, "SOURCE_DATE_EPOCH": str(sde)}
    rebuild = os.environ.get("REBUILD_BASE", "") not in ("", "0")
    if ns.operator:
        wheels(ns.pip, "operator", None, sde)
        args = dict(common)
        if engine == "buildah":
            args["BASE"] = debian_base(ns.python, False, sde, rebuild)
        name = "clef-operator"
        ref = f"{ns.registry}/{name}:{ns.version}"
        res = build_one(dockerfile="images/operator/Dockerfile", name=name, ref=ref, build_args=args,
                        out=out, sde=sde, engine=engine, docker=ns.docker)  # fmt: skip
        if not ns.no_smoke:
            smoke(engine, ns.docker, ref, ["--version"], {})
        results[name] = res
    for arch in ns.runtime:
        wheels(ns.pip, "runtime", arch, sde)
        args = {
            **common,
            "CUDA_ARCH": arch,
            "WHEELS": "runtime-" + ("pypi" if TORCH_INDEX[arch] is None else "cu126"),
        }
        if engine == "buildah":
            args["BASE"] = debian_base(ns.python, True, sde, rebuild)
        name = f"clef-runtime-{arch}"
        ref = f"{ns.registry}/clef-runtime:{ns.version}-{arch}"
        res = build_one(dockerfile="images/runtime/Dockerfile", name=name, ref=ref, build_args=args,
                        out=out, sde=sde, engine=engine, docker=ns.docker)  # fmt: skip
        if not ns.no_smoke:
            # The kernels suite on the CPU under Triton's interpreter, at reduced shapes (the
            # model's own take many minutes under the interpreter); the GPU variants too: the
            # check is that the image's Python, torch and Triton run as any UID, not the GPU.
            smoke(
                engine,
                ns.docker,
                ref,
                ["verify", "--device", "cpu", "--suite", "kernels", "--shapes", "reduced"],
                {"TRITON_INTERPRET": "1"},
            )
        results[name] = res
    for res in results.values():
        res.setdefault("source_date_epoch", sde)
    stamp = {"source_date_epoch": sde, "commit": git_commit()}
    for key in (["clef-operator"] if ns.operator else []) + [f"clef-runtime-{a}" for a in ns.runtime]:
        results[key].update(stamp)
    digests_file.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    (out / "digests.txt").write_text(
        "".join(f"{str(r['ref']).rsplit(':', 1)[0]}@{r['digest']}  {r['ref']}\n" for r in results.values())
    )
    log(f"wrote {digests_file} and digests.txt")
    return 0


# ------------------------------------------------------------------------------------- pin

PIN_HEADER = """\
# Generated by `make images` (hack/images.py pin) from {digests}: do not edit, do not commit.
# kustomize/base with the operator image pinned to the digest of the image just built and tested
# (source commit {commit}).  Push that exact image with
#   skopeo copy oci-archive:.images/clef-operator.oci.tar docker://{repo}:{tag}
# (skopeo keeps the digest), then `kubectl apply -k` this directory or copy it into your GitOps repo.
"""


def pin(ns: argparse.Namespace) -> int:
    digests_path = Path(ns.digests)
    if not digests_path.exists():
        raise BuildError(f"{digests_path}: no such file (run `make images` first)")
    results = json.loads(digests_path.read_text())
    if "clef-operator" not in results:
        raise BuildError(f"{digests_path}: has no clef-operator image (run `make images` first)")
    op = results["clef-operator"]
    repo, tag = op["ref"].rsplit(":", 1)
    digest = op["digest"]
    if not (digest.startswith("sha256:") and len(digest) == 71):
        raise BuildError(f"{digests_path}: clef-operator digest {digest!r} is not a sha256 digest")
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    base = os.path.relpath(REPO / "kustomize" / "base", out.resolve())
    text = PIN_HEADER.format(digests=digests_path, commit=op.get("commit", "?"), repo=repo, tag=tag)
    text += (
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n- {base}\n"
        "images:\n"
        f"- name: {ns.base_image}\n  newName: {repo}\n  digest: {digest}\n"
    )
    (out / "kustomization.yaml").write_text(text)
    log(f"{out}/kustomization.yaml: {ns.base_image} -> {repo}@{digest}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="images.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", default=".images")
    b.add_argument("--pip", required=True, help="the host's pip, for the wheels")
    b.add_argument("--python", required=True, help="the one Python version, X.Y")
    b.add_argument("--registry", required=True)
    b.add_argument("--version", required=True)
    b.add_argument("--docker", default="docker")
    b.add_argument("--operator", action="store_true")
    b.add_argument("--runtime", nargs="*", default=[], metavar="ARCH")
    b.add_argument("--no-smoke", action="store_true")
    pn = sub.add_parser("pin")
    pn.add_argument("--digests", default=".images/digests.json")
    pn.add_argument("--out", default="kustomize/overlays/pinned")
    pn.add_argument(
        "--base-image", default="ghcr.io/riotpiao/clef-operator", help="the name kustomize/base uses"
    )
    d = sub.add_parser("digest")
    d.add_argument("archive")
    ns = p.parse_args(argv)
    try:
        if ns.cmd == "build":
            return build(ns)
        if ns.cmd == "pin":
            return pin(ns)
        print(oci_digests(Path(ns.archive))[0])
        return 0
    except BuildError as e:
        print(f"images: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
