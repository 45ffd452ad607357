"""What the real node (realnode.py) changes on the host, recorded before it starts and put back
after it stops, even when a run crashed half-way (the record is a file in the state directory).

The kubelet and containerd are real daemons: they write sysctls, mount, make cgroups and
directories outside any directory they are given.  Everything here is named and checkable:
`HostSnapshot.take()` before `up`, `restore()` after the processes are gone, and
`HostSnapshot.take().differences(before)` says what (of the things we touch) is still not as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

# The kubelet's kernel tunables (setupKernelTunables, written at start unless
# protectKernelDefaults makes it refuse to start instead), and the one the CNI bridge plugin
# sets for a gateway bridge.
SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.ipv4.ip_forward",
)

# Host directories the daemons create whatever their configured roots are: containerd's shim
# sockets and fifos, the kubelet's container-log symlinks and pod-log root, the CNI cache.
HOST_PATHS = (
    "/run/containerd",
    "/var/log/containers",
    "/var/log/pods",
    "/var/lib/cni",
    "/var/run/netns",
    "/run/netns",
)

CGROUP_ROOT = Path("/sys/fs/cgroup")
# The kubelet's cgroupRoot (cgroupfs driver, cgroupsPerQOS): /kubepods in every hierarchy.
KUBEPODS = "kubepods"
# Every rule this tool adds to iptables carries this comment, so it can find exactly those.
IPTABLES_COMMENT = "clef-realnode"
# Chains the kubelet makes (its iptables canaries).
KUBELET_CHAIN_PREFIX = "KUBE-"
IPTABLES_TABLES = ("nat", "filter", "mangle")


def sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def read_sysctl(name: str) -> str | None:
    try:
        return sysctl_path(name).read_text().strip()
    except OSError:
        return None


def write_sysctl(name: str, value: str) -> None:
    sysctl_path(name).write_text(value + "\n")


def cgroup_hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy (v1 controllers and the v2 tree)."""
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] in ("cgroup", "cgroup2"):
            out.append(Path(fields[1]))
    return sorted(out)


def mountpoints() -> list[str]:
    """Mount points of this mount namespace, in mount order (octal escapes decoded)."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        out.append(point.encode().decode("unicode_escape"))
    return out


def mountpoints_under(root: Path) -> list[str]:
    r = str(root.resolve())
    return [m for m in mountpoints() if m == r or m.startswith(r + "/")]


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def iptables_chains(table: str) -> list[str]:
    """The chains of one iptables table (empty when the table was never loaded or iptables is
    missing)."""
    if shutil.which("iptables-save") is None:
        return []
    proc = subprocess.run(["iptables-save", "-t", table], capture_output=True, text=True)
    if proc.returncode != 0:
        return []
    return [line[1:].split()[0] for line in proc.stdout.splitlines() if line.startswith(":")]


def iptables_rules(table: str) -> list[str]:
    if shutil.which("iptables-save") is None:
        return []
    proc = subprocess.run(["iptables-save", "-t", table], capture_output=True, text=True)
    return [line for line in proc.stdout.splitlines() if line.startswith("-A ")]


@dataclass
class HostSnapshot:
    """The host as the real node found it (only the things it touches)."""

    sysctls: dict[str, str | None]
    paths: dict[str, bool]
    # Per hierarchy: whether /kubepods existed.
    kubepods: dict[str, bool]
    links: dict[str, bool]
    chains: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def take(cls, links: tuple[str, ...] = ()) -> HostSnapshot:
        return cls(
            sysctls={name: read_sysctl(name) for name in SYSCTLS},
            paths={p: os.path.lexists(p) for p in HOST_PATHS},
            kubepods={str(h): (h / KUBEPODS).is_dir() for h in cgroup_hierarchies()},
            links={name: link_exists(name) for name in links},
            chains={t: iptables_chains(t) for t in IPTABLES_TABLES},
        )

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> HostSnapshot | None:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def differences(self, before: HostSnapshot, under: list[Path]) -> list[str]:
        """What differs from `before` among the things the node touches, plus any mount still
        under one of `under` and any rule still carrying IPTABLES_COMMENT.  Empty: restored."""
        out = []
        for name, value in before.sysctls.items():
            if self.sysctls.get(name) != value:
                out.append(f"sysctl {name} = {self.sysctls.get(name)} (was {value})")
        for p, existed in before.paths.items():
            if self.paths.get(p) != existed:
                out.append(f"{p} {'exists' if self.paths.get(p) else 'is gone'} (existed: {existed})")
        for h, existed in before.kubepods.items():
            if self.kubepods.get(h, False) != existed:
                out.append(f"cgroup {h}/{KUBEPODS} exists: {self.kubepods.get(h)} (before: {existed})")
        for name, existed in before.links.items():
            if self.links.get(name) != existed:
                out.append(f"network link {name} exists: {self.links.get(name)} (before: {existed})")
        for table, chains in before.chains.items():
            added = sorted(set(self.chains.get(table, [])) - set(chains))
            if added:
                out.append(f"iptables -t {table}: chains {added} were not there before")
        for table in IPTABLES_TABLES:
            ours = [r for r in iptables_rules(table) if IPTABLES_COMMENT in r]
            if ours:
                out.append(f"iptables -t {table}: rules left: {ours}")
        roots = [str(u.resolve()) for u in under]
        left = [m for m in mountpoints() if any(m == r or m.startswith(r + "/") for r in roots)]
        if left:
            out.append(f"mounts left: {left}")
        return out


def unmount_under(roots: list[Path]) -> list[str]:
    """Unmounts everything mounted at or below `roots`, last-mounted first (a shared bind mount
    of a directory is stacked on it, so a point may need more than one umount).  Returns what
    could not be unmounted."""
    resolved = [str(r.resolve()) for r in roots]

    def ours() -> list[str]:
        return [m for m in mountpoints() if any(m == r or m.startswith(r + "/") for r in resolved)]

    for _ in range(8):
        points = ours()
        if not points:
            return []
        for point in reversed(points):
            proc = subprocess.run(["umount", point], capture_output=True)
            if proc.returncode != 0:
                # Busy (a process still holds it): detach it; it goes when the last user does.
                subprocess.run(["umount", "-l", point], capture_output=True)
    return ours()


def remove_kubepods(before: HostSnapshot) -> list[str]:
    """rmdir every /kubepods tree that was not there before, deepest first.  A cgroup with a
    process in it cannot be removed: those are killed first (they can only be the node's)."""
    failures = []
    for hierarchy, existed in before.kubepods.items():
        top = Path(hierarchy) / KUBEPODS
        if existed or not top.is_dir():
            continue
        dirs = sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True)
        for d in [*dirs, top]:
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError as e:
                failures.append(f"{d}: {e.strerror}")
    return failures


def pids_in_kubepods(before: HostSnapshot) -> set[int]:
    """Every process in a /kubepods tree the node made (the containers it ran)."""
    pids: set[int] = set()
    for hierarchy, existed in before.kubepods.items():
        top = Path(hierarchy) / KUBEPODS
        if existed or not top.is_dir():
            continue
        for procs in top.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(x) for x in procs.read_text().split())
    return pids


def restore(before: HostSnapshot) -> list[str]:
    """Puts back the sysctls, removes the kubepods trees, the links and host directories that
    were not there before, and the kubelet's iptables chains.  Returns what failed."""
    failures = remove_kubepods(before)
    for name, existed in before.links.items():
        if not existed and link_exists(name):
            proc = subprocess.run(["ip", "link", "delete", name], capture_output=True, text=True)
            if proc.returncode != 0:
                failures.append(f"ip link delete {name}: {proc.stderr.strip()}")
    for table in IPTABLES_TABLES:
        for rule in iptables_rules(table):
            if IPTABLES_COMMENT in rule:
                subprocess.run(["iptables", "-t", table, "-D", *_split_rule(rule[3:])], capture_output=True)
        added = [
            c
            for c in iptables_chains(table)
            if c.startswith(KUBELET_CHAIN_PREFIX) and c not in before.chains.get(table, [])
        ]
        for chain in added:
            # Rules that jump to the chain first (the kubelet's canaries have none, but a jump
            # would keep -X from working).
            for rule in iptables_rules(table):
                if f"-j {chain}" in rule:
                    subprocess.run(
                        ["iptables", "-t", table, "-D", *_split_rule(rule[3:])], capture_output=True
                    )
            subprocess.run(["iptables", "-t", table, "-F", chain], capture_output=True)
            proc = subprocess.run(["iptables", "-t", table, "-X", chain], capture_output=True, text=True)
            if proc.returncode != 0:
                failures.append(f"iptables -t {table} -X {chain}: {proc.stderr.strip()}")
    for name, value in before.sysctls.items():
        if value is not None and read_sysctl(name) != value:
            try:
                write_sysctl(name, value)
            except OSError as e:
                failures.append(f"sysctl {name}={value}: {e}")
    for p, existed in before.paths.items():
        if not existed and os.path.lexists(p):
            try:
                if os.path.isdir(p) and not os.path.islink(p):
                    shutil.rmtree(p)
                else:
                    os.unlink(p)
            except OSError as e:
                failures.append(f"remove {p}: {e}")
    return failures


def _split_rule(rule: str) -> list[str]:
    return shlex.split(rule)
