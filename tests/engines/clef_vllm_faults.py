"""Faults injected into a real vLLM (its CPU build, 0.32.0) from outside its installed files: the
real-engine tier's (b) and (c) (docs/verification.md, "The real-engine tier").

Its faults act inside vLLM's processes only (importing it imports no vLLM).
`tests/engines/vllm_faults.py` writes a distribution next to a copy of it (a `.dist-info` with two
entry points) on a directory the test puts on vLLM's PYTHONPATH, and vLLM loads it through its own
plugin groups:

* ``vllm.general_plugins`` -> `register`, called at start in every vLLM process (the engine core
  that runs the model included);
* ``vllm.logits_processors`` -> `RunnerUpAt`, which the engine core builds into every batch.

``CLEF_VLLM_FAULT`` names the fault; unset or empty, nothing changes.  An unknown value stops vLLM
(`register` raises in every process): a typo must not turn a fault drill into a clean run.

* ``conv_key_band_zero``: the seed's fault (clef's own ``conv_key_band_zero``): the output of the
  GDN causal conv over a prompt (vLLM's CPU prefill path) has its key channel band ``[K, 2K)``
  written as zero (K: the layer's key dim; channels are ``[q | k | v]``), so the delta rule never
  writes its state from the prompt.  The output only: the conv state the op keeps holds the
  healthy inputs, and decode steps are not touched.
* ``runner_up_at:<N>``: at the one step of a request whose last fed token sits at absolute
  position N (prompt length + tokens generated so far - 1), the engine's top two logits trade
  places, so greedy decoding emits the engine's own runner-up there, once.

Every action is written to stderr as a line starting with ``clef-vllm-fault:`` (installed, and the
first time it fires in a process), so a test can see that the fault was loaded and acted.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

ENV = "CLEF_VLLM_FAULT"
PREFIX = "clef-vllm-fault:"
FAULTS = ("conv_key_band_zero", "runner_up_at:<N>")


def parse(value: str) -> tuple[str | None, int | None]:
    """(fault name, position) from a ``CLEF_VLLM_FAULT`` value; (None, None) when empty."""
    value = value.strip()
    if not value:
        return None, None
    if value == "conv_key_band_zero":
        return value, None
    name, _, at = value.partition(":")
    if name == "runner_up_at" and at.isdigit():
        return name, int(at)
    raise ValueError(f"{ENV}={value!r} is not one of {', '.join(FAULTS)} (N: a position, 0 or more)")


def active() -> tuple[str | None, int | None]:
    return parse(os.environ.get(ENV, ""))


def say(message: str) -> None:
    print(f"{PREFIX} {message} (pid {os.getpid()})", file=sys.stderr, flush=True)


def register() -> None:
    """The ``vllm.general_plugins`` entry point."""
    fault, at = active()
    if fault == "conv_key_band_zero":
        _install_conv_key_band_zero()
        say("conv_key_band_zero installed on vLLM's CPU GDN prefill conv")
    elif fault == "runner_up_at":
        say(f"runner_up_at:{at} selected (acts through the RunnerUpAt logits processor)")


# ---- (b) the seed's fault ------------------------------------------------------------------

GDN_CPU = "vllm.model_executor.layers.mamba.ops.cpu.gdn_attention"


def _install_conv_key_band_zero() -> None:
    """Wrap the CPU GDN path's prefill conv (both of its implementations: the C++ one on CPUs with
    AVX512-BF16, the torch one otherwise) so that its output's key band is zero.  The band comes
    from the layer being run, which the non-speculative GDN core receives: it is recorded around
    that call."""
    gdn: Any = importlib.import_module(GDN_CPU)
    current: list[Any] = []  # the layer whose GDN core is running (at most one)

    def core(layer: Any, *args: Any, **kw: Any) -> Any:
        current.append(layer)
        try:
            return original_core(layer, *args, **kw)
        finally:
            current.pop()

    def key_band_zeroed(conv: Callable[..., Any]) -> Callable[..., Any]:
        fired: list[bool] = []

        @functools.wraps(conv)
        def wrapped(*args: Any, **kw: Any) -> Any:
            out = conv(*args, **kw)
            if not current:
                raise RuntimeError(f"{PREFIX} {conv.__name__} ran outside a GDN layer: no key band")
            layer = current[-1]
            k = layer.key_dim // layer.tp_size
            channels = 2 * k + layer.value_dim // layer.tp_size
            if out.dim() != 2 or out.shape[0] != channels:
                raise RuntimeError(
                    f"{PREFIX} {conv.__name__} returned {tuple(out.shape)}, not (channels {channels}, tokens)"
                )
            out[k : 2 * k] = 0  # channels first: [q | k | v] x tokens
            if not fired:
                fired.append(True)
                say(f"conv_key_band_zero fired: {conv.__name__}, key band [{k}, {2 * k}) of {channels}, "
                    f"{out.shape[1]} prompt tokens, layer {layer.prefix}")  # fmt: skip
            return out

        return wrapped

    original_core = gdn._cpu_gdn_attention_nonspec
    gdn._cpu_gdn_attention_nonspec = core
    gdn._causal_conv1d_fwd_cpu = key_band_zeroed(gdn._causal_conv1d_fwd_cpu)
    gdn.causal_conv1d_torch = key_band_zeroed(gdn.causal_conv1d_torch)


# ---- (c) one step emits the runner-up ---------------------------------------------------------


@functools.cache
def _runner_up_class() -> type:
    base: Any = importlib.import_module("vllm.v1.sample.logits_processor")
    swap, logits_processor = base.MoveDirectionality.SWAP, base.LogitsProcessor

    class RunnerUpAt(logits_processor):  # type: ignore[misc,valid-type]  # vLLM is not in clef's venv
        """``runner_up_at:<N>``: see the module's docstring.  Without that fault it claims to be
        argmax-invariant, so vLLM never applies it to a greedy request."""

        def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
            fault, at = active()
            self.at = at if fault == "runner_up_at" else None
            self.rows: dict[int, tuple[int, list[int]]] = {}  # batch row -> (prompt length, live output ids)
            if self.at is not None:
                say(f"runner_up_at:{self.at} installed as a logits processor")

        def is_argmax_invariant(self) -> bool:
            return self.at is None

        def update_state(self, batch_update: Any) -> None:
            if batch_update is None:
                return
            for row in batch_update.removed:
                self.rows.pop(row, None)
            for row, _params, prompt, output in batch_update.added:
                self.rows[row] = (len(prompt or ()), output)
            for a, b, direction in batch_update.moved:
                moved_a, moved_b = self.rows.pop(a, None), self.rows.pop(b, None)
                if moved_a is not None:
                    self.rows[b] = moved_a
                if direction == swap and moved_b is not None:
                    self.rows[a] = moved_b

        def apply(self, logits: Any) -> Any:
            if self.at is None:
                return logits
            for row, (prompt_len, output) in self.rows.items():
                if prompt_len + len(output) - 1 != self.at:
                    continue
                values, ids = logits[row].topk(2)
                logits[row, ids[0]], logits[row, ids[1]] = values[1], values[0]
                say(f"runner_up_at:{self.at} fired: prompt of {prompt_len} tokens, generated position "
                    f"{len(output)}: {int(ids[1])} emitted instead of {int(ids[0])}")  # fmt: skip
            return logits

    return RunnerUpAt


def __getattr__(name: str) -> Any:
    """`RunnerUpAt` is built on first use, so that importing this module (for `register`, early in
    vLLM's start) imports no more of vLLM than the fault needs."""
    if name == "RunnerUpAt":
        return _runner_up_class()
    raise AttributeError(name)
