"""Fail the runtime image's build when its torch cannot run on the GPU generation it is for.

    python check_torch_arch.py cpu|sm70|sm90 [--arch-flags "sm_75 sm_80 ..."]

The CUDA architectures a torch wheel was compiled for are read from the wheel itself
(`torch._C._cuda_getArchFlags()`, the build's TORCH_CUDA_ARCH_LIST), which needs no GPU and no
driver: `torch.cuda.get_arch_list()` would return nothing at build time.  --arch-flags replaces
the installed torch's list (the unit tests use it).
"""

from __future__ import annotations

import argparse
import sys

# Where a torch with each generation's kernels comes from (docs/operations.md, "Images").
NEEDS = {
    "sm70": ("sm_70", "V100", "https://download.pytorch.org/whl/cu126 (CUDA 12.6; CUDA 13 dropped Volta)"),
    "sm90": ("sm_90", "H100/H200", "PyPI (torch's default Linux x86-64 build, CUDA 13)"),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("arch")
    p.add_argument("--arch-flags", default=None)
    ns = p.parse_args(argv)
    if ns.arch != "cpu" and ns.arch not in NEEDS:
        print(f"check_torch_arch: CUDA_ARCH {ns.arch!r} is not one of cpu {' '.join(NEEDS)}", file=sys.stderr)
        return 2
    if ns.arch_flags is not None:
        version, cuda, flags = "(given)", "(given)", str(ns.arch_flags)
    else:
        import torch

        version, cuda = str(torch.__version__), str(torch.version.cuda)
        flags = str(torch._C._cuda_getArchFlags()) if torch.version.cuda else ""
    print(f"check_torch_arch: torch {version}, CUDA {cuda}, compiled for: {flags or 'no GPU'}")
    if ns.arch == "cpu":
        return 0
    want, gpu, index = NEEDS[ns.arch]
    if want not in flags.split():
        print(
            f"check_torch_arch: CUDA_ARCH={ns.arch}: this torch has no {want} kernels, so it cannot run on "
            f"{gpu}; install torch from {index}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
