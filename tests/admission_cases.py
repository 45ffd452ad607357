"""What admission must refuse and what it must accept: one table for both tiers.

The cluster tier sends each case to a real kube-apiserver (dryRun) and the unit tier to the
operator's own parse (`ClefModelSpec.model_validate`), so the CRD's rules and the pydantic models
cannot drift apart.  A case mutates a valid ClefModel body in place; `field` is what the refusal
must name.  Plain data and functions only: both tiers import this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Body = dict[str, Any]
Mutation = Callable[[Body], None]


# Each name of syntax.CODE_STEERING_ENV_NAMES, and for a prefix, names real programs read.
CODE_STEERING_ENV = (
    *("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONPLATLIBDIR", "PYTHONSAFEPATH"),
    *("HOME", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "GLIBC_TUNABLES", "GCONV_PATH", "GETCONF_DIR"),
    *("LOCPATH", "NLSPATH", "HOSTALIASES", "PATH"),
    *("TRITON_KERNEL_OVERRIDE", "TRITON_OVERRIDE_DIR", "TRITON_HOME", "TRITON_CACHE_DIR"),
)
# Names beside them that engines use and that stay allowed.
NEAR_CODE_STEERING_ENV = (
    *("HF_HOME", "MY_PYTHONPATH", "LD", "PATHS", "HOMEDIR", "XLD_PRELOAD", "MALLOC_ARENA_MAX"),
    "CUDA_LAUNCH_BLOCKING",
)


def spec(**changes: Any) -> Mutation:
    def mutate(body: Body) -> None:
        body["spec"].update(changes)

    return mutate


def nested(path: str, value: Any) -> Mutation:
    """Set (or, with `KeyError`, remove) the field at a dotted path such as spec.service.name."""

    def mutate(body: Body) -> None:
        node = body
        *parents, last = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        if value is KeyError:
            node.pop(last)
        else:
            node[last] = value

    return mutate


def both(*mutations: Mutation) -> Mutation:
    def mutate(body: Body) -> None:
        for m in mutations:
            m(body)

    return mutate


def resources(**maps: dict[str, str]) -> Mutation:
    return nested("spec.resources", maps)


def toleration(**fields: Any) -> Mutation:
    return spec(tolerations=[fields])


def asks_engine(mode: str = "endpoint", **endpoint: Any) -> Mutation:
    """Verification mode `mode` with a runtime image and the weights mounted (what it needs)."""

    def mutate(body: Body) -> None:
        body["spec"]["model"]["volume"] = {"hostPath": {"path": "/srv/models/clef-flash"}}
        verification = body["spec"].setdefault("verification", {})
        verification["mode"] = mode
        verification["endpoint"] = {"runtimeImage": "registry.clef.test/clef-runtime:1.0", **endpoint}

    return mutate


WATCH = "spec.verification.watch"


def watch(**fields: Any) -> Mutation:
    """spec.verification.watch with `fields` (after asks_engine, which sets verification up)."""
    return nested(WATCH, fields)


def without_volume(body: Body) -> None:
    body["spec"]["model"].pop("volume", None)


DIGEST = "sha256:" + "0123456789abcdef" * 4
ARCH = "spec.model.architecture"
LONG_PREFIX = ".".join(["a" * 63] * 4) + "/gpu"  # a 255-character prefix: longer than a DNS subdomain

# (what, mutation, the field the refusal names)
BAD: list[tuple[str, Mutation, str]] = [
    ("negative GPUs", spec(gpus=-1), "spec.gpus"),
    ("zero GPUs", spec(gpus=0), "spec.gpus"),
    ("too many GPUs", spec(gpus=17), "spec.gpus"),
    ("kvFraction above 0.95", spec(kvFraction=1.4), "spec.kvFraction"),
    ("kvFraction zero", spec(kvFraction=0), "spec.kvFraction"),
    ("kvFraction negative", spec(kvFraction=-0.1), "spec.kvFraction"),
    ("unknown dtype", spec(dtype="fp8"), "spec.dtype"),
    ("unknown engine", spec(engine="tgi"), "spec.engine"),
    ("TP not dividing the heads", spec(gpus=3, tensorParallel=3), "spec.tensorParallel"),
    ("TP not dividing gpus", spec(gpus=1, tensorParallel=2), "spec.tensorParallel"),
    (
        "GDN head sharding the engine cannot do",
        lambda b: b["spec"].update(
            engine="vllm",
            gpus=4,
            tensorParallel=4,
            gpuMemoryMiB=32768,
            model={**b["spec"]["model"], "architecture": {"linearNumKeyHeads": 6, "linearNumValueHeads": 12}},
        ),
        "spec.tensorParallel",
    ),
    ("candle-vllm with pipeline parallelism", spec(gpus=4, tensorParallel=2), "spec.tensorParallel"),
    ("vllm without GPU memory", spec(engine="vllm"), "spec.gpuMemoryMiB"),
    (
        "mistralrs with a tensor-parallel degree below gpus",
        spec(engine="mistralrs", gpus=4, tensorParallel=2, gpuMemoryMiB=32768),
        "spec.tensorParallel",
    ),
    ("mistralrs without GPU memory", spec(engine="mistralrs"), "spec.gpuMemoryMiB"),
    ("KV heads not dividing heads", nested(f"{ARCH}.numKeyValueHeads", 5), f"{ARCH}.numKeyValueHeads"),
    (
        "attention interval beyond the layers",
        nested(f"{ARCH}.fullAttentionInterval", 64),
        f"{ARCH}.fullAttentionInterval",
    ),
    ("service name not a DNS label", nested("spec.service.name", "Clef_Serve"), "spec.service.name"),
    ("service name too long", nested("spec.service.name", "s" * 64), "spec.service.name"),
    ("service port out of range", nested("spec.service.port", 70000), "spec.service.port"),
    ("missing service", nested("spec.service", KeyError), "spec.service"),
    # Images: docker/distribution's reference grammar.
    ("image with a space", spec(image="registry.clef.test/clef runtime:1.0"), "spec.image"),
    ("oversized image", spec(image="registry.clef.test/" + "a" * 600), "spec.image"),
    ("image with two colons after the host", spec(image="registry.clef.test:5000:1.0"), "spec.image"),
    ("image with a port and two tags", spec(image="registry.local:5000/clef/runtime:1.0:2"), "spec.image"),
    ("image with an upper-case path", spec(image="registry.clef.test/Clef/runtime:1.0"), "spec.image"),
    ("image with a scheme", spec(image="https://registry.clef.test/clef:1.0"), "spec.image"),
    ("image with a short digest", spec(image="registry.clef.test/clef@sha256:abc"), "spec.image"),
    ("image tag too long", spec(image="registry.clef.test/clef:" + "t" * 129), "spec.image"),
    ("image tag starting with '-'", spec(image="registry.clef.test/clef:-1"), "spec.image"),
    ("image path ending in a separator", spec(image="registry.clef.test/clef-:1.0"), "spec.image"),
    ("image name over 255 characters", spec(image="registry.clef.test/" + "a" * 240 + ":1.0"), "spec.image"),
    (
        "verification image with two colons",
        nested("spec.verification.image", "registry.clef.test:5000:1.0"),
        "spec.verification.image",
    ),
    # A verifier running another image cannot tell which digest of a tag will serve (issue 13).
    (
        "verification image with spec.image a tag",
        nested("spec.verification.image", "registry.clef.test/clef/verify:1.0"),
        "spec.image",
    ),
    # Paths that end up in volumes and mounts.
    ("relative model path", nested("spec.model.path", "models/clef-flash"), "spec.model.path"),
    ("model path with '..'", nested("spec.model.path", "/models/../etc"), "spec.model.path"),
    ("model path on /tmp", nested("spec.model.path", "/tmp"), "spec.model.path"),
    ("model path on /dev/shm", nested("spec.model.path", "/dev/shm/"), "spec.model.path"),
    ("model path /", nested("spec.model.path", "/"), "spec.model.path"),
    ("model path /tmp/.", nested("spec.model.path", "/tmp/."), "spec.model.path"),
    ("model path under /proc", nested("spec.model.path", "/proc/models"), "spec.model.path"),
    ("model path /dev", nested("spec.model.path", "/dev"), "spec.model.path"),
    ("model path with a NUL", nested("spec.model.path", "/models/clef\0"), "spec.model.path"),
    (
        "two volume sources",
        nested("spec.model.volume", {"pvc": {"claimName": "weights"}, "hostPath": {"path": "/srv"}}),
        "spec.model.volume",
    ),
    ("no volume source", nested("spec.model.volume", {"subPath": "clef"}), "spec.model.volume"),
    (
        "relative hostPath",
        nested("spec.model.volume", {"hostPath": {"path": "srv/models"}}),
        "spec.model.volume.hostPath.path",
    ),
    (
        "hostPath with '..'",
        nested("spec.model.volume", {"hostPath": {"path": "/srv/../etc"}}),
        "spec.model.volume.hostPath.path",
    ),
    (
        "claim name not a DNS subdomain",
        nested("spec.model.volume", {"pvc": {"claimName": "Weights_1"}}),
        "spec.model.volume.pvc.claimName",
    ),
    (
        "absolute subPath",
        nested("spec.model.volume", {"pvc": {"claimName": "weights"}, "subPath": "/clef"}),
        "spec.model.volume.subPath",
    ),
    (
        "subPath climbing out",
        nested("spec.model.volume", {"pvc": {"claimName": "weights"}, "subPath": "clef/../.."}),
        "spec.model.volume.subPath",
    ),
    ("model name with a space", nested("spec.model.name", "clef flash"), "spec.model.name"),
    ("negative replicas", spec(replicas=-1), "spec.replicas"),
    ("empty runtimeClassName", spec(runtimeClassName=""), "spec.runtimeClassName"),
    ("runtimeClassName with upper case", spec(runtimeClassName="NVIDIA"), "spec.runtimeClassName"),
    # Resources.
    ("GPUs in resources", resources(limits={"nvidia.com/gpu": "2"}), "spec.resources"),
    ("resource name with a space", resources(limits={"my cpu": "1"}), "spec.resources.limits"),
    ("resource name without a domain", resources(requests={"fpga": "1"}), "spec.resources.requests"),
    (
        "resource name in kubernetes.io",
        resources(limits={"kubernetes.io/fpga": "1"}),
        "spec.resources.limits",
    ),
    ("hugepages", resources(limits={"hugepages-2Mi": "2Mi", "memory": "1Gi"}), "spec.resources.limits"),
    ("quantity that is not one", resources(limits={"memory": "16 GiB"}), "spec.resources.limits"),
    ("quantity with a bad suffix", resources(requests={"cpu": "1x"}), "spec.resources.requests"),
    ("negative limit", resources(limits={"cpu": "-1"}), "spec.resources.limits"),
    ("negative request", resources(requests={"memory": "-16Gi"}), "spec.resources.requests"),
    (
        "request above the limit",
        resources(requests={"memory": "32Gi"}, limits={"memory": "16Gi"}),
        "spec.resources.requests",
    ),
    (
        "request above the limit in other units",
        resources(requests={"cpu": "1500m"}, limits={"cpu": "1"}),
        "spec.resources.requests",
    ),
    ("fractional extended resource", resources(limits={"example.com/fpga": "500m"}), "spec.resources.limits"),
    (
        "extended resource request without a limit",
        resources(requests={"example.com/fpga": "1"}),
        "spec.resources.requests",
    ),
    (
        "extended resource overcommitted",
        resources(requests={"example.com/fpga": "1"}, limits={"example.com/fpga": "2"}),
        "spec.resources.requests",
    ),
    # Environment.
    ("bad env name", spec(env=[{"name": "1BAD", "value": "x"}]), "spec.env[0].name"),
    ("env name with '='", spec(env=[{"name": "A=B", "value": "x"}]), "spec.env[0].name"),
    ("duplicate env", spec(env=[{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]), "spec.env[1]"),
    (
        "env reducing the verified shapes",
        spec(env=[{"name": "CLEF_VERIFY_SHAPES", "value": "reduced"}]),
        "spec.env[0].name",
    ),
    (
        "env moving verification to the CPU",
        spec(env=[{"name": "CLEF_VERIFY_DEVICE", "value": "cpu"}]),
        "spec.env[0].name",
    ),
    ("env injecting a fault", spec(env=[{"name": "CLEF_RUNTIME_FAULT", "value": "x"}]), "spec.env[0].name"),
    (
        "env moving the report",
        spec(env=[{"name": "CLEF_TERMINATION_LOG", "value": "/tmp/x"}]),
        "spec.env[0].name",
    ),
    (
        "env turning on Triton's interpreter",
        spec(env=[{"name": "TRITON_INTERPRET", "value": "1"}]),
        "spec.env[0].name",
    ),
    # Names that would choose the code the verifier runs (syntax.CODE_STEERING_ENV_NAMES), each.
    *(
        (
            f"env steering code: {name}",
            spec(env=[{"name": "RUST_LOG", "value": "info"}, {"name": name, "value": "/m"}]),
            "spec.env[1].name",
        )
        for name in CODE_STEERING_ENV
    ),
    # Argument lists.
    ("too many args", spec(args=["--x"] * 65), "spec.args"),
    ("oversized arg", spec(args=["x" * 1025]), "spec.args[0]"),
    ("arg with a NUL", spec(args=["--x\0y"]), "spec.args[0]"),
    (
        "verification command with a NUL",
        nested("spec.verification.command", ["verify\0"]),
        "spec.verification.command[0]",
    ),
    ("env value with a NUL", spec(env=[{"name": "A", "value": "a\0"}]), "spec.env[0].value"),
    (
        "too many verification command words",
        nested("spec.verification.command", ["x"] * 17),
        "spec.verification.command",
    ),
    # Scheduling.
    (
        "toleration Exists with a value",
        toleration(key="gpu", operator="Exists", value="v"),
        "spec.tolerations[0]",
    ),
    ("toleration key with a space", toleration(key="a b", operator="Exists"), "spec.tolerations[0].key"),
    (
        "toleration key with a long prefix",
        toleration(key=LONG_PREFIX, operator="Exists"),
        "spec.tolerations[0].key",
    ),
    ("toleration Equal without a key", toleration(operator="Equal", value="v"), "spec.tolerations[0].key"),
    ("toleration value not a label value", toleration(key="gpu", value="a b"), "spec.tolerations[0].value"),
    (
        "toleration with an unknown operator",
        toleration(key="gpu", operator="In"),
        "spec.tolerations[0].operator",
    ),
    (
        "toleration with an unknown effect",
        toleration(key="gpu", effect="Evict"),
        "spec.tolerations[0].effect",
    ),
    (
        "tolerationSeconds without NoExecute",
        toleration(key="gpu", effect="NoSchedule", tolerationSeconds=60),
        "spec.tolerations[0].tolerationSeconds",
    ),
    (
        "too many node selector labels",
        spec(nodeSelector={f"k{i}": "v" for i in range(33)}),
        "spec.nodeSelector",
    ),
    ("node selector key with a space", spec(nodeSelector={"a b": "v"}), "spec.nodeSelector"),
    ("node selector key with two slashes", spec(nodeSelector={"a/b/c": "v"}), "spec.nodeSelector"),
    ("node selector key name too long", spec(nodeSelector={"k" * 64: "v"}), "spec.nodeSelector"),
    ("node selector key prefix too long", spec(nodeSelector={LONG_PREFIX: "v"}), "spec.nodeSelector"),
    (
        "node selector key with an upper-case prefix",
        spec(nodeSelector={"Nvidia.com/gpu": "v"}),
        "spec.nodeSelector",
    ),
    ("node selector value with a space", spec(nodeSelector={"gpu": "Tesla V100"}), "spec.nodeSelector"),
    ("node selector value ending in '-'", spec(nodeSelector={"gpu": "v100-"}), "spec.nodeSelector"),
    ("node selector value too long", spec(nodeSelector={"gpu": "v" * 64}), "spec.nodeSelector"),
    ("node selector value ending in a newline", spec(nodeSelector={"gpu": "v100\n"}), "spec.nodeSelector"),
    ("env name ending in a newline", spec(env=[{"name": "RUST_LOG\n", "value": "x"}]), "spec.env[0].name"),
    # Verification and rollout.
    ("unknown suite", nested("spec.verification.suite", "all"), "spec.verification.suite"),
    ("verification mode probe (a step, not a mode)", asks_engine("probe"), "spec.verification.mode"),
    ("timeout too short", nested("spec.verification.timeoutSeconds", 5), "spec.verification.timeoutSeconds"),
    ("unknown strategy", nested("spec.rollout.strategy", "Canary"), "spec.rollout.strategy"),
    (
        "history too long",
        nested("spec.rollout.revisionHistoryLimit", 11),
        "spec.rollout.revisionHistoryLimit",
    ),
    ("model name too long", nested("metadata.name", "m" * 39), "metadata.name"),
    # Endpoint verification (mode endpoint or both: the engine is asked).
    ("unknown verification mode", nested("spec.verification.mode", "all"), "spec.verification.mode"),
    (
        "candle-vllm asks its engine by default: no runtime image",
        nested("spec.verification.mode", KeyError),
        "spec.verification.endpoint.runtimeImage",
    ),
    (
        "endpoint mode without a runtime image",
        both(asks_engine(), nested("spec.verification.endpoint", {})),
        "spec.verification.endpoint.runtimeImage",
    ),
    ("endpoint mode without the weights mounted", both(asks_engine(), without_volume), "spec.model.volume"),
    ("mode both without the weights mounted", both(asks_engine("both"), without_volume), "spec.model.volume"),
    (
        "zero new tokens",
        asks_engine(maxNewTokens=0),
        "spec.verification.endpoint.maxNewTokens",
    ),
    (
        "one new token: no decode step (issue 33, finding 9)",
        asks_engine(maxNewTokens=1),
        "spec.verification.endpoint.maxNewTokens",
    ),
    (
        "zero request timeout",
        asks_engine(requestTimeoutSeconds=0),
        "spec.verification.endpoint.requestTimeoutSeconds",
    ),
    (
        "preview ready timeout too short",
        asks_engine(readyTimeoutSeconds=5),
        "spec.verification.endpoint.readyTimeoutSeconds",
    ),
    (
        "no prompts at all",
        asks_engine(builtinPrompts="none"),
        "spec.verification.endpoint.prompts",
    ),
    (
        "duplicate prompt names",
        asks_engine(prompts=[{"name": "a", "text": "hi"}, {"name": "a", "text": "ho"}]),
        "spec.verification.endpoint.prompts[1]",
    ),
    (
        "empty prompt",
        asks_engine(prompts=[{"name": "a", "text": ""}]),
        "spec.verification.endpoint.prompts[0].text",
    ),
    (
        "runtime image not an image reference",
        asks_engine(runtimeImage="https://registry/clef-runtime"),
        "spec.verification.endpoint.runtimeImage",
    ),
    (
        "endpoint options with mode kernels",
        both(asks_engine(), nested("spec.verification.mode", "kernels")),
        "spec.verification.endpoint",
    ),
    (
        "a kernels verifier in mode endpoint",
        both(
            asks_engine(),
            spec(image=f"registry.clef.test/clef-runtime@{'sha256:' + '0123456789abcdef' * 4}"),
            nested("spec.verification.image", "registry.clef.test/verify:1.0"),
        ),
        "spec.verification.image",
    ),
    # Probes of the serving revision (spec.verification.watch).
    (
        "probe interval under a minute",
        both(asks_engine(), watch(intervalSeconds=59)),
        WATCH + ".intervalSeconds",
    ),
    (
        "probe interval over an hour",
        both(asks_engine(), watch(intervalSeconds=3601)),
        WATCH + ".intervalSeconds",
    ),
    ("probe of no prompt", both(asks_engine(), watch(prompts=0)), WATCH + ".prompts"),
    ("probe of 17 prompts", both(asks_engine(), watch(prompts=17)), WATCH + ".prompts"),
    ("probe policy unknown", both(asks_engine(), watch(policy="roll-back")), WATCH + ".policy"),
    (
        "probes in mode kernels",
        both(asks_engine(), nested("spec.verification", {"mode": "kernels", "watch": {}})),
        WATCH,
    ),
    (
        "probes of an unverified model",
        both(nested("spec.verification", {"required": False, "watch": {}})),
        WATCH,
    ),
]

# Valid inputs close to the edges of the rules above: admission must keep accepting them.
GOOD: list[tuple[str, Mutation]] = [
    ("registry with a port", spec(image="registry.local:5000/clef/runtime:1.0")),
    ("digest reference", spec(image=f"registry.local:5000/clef/runtime@{DIGEST}")),
    ("tag and digest", spec(image=f"registry.clef.test/clef/runtime:1.0@{DIGEST}")),
    ("image without a registry", spec(image="clef-runtime")),
    ("image with separators in the path", spec(image="localhost/clef__runtime/sm-70.v2:v1.0_rc-1")),
    (
        "verification image with a port",
        both(
            spec(image=f"registry.local:5000/clef/runtime@{DIGEST}"),
            nested("spec.verification.image", "registry.local:5000/clef/verify:1.0"),
        ),
    ),
    ("GPU product selector", spec(nodeSelector={"nvidia.com/gpu.product": "Tesla-V100-SXM2-16GB"})),
    ("empty selector value", spec(nodeSelector={"example.com/pool": ""})),
    (
        "toleration Exists without a value",
        toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),
    ),
    ("toleration of every taint", toleration(operator="Exists")),
    (
        "toleration with seconds",
        toleration(
            key="node.kubernetes.io/unreachable", operator="Exists", effect="NoExecute", tolerationSeconds=300
        ),
    ),
    ("toleration Equal", toleration(key="dedicated", value="clef", effect="NoSchedule")),
    (
        "quantities",
        resources(requests={"cpu": "500m", "memory": "16Gi"}, limits={"cpu": "1e3", "memory": "16Gi"}),
    ),
    (
        "decimal quantities",
        resources(requests={"cpu": ".5", "ephemeral-storage": "1.5G"}, limits={"memory": "2E"}),
    ),
    ("extended resource", resources(requests={"example.com/fpga": "1"}, limits={"example.com/fpga": "1"})),
    ("request without a limit", resources(requests={"memory": "64Gi"})),
    ("env", spec(env=[{"name": "RUST_LOG", "value": "info"}, {"name": "CLEFX", "value": "1"}])),
    (
        "env names beside the code-steering ones",
        spec(env=[{"name": n, "value": "1"} for n in NEAR_CODE_STEERING_ENV]),
    ),
    (
        "pvc with a subPath",
        nested("spec.model.volume", {"pvc": {"claimName": "weights.v1"}, "subPath": "clef/flash..v2"}),
    ),
    ("model under /tmp", nested("spec.model.path", "/tmp/models/clef-flash")),
    ("model name with a slash", nested("spec.model.name", "Qwen/Qwen3.5-Flash")),
    ("endpoint mode", asks_engine()),
    (
        "mode both, with prompts and a token cap",
        asks_engine("both", builtinPrompts="none", prompts=[{"name": "q", "text": "2+2?"}], maxNewTokens=2),
    ),
    (
        "probes that cordon, at the bounds",
        both(asks_engine(), watch(intervalSeconds=60, prompts=16, policy="cordon-pod")),
    ),
    ("probes with the defaults", both(asks_engine("both"), watch())),
    ("probes that roll back", both(asks_engine(), watch(policy="rollback"))),
    ("vllm asks its engine", both(asks_engine(), spec(engine="vllm", gpuMemoryMiB=32768))),
    (
        "mistralrs asks its engine, over every GPU of the pod",
        both(asks_engine(), spec(engine="mistralrs", gpus=2, tensorParallel=2, gpuMemoryMiB=32768)),
    ),
    ("default mode, unverified: no runtime image needed", nested("spec.verification", {"required": False})),
]
