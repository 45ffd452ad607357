"""The runner's pod network: every pod the runner runs gets its own loopback address.

Linux routes all of 127.0.0.0/8 to the loopback interface with no setup and no privileges, so a
server bound to 127.42.0.7 is reached at that address by every process on the host, and by no
other address: as good as a pod IP in a cluster whose pods all live on one machine.  Each runner
claims one /16 block, 127.<b>.0.0/16 with b in 16..254 (127.0.x.x holds 127.0.0.1, where the
control plane listens, and resolvers' 127.0.0.53), by an exclusive lock on a file that lives as
long as the runner: clusters side by side (`--state-dir`, the demo, other checkouts of this user)
never hand out the same address.  Node addresses (10.10.0.x) are not loopback, so they never clash.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import threading
from pathlib import Path
from typing import IO

FIRST_BLOCK, LAST_BLOCK = 16, 254


class PoolExhausted(RuntimeError):
    pass


class PodAddresses:
    """Addresses of one block, 127.<block>.x.y with y in 1..254, handed out next-fit (an address
    let go is not handed out again until the block has gone round), unique while their pod lives."""

    def __init__(self, block: int) -> None:
        if not FIRST_BLOCK <= block <= LAST_BLOCK:
            raise ValueError(f"block {block} is outside {FIRST_BLOCK}..{LAST_BLOCK}")
        self.block = block
        self.lock = threading.Lock()
        self.by_uid: dict[str, str] = {}
        self.cursor = 0  # index of the last address handed out
        self.size = 256 * 254

    def address(self, index: int) -> str:
        return f"127.{self.block}.{index // 254}.{index % 254 + 1}"

    def owns(self, ip: str) -> bool:
        try:
            addr = ipaddress.IPv4Address(ip)
        except ValueError:
            return False
        return addr in ipaddress.IPv4Network(f"127.{self.block}.0.0/16") and ip.rsplit(".", 1)[1] not in (
            "0",
            "255",
        )

    def allocate(self, uid: str, previous: str | None = None) -> str:
        """The pod's address: the one it has, else `previous` (what its status says, after a
        runner restart) if it is ours and free, else the next free one."""
        with self.lock:
            if uid in self.by_uid:
                return self.by_uid[uid]
            used = set(self.by_uid.values())
            if previous and self.owns(previous) and previous not in used:
                self.by_uid[uid] = previous
                return previous
            for step in range(1, self.size + 1):
                index = (self.cursor + step) % self.size
                ip = self.address(index)
                if ip not in used:
                    self.cursor = index
                    self.by_uid[uid] = ip
                    return ip
        raise PoolExhausted(f"all {self.size} addresses of 127.{self.block}.0.0/16 are in use")

    def release(self, uid: str) -> None:
        with self.lock:
            self.by_uid.pop(uid, None)


class BlockClaim:
    """An exclusive lock on one block for this process's lifetime (released when it exits)."""

    def __init__(self, block: int, handle: IO[str]) -> None:
        self.block = block
        self.handle = handle

    @classmethod
    def claim(cls, lock_dir: Path, preferred: int | None = None) -> BlockClaim:
        lock_dir.mkdir(parents=True, exist_ok=True)
        order = list(range(FIRST_BLOCK, LAST_BLOCK + 1))
        if preferred in order:
            order.remove(preferred)
            order.insert(0, preferred)
        for block in order:
            handle = (lock_dir / f"127.{block}.lock").open("a+")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            handle.seek(0)
            handle.truncate()
            handle.write(f"{os.getpid()}\n")
            handle.flush()
            return cls(block, handle)
        raise PoolExhausted(
            f"every block 127.{FIRST_BLOCK}..{LAST_BLOCK}.0.0/16 is claimed (locks in {lock_dir})"
        )

    def release(self) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self.handle, fcntl.LOCK_UN)
        self.handle.close()
