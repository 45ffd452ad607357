"""The op contract shared by the Triton kernels (`clef_runtime.ops`) and the plain-PyTorch
references (`clef_runtime.reference`).

The hybrid model, `verify` and the benchmarks only ever call ops through an `OpSet`, so one
switch (`get_opset("triton")` / `get_opset("reference")`) moves a whole model between the
fast kernels and the reference.

Layouts (all tensors contiguous unless stated):

* tokens are ``[B, T, ...]``; with ``cu_seqlens`` (int32, ``[N + 1]``, starting at 0 and ending
  at ``T``) the batch must be ``B == 1`` and holds ``N`` sequences packed back to back;
* ``N`` is the number of sequences: ``B`` without ``cu_seqlens``, ``len(cu_seqlens) - 1`` with;
* conv: ``x`` is ``[B, T, D]`` (channels last, as the projections produce it), ``weight`` is
  ``[D, W]`` (depthwise, ``W`` the conv width), conv state is ``[N or pool, D, W - 1]`` holding
  the last ``W - 1`` inputs (pre-activation), oldest first, in the dtype of ``x``;
* GDN: ``q, k`` are ``[B, T, H, K]``, ``v`` is ``[B, T, HV, V]`` with ``HV % H == 0``; value head
  ``i`` reads key head ``i // (HV // H)``; ``g`` (log-decay, ≤ 0) and ``beta`` are
  ``[B, T, HV]`` float32; the recurrent state is ``[N or pool, HV, K, V]`` float32;
* ``state_indices`` (int32 ``[B]``) maps batch row ``b`` to a slot of a larger state pool; a
  negative index means "padding row: neither read nor write state, output zeros".

The delta rule, per value head, with ``S`` of shape ``[K, V]``::

    S = S * exp(g_t)
    u = beta_t * (v_t - S^T k_t)
    S = S + k_t u^T
    o_t = S^T (scale * q_t)            # scale defaults to K ** -0.5

Dtype policy: inputs may be f32, bf16 or f16.  State and every accumulation stay float32 (f16
has a max of 65504, a long context overflows it); outputs are cast to the input dtype.
"""

from __future__ import annotations

from typing import Protocol

import torch


class OpSet(Protocol):
    """What an op implementation provides.  See the module docstring for layouts."""

    name: str

    def causal_conv1d(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        initial_state: torch.Tensor | None = None,
        output_final_state: bool = False,
        cu_seqlens: torch.Tensor | None = None,
        activation: str | None = "silu",
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Depthwise causal conv over time (prefill).  ``y[t] = act(bias + sum_j w[:, j] *
        x[t - (W - 1) + j])``, inputs before the sequence start taken from ``initial_state``
        (zeros if None).  Returns ``(y [B, T, D], final_state [N, D, W - 1] or None)``."""
        ...

    def causal_conv1d_update(
        self,
        x: torch.Tensor,
        conv_state: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        activation: str | None = "silu",
        state_indices: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Decode: ``x`` is ``[B, T, D]`` with a few new tokens per sequence (usually T = 1).
        ``conv_state`` (``[pool, D, W - 1]``) is read and shifted **in place**.  Returns y."""
        ...

    def gdn_gating(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        A_log: torch.Tensor,
        dt_bias: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``g = -exp(A_log) * softplus(a + dt_bias)``, ``beta = sigmoid(b)``; a, b ``[..., HV]``,
        A_log and dt_bias ``[HV]``.  Both results float32 with the shape of ``a``."""
        ...

    def l2norm(self, x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        """``x * rsqrt(sum(x^2, -1) + eps)`` computed in float32, returned in x's dtype."""
        ...

    def chunk_gated_delta_rule(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        *,
        scale: float | None = None,
        initial_state: torch.Tensor | None = None,
        output_final_state: bool = False,
        cu_seqlens: torch.Tensor | None = None,
        use_qk_l2norm: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Prefill.  Returns ``(o [B, T, HV, V] in v's dtype, final_state [N, HV, K, V] f32)``.
        With ``use_qk_l2norm`` q and k are L2-normalised (eps 1e-6) inside the op."""
        ...

    def fused_recurrent_gated_delta_rule(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        *,
        state: torch.Tensor,
        scale: float | None = None,
        state_indices: torch.Tensor | None = None,
        use_qk_l2norm: bool = False,
    ) -> torch.Tensor:
        """Decode: a few tokens per sequence, token by token.  ``state`` (``[pool, HV, K, V]``
        f32) is updated **in place**.  Returns ``o [B, T, HV, V]`` in v's dtype."""
        ...

    def gated_rmsnorm(
        self,
        x: torch.Tensor,
        z: torch.Tensor,
        weight: torch.Tensor,
        eps: float = 1e-6,
    ) -> torch.Tensor:
        """``x * rsqrt(mean(x^2, -1) + eps) * weight * silu(z)``, normalised over the last dim,
        computed in float32, returned in x's dtype.  x, z ``[..., V]``, weight ``[V]``."""
        ...


def get_opset(
    name: str,
    *,
    qkv_split: tuple[int, int, int] | None = None,
    kernel_config: str | None = None,
) -> OpSet:
    """``"triton"`` for clef's kernels, ``"reference"`` for the plain-PyTorch references.

    The Triton op set carries the fault named by ``CLEF_RUNTIME_FAULT`` (`clef_runtime.faults`),
    read here, once: an unknown name raises `UnknownFaultError`.  ``qkv_split``, the sizes of the
    q, k and v channel bands of the GDN conv (``[q | k | v]``), is read by one fault only,
    ``conv_key_band_zero``, to find the key band; without it that fault cannot be built.

    ``kernel_config`` (``auto``, ``fma``, ``tensor-core``; None: ``CLEF_KERNEL_CONFIG``, read here,
    once) forces the chunked delta rule's launch configuration (`clef_runtime.kernel_config`): the
    only op whose configuration depends on the device.  An unknown name raises
    `UnknownKernelConfigError`."""
    if name == "triton":
        from clef_runtime.faults import active_fault
        from clef_runtime.kernel_config import forced_tensor_cores
        from clef_runtime.kernel_config import kernel_config as resolve
        from clef_runtime.ops import TRITON_OPS

        forced = forced_tensor_cores(resolve(kernel_config))
        fault = active_fault()
        ops = TRITON_OPS
        if fault is not None:
            from clef_runtime.ops.faulty import with_fault

            ops = with_fault(TRITON_OPS, fault, qkv_split)
        if forced is None:
            return ops
        from clef_runtime.ops import with_tensor_cores

        return with_tensor_cores(ops, forced)
    if name == "reference":
        from clef_runtime.reference import REFERENCE_OPS

        return REFERENCE_OPS
    raise ValueError(f"unknown op set {name!r}: use 'triton' or 'reference'")
