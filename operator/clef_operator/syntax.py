"""Kubernetes' syntax for the strings a ClefModel passes on to its children, in one place.

Each pattern is written once and used twice: inside a CEL rule of the CRD (the API server's RE2)
and by the operator's own parse (Python's `re`), so both refuse the same input.  The patterns use
only what the two dialects share (no lookaround, no backreferences, no named groups).  A spec that
passes them makes children Kubernetes accepts; without them the API server would store a
ClefModel whose Deployment or Job is refused later, leaving the model stuck.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN = rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*$"

# A label key is `[prefix/]name`: prefix a DNS subdomain of at most 253 characters, name at most
# 63 of alphanumerics, '-', '_' and '.', starting and ending with an alphanumeric.  The lengths are
# in the pattern so that one regex is the whole rule (a qualified name has the same syntax).
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
QUALIFIED_NAME = rf"^({_DNS_LABEL}(\.{_DNS_LABEL})*/)?{_LABEL_NAME}$"
LABEL_VALUE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"

# docker/distribution's reference grammar: [host[:port]/]path[:tag][@sha256:<64 hex>].  The host
# may hold upper case and '-', path components are lower case alphanumerics joined by '.', '_',
# '__' or runs of '-'.  A tag never holds ':', so `host:5000:1.0` is refused.
_HOST = r"[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*(:[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = (
    rf"^({_HOST}/)?{_PATH_COMPONENT}(/{_PATH_COMPONENT})*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$"
)
# docker/distribution: the name (host and path, without tag or digest) is at most 255 characters.
MAX_IMAGE_NAME = 255
_NAME = "self.split('@')[0]"
IMAGE_NAME_LENGTH_RULE = (
    f"({_NAME}.lastIndexOf(':') > {_NAME}.lastIndexOf('/') ? {_NAME}.lastIndexOf(':') : {_NAME}.size())"
    f" <= {MAX_IMAGE_NAME}"
)

# Stricter than the API server (which allows any printable ASCII but '=' since 1.34): engines and
# shells read these, and a C identifier is what every one of them understands.
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
# The verification run's contract with the runtime: the operator sets CLEF_TERMINATION_LOG, the
# runtime reads CLEF_VERIFY_SHAPES, CLEF_VERIFY_DEVICE, CLEF_RUNTIME_FAULT, and Triton's
# interpreter swaps the GPU for the CPU.  A user's env would silently change what is verified.
RESERVED_ENV = r"^(CLEF_.*|TRITON_INTERPRET.*)$"
# Names that choose the code a process runs, refused in spec.env: spec.env reaches the kernels
# verification pod, so any of them would let a namespace editor run code of their own in place of
# the verifier (a sitecustomize.py on the weights volume and PYTHONPATH pointing at it wrote a
# passing report).  Each entry is a name or, ending in '*', a prefix; where each comes from:
#   CPython (docs: "Command line and environment"): every PYTHON* name (PYTHONPATH, PYTHONHOME,
#     PYTHONSTARTUP, PYTHONUSERBASE, PYTHONPLATLIBDIR, PYTHONSAFEPATH, ...), and HOME, under which
#     the per-user site-packages (~/.local/lib/pythonX.Y/site-packages) is imported at start-up;
#   glibc (ld.so(8), and the variables it drops for set-user-ID programs): LD_* (LD_PRELOAD,
#     LD_LIBRARY_PATH, LD_AUDIT, ...), GLIBC_TUNABLES, and the paths from which it loads shared
#     objects or data at run time: GCONV_PATH, GETCONF_DIR, LOCPATH, NLSPATH, HOSTALIASES;
#   the shell's PATH, through which the verifier's argv[0] (clef-runtime) is found;
#   Triton: TRITON_* (TRITON_KERNEL_OVERRIDE with TRITON_OVERRIDE_DIR swaps compiled kernels for
#     files from a directory; TRITON_HOME, TRITON_CACHE_DIR place them).
CODE_STEERING_ENV_NAMES = (
    "PYTHON*",
    "HOME",
    "LD_*",
    "GLIBC_TUNABLES",
    "GCONV_PATH",
    "GETCONF_DIR",
    "LOCPATH",
    "NLSPATH",
    "HOSTALIASES",
    "PATH",
    "TRITON_*",
)
CODE_STEERING_ENV = (
    "^(" + "|".join(n[:-1] + ".*" if n.endswith("*") else n for n in CODE_STEERING_ENV_NAMES) + ")$"
)

# CEL's escape for the NUL character (the rule text itself must not hold one).
NUL_ESCAPE = "\\u0000"
# A '..' element of a path: Kubernetes refuses it in hostPath and subPath.
BACKSTEP = r"(^|/)\.\.(/|$)"
# A qualified name whose prefix is longer than a DNS subdomain may be (253).
LONG_PREFIX = r"^[^/]{254,}/"

# resource.ParseQuantity: a signed decimal, then a binary suffix, a decimal suffix or an exponent.
# Its parser reads a missing number as 0, so ".", "-" and "Mi" are quantities (zero) too; only the
# empty string is not.
QUANTITY = r"^[+-]?[0-9]*(\.[0-9]*)?([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
# Container resources: the standard ones (hugepages are left out: Kubernetes wants a limit equal to
# the request in page-size multiples next to cpu or memory), or an extended resource
# `<domain>/<name>` outside kubernetes.io.
STANDARD_RESOURCE = r"^(cpu|memory|ephemeral-storage)$"
EXTENDED_RESOURCE = rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*/{_LABEL_NAME}$"
# Prefixes Kubernetes keeps for itself (its own resources, quota names).
NATIVE_PREFIX = r"^([^/]*kubernetes\.io/|requests\.)"

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_QUANTITY_PARTS = re.compile(r"([+-]?)([0-9]*(?:\.[0-9]*)?)(.*)")


def matches(pattern: str, value: str) -> bool:
    """What CEL's `value.matches(pattern)` says.  RE2's `$` is the end of the text; Python's also
    matches before a final newline, so it is spelt `\\Z` here (the patterns have no literal `$`)."""
    return re.search(pattern.replace("$", r"\Z"), value) is not None


def is_qualified_name(value: str) -> bool:
    return matches(QUALIFIED_NAME, value) and not matches(LONG_PREFIX, value)


def is_resource_name(value: str) -> bool:
    if matches(STANDARD_RESOURCE, value):
        return True
    return (
        matches(EXTENDED_RESOURCE, value)
        and not matches(LONG_PREFIX, value)
        and not matches(NATIVE_PREFIX, value)
    )


def is_extended_resource(value: str) -> bool:
    """Extended resources cannot be overcommitted: integer amounts, request equal to limit."""
    return "/" in value


def quantity(value: str) -> Decimal | None:
    """The amount a Kubernetes quantity stands for, or None if it is not one."""
    if not value or not matches(QUANTITY, value):
        return None
    found = _QUANTITY_PARTS.fullmatch(value)
    if found is None:
        return None
    sign, number, suffix = found.groups()
    try:
        amount = Decimal(sign + number) if number.strip(".") else Decimal(0)
    except InvalidOperation:
        return None
    if suffix in _BINARY:
        return amount * _BINARY[suffix]
    if suffix in _DECIMAL:
        return amount.scaleb(_DECIMAL[suffix])
    return amount.scaleb(int(suffix[1:]))


def image_name_fits(reference: str) -> bool:
    """What IMAGE_NAME_LENGTH_RULE says: the name before `:tag` and `@digest` is short enough."""
    name = reference.split("@")[0]
    colon, slash = name.rfind(":"), name.rfind("/")
    return (colon if colon > slash else len(name)) <= MAX_IMAGE_NAME
