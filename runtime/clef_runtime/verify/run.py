"""`clef-runtime verify`: run the suites, write the reports, choose the exit code.

Exit codes (`clef_contract.command.ExitCode`): every check passed; a check failed (the candidate
computes something else); nothing trustworthy could be measured here (no GPU, bad config, missing
checkpoint, unknown fault name, a crash outside the ops).  The operator treats anything but a pass
as "not verified".
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    import torch

    from clef_runtime.model.config import ModelConfig
    from clef_runtime.opset import OpSet
    from clef_runtime.verify.kernels import GdnShape, Sizes
    from clef_runtime.verify.model_suite import Workload

from clef_contract.command import SHAPE_FLAG, SHAPE_KEYS, SUITES, ShapeError, parse_shape
from clef_runtime import __version__
from clef_runtime.dtypes import NAMES, torch_dtype
from clef_runtime.faults import UnknownFaultError, active_fault
from clef_runtime.verify.environment import (
    CannotRun,
    Placement,
    check_device,
    ran_kernel_config,
    resolve_placement,
)
from clef_runtime.verify.report import Report

# What `verify` generates when no checkpoint is mounted, per shape profile.  "model" keeps the
# architecture's layer pattern, head counts, head dims and conv width and shrinks only the width
# and vocabulary, so the suite fits a 16 GB V100 beside nothing else (budget: < 4 GiB peak).
MODEL_PROFILE_WIDTH = {"hidden_size": 512, "intermediate_size": 1024, "vocab_size": 4096}
# "reduced" is for CPU hosts (CI, the local cluster): tiny heads, one period of the pattern.
REDUCED_HEADS = {
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
}
REDUCED_WIDTH = {"hidden_size": 64, "intermediate_size": 128, "vocab_size": 256}


@dataclass(frozen=True)
class VerifyArgs:
    suite: str = "full"
    dtype: str = "f16"
    preset: str = "qwen3_5"
    config: str | None = None
    checkpoint: str | None = None
    device: str | None = None
    shapes: str | None = None
    seed: int = 0
    tolerance_scale: float = 1.0
    report: str | None = None  # full report path; None → stdout
    termination_log: str | None = None
    shape: tuple[str, ...] = ()  # KEY=VALUE overrides of the architecture (contract's SHAPE_KEYS)
    kernel_config: str | None = None  # None: CLEF_KERNEL_CONFIG or "auto" (`clef_runtime.kernel_config`)


def _env_info() -> dict[str, str]:
    info = {"python": platform.python_version(), "platform": platform.platform()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = str(torch.version.cuda)
    except Exception as exc:  # report what is missing rather than failing the report itself
        info["torch"] = f"unavailable: {exc}"
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception as exc:
        info["triton"] = f"unavailable: {exc}"
    info["triton_interpret"] = os.environ.get("TRITON_INTERPRET", "")
    return info


def run_verify(args: VerifyArgs) -> Report:
    report = Report(
        suite=args.suite, dtype=args.dtype, device="unknown", runtime_version=__version__, shapes="?"
    )
    started = time.perf_counter()
    try:
        _run(args, report)
    except CannotRun as exc:
        report.error = str(exc)
    except UnknownFaultError as exc:
        report.error = str(exc)
    except Exception as exc:
        report.error = f"{type(exc).__name__}: {exc}"
        traceback.print_exc(file=sys.stderr)
    report.durations["total"] = round(time.perf_counter() - started, 3)
    report.environment = _env_info()
    return report


def _run(args: VerifyArgs, report: Report) -> None:
    _check_args(args)
    placement = resolve_placement(args.device, args.shapes, args.termination_log, args.kernel_config)
    report.shapes = placement.shapes
    report.fault = active_fault()  # raises on an unknown name before anything runs

    # Imported only now: TRITON_INTERPRET must be settled before the first `import triton`.
    import torch

    from clef_runtime.opset import get_opset

    report.device = check_device(placement)
    device = torch.device(placement.device)
    report.kernel_config = ran_kernel_config(placement, args.dtype)
    report.summary_parts.append(f"kernel config {report.kernel_config}")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()

    config = _model_config(args)
    profile = _Profile.of(config, placement.shapes)
    report.model_shape = profile.described()
    ref = get_opset("reference")
    if args.suite in ("kernels", "full"):
        _kernels_step(args, report, profile, placement, ref, device)
    if args.suite in ("model", "full"):
        # a mounted checkpoint runs as it is, whatever the profile
        model_config = config if args.checkpoint else profile.config
        _model_step(args, report, model_config, profile.workload, placement, ref, device)
    if device.type == "cuda":
        report.peak_gpu_memory_bytes = int(torch.cuda.max_memory_allocated())


def _check_args(args: VerifyArgs) -> None:
    if args.suite not in SUITES:
        raise CannotRun(f"--suite {args.suite!r} is not one of {', '.join(SUITES)}")
    if args.dtype not in NAMES:
        raise CannotRun(f"--dtype {args.dtype!r} is not one of {', '.join(NAMES)}")
    if not 0.1 <= args.tolerance_scale <= 100:
        raise CannotRun(f"--tolerance-scale {args.tolerance_scale} must be within [0.1, 100]")


def _model_config(args: VerifyArgs) -> ModelConfig:
    """The architecture under test: the mounted checkpoint's, a config file's or a preset's, with
    the `--shape` overrides (which must agree with a mounted checkpoint)."""
    from clef_runtime.model.config import ConfigError, ModelConfig, preset

    try:
        if args.checkpoint is not None:
            ckpt = Path(args.checkpoint)
            if not (ckpt / "config.json").is_file():
                raise CannotRun(
                    f"--checkpoint {ckpt}: no config.json there (is the model volume mounted at this path?)"
                )
            config = ModelConfig.from_json(ckpt)
        elif args.config is not None:
            if not Path(args.config).is_file():
                raise CannotRun(f"--config {args.config}: file not found")
            config = ModelConfig.from_json(args.config)
        else:
            config = preset(args.preset)
        try:
            overrides = parse_shape(args.shape)
        except ShapeError as exc:
            raise CannotRun(str(exc)) from None
        if overrides:
            wanted = _apply_shape(config, overrides)
            if args.checkpoint is not None:
                _check_against_checkpoint(config, wanted, args.checkpoint)
            config = wanted
    except ConfigError as exc:
        raise CannotRun(f"bad model config: {exc}") from exc
    return config


@dataclass(frozen=True)
class _Profile:
    """What the suites run at: the architecture as the shape profile shrinks it, the GDN shape
    and sizes of the kernel cases, and the model suite's workload."""

    config: ModelConfig
    shape: GdnShape
    sizes: Sizes
    workload: Workload

    @classmethod
    def of(cls, config: ModelConfig, shapes: str) -> _Profile:
        from clef_runtime.verify import kernels as ksuite
        from clef_runtime.verify import model_suite as msuite

        reduced = shapes == "reduced"
        if reduced:
            config = config.replace(**REDUCED_HEADS, **REDUCED_WIDTH, layer_types=config.layer_types[:4])
        shape = ksuite.GdnShape(
            key_heads=config.linear_num_key_heads,
            value_heads=config.linear_num_value_heads,
            key_dim=config.linear_key_head_dim,
            value_dim=config.linear_value_head_dim,
            conv_width=config.linear_conv_kernel_dim,
        )
        if reduced:
            return cls(config, shape, ksuite.REDUCED_SIZES, msuite.REDUCED_WORKLOAD)
        return cls(config, shape, ksuite.MODEL_SIZES, msuite.MODEL_WORKLOAD)

    def described(self) -> dict[str, object]:
        return {
            "layers": self.config.num_hidden_layers,
            "gdn_layers": len(self.config.linear_layers),
            "attention_layers": len(self.config.full_layers),
            "linear_key_heads": self.shape.key_heads,
            "linear_value_heads": self.shape.value_heads,
            "key_dim": self.shape.key_dim,
            "value_dim": self.shape.value_dim,
            "conv_width": self.shape.conv_width,
        }


def _kernels_step(
    args: VerifyArgs,
    report: Report,
    profile: _Profile,
    placement: Placement,
    ref: OpSet,
    device: torch.device,
) -> None:
    from clef_runtime.opset import get_opset
    from clef_runtime.verify import kernels as ksuite

    # the key-band fault needs the conv bands under test: the kernel cases' here, the model's in
    # the model step
    fast = get_opset("triton", qkv_split=profile.shape.qkv_split, kernel_config=placement.kernel_config)
    t0 = time.perf_counter()
    checks = ksuite.run_kernels_suite(
        fast,
        ref,
        profile.shape,
        profile.sizes,
        args.dtype,
        device,
        seed=args.seed,
        tolerance_scale=args.tolerance_scale,
    )
    report.checks.extend(checks)
    report.durations["kernels"] = round(time.perf_counter() - t0, 3)
    report.summary_parts.append(f"kernel checks {sum(c.passed for c in checks)}/{len(checks)}")


def _model_step(
    args: VerifyArgs,
    report: Report,
    config: ModelConfig,
    workload: Workload,
    placement: Placement,
    ref: OpSet,
    device: torch.device,
) -> None:
    from clef_runtime.model.checkpoint import random_weights
    from clef_runtime.model.weights import WeightsError, load_weights
    from clef_runtime.opset import get_opset
    from clef_runtime.verify import model_suite as msuite

    t0 = time.perf_counter()
    if args.checkpoint is not None:
        try:
            weights = load_weights(args.checkpoint, config, device=device)
        except (WeightsError, OSError) as exc:
            raise CannotRun(f"--checkpoint {args.checkpoint}: cannot load the weights: {exc}") from exc
        report.model_shape["weights"] = f"checkpoint {args.checkpoint}"
    else:
        # Generated weights are untied whatever the architecture says: a tied random table makes
        # every token predict itself, and tying does not touch the GDN kernels under test.
        config = config.replace(tie_word_embeddings=False)
        if placement.shapes != "reduced":
            config = config.replace(**MODEL_PROFILE_WIDTH)
        weights = random_weights(config, seed=args.seed)
        report.model_shape["weights"] = f"generated from seed {args.seed}"
    report.model_shape["model_hidden_size"] = config.hidden_size
    report.model_shape["model_vocab_size"] = config.vocab_size
    fast = get_opset("triton", qkv_split=config.qkv_split, kernel_config=placement.kernel_config)  # own bands
    outcome = msuite.run_model_suite(
        config, weights, fast, ref, args.dtype, torch_dtype(args.dtype), device, workload,
        seed=args.seed, tolerance_scale=args.tolerance_scale,
    )  # fmt: skip
    del weights
    report.checks.extend(outcome.checks)
    report.layer_stats = outcome.layer_stats
    report.summary_parts.extend(outcome.summary_parts)
    report.durations["model"] = round(time.perf_counter() - t0, 3)


def _apply_shape(config: ModelConfig, overrides: dict[str, int]) -> ModelConfig:
    from clef_runtime.model.config import FULL, LINEAR

    ints = {SHAPE_KEYS[k]: v for k, v in overrides.items()}
    layers = ints.pop("num_layers", config.num_hidden_layers)
    interval = ints.pop("full_attention_interval", None)
    changes: dict[str, object] = dict(ints)
    if interval is not None or layers != config.num_hidden_layers:
        if interval is None:
            full = config.full_layers
            interval = full[0] + 1 if full else layers + 1
        changes["layer_types"] = tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in range(layers))
    return config.replace(**changes)  # validates: a ConfigError names the field


def _check_against_checkpoint(config: ModelConfig, wanted: ModelConfig, where: str) -> None:
    """The ClefModel's architecture (``--shape``) must describe the mounted weights."""
    fields = (
        "layer_types",
        *{f for f in SHAPE_KEYS.values() if f not in ("num_layers", "full_attention_interval")},
    )
    diff = [
        f"{f}: spec {getattr(wanted, f)} vs config.json {getattr(config, f)}"
        for f in sorted(fields)
        if getattr(wanted, f) != getattr(config, f)
    ]
    if diff:
        raise CannotRun(
            f"{SHAPE_FLAG} disagrees with {where}/config.json: "
            + "; ".join(diff)
            + " (fix spec.model.architecture or the mounted weights)"
        )


def emit(report: Report, full_out: TextIO, full_path: str | None, termination_log: str) -> None:
    """Full report to stdout (or a file); compact report to the termination log."""
    text = json.dumps(report.to_full(), indent=2, ensure_ascii=False)
    if full_path:
        Path(full_path).write_text(text + "\n")
    else:
        full_out.write(text + "\n")
        full_out.flush()
    compact = report.to_compact()
    try:
        with open(termination_log, "w", encoding="utf-8") as fh:
            fh.write(compact)
    except OSError as exc:
        # Outside Kubernetes there is usually no /dev/termination-log: the full report above
        # still carries everything, so say so and carry on.
        print(f"verify: could not write the compact report to {termination_log}: {exc}", file=sys.stderr)
