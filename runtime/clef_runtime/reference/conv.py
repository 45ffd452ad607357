"""Depthwise causal conv1d, written from its definition (one tap at a time, float64)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from clef_runtime.reference.common import REF_DTYPE, seq_bounds


def _activate(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation is None:
        return y
    if activation in ("silu", "swish"):
        return F.silu(y)
    raise ValueError(f"activation {activation!r} is not supported: use 'silu' or None")


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    activation: str | None = "silu",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    B, T, D = x.shape
    W = weight.shape[1]
    bounds = seq_bounds(B, T, cu_seqlens)
    w = weight.to(REF_DTYPE)
    y = torch.empty(B, T, D, dtype=REF_DTYPE, device=x.device)
    finals = []
    for n, (b, start, end) in enumerate(bounds):
        hist = (
            initial_state[n].to(REF_DTYPE).transpose(0, 1)
            if initial_state is not None
            else torch.zeros(W - 1, D, dtype=REF_DTYPE, device=x.device)
        )
        seq = torch.cat([hist, x[b, start:end].to(REF_DTYPE)], dim=0)  # [W-1+L, D]
        L = end - start
        acc = torch.zeros(L, D, dtype=REF_DTYPE, device=x.device)
        for j in range(W):
            acc += seq[j : j + L] * w[:, j]
        if bias is not None:
            acc += bias.to(REF_DTYPE)
        y[b, start:end] = _activate(acc, activation)
        finals.append(seq[seq.shape[0] - (W - 1) :].transpose(0, 1))
    final = torch.stack(finals).to(x.dtype) if output_final_state else None
    return y.to(x.dtype), final


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    activation: str | None = "silu",
    state_indices: torch.Tensor | None = None,
) -> torch.Tensor:
    B, T, D = x.shape
    W = weight.shape[1]
    w = weight.to(REF_DTYPE)
    y = torch.zeros(B, T, D, dtype=REF_DTYPE, device=x.device)
    for b in range(B):
        slot = b if state_indices is None else int(state_indices[b])
        if slot < 0:
            continue
        seq = torch.cat([conv_state[slot].to(REF_DTYPE).transpose(0, 1), x[b].to(REF_DTYPE)], dim=0)
        acc = torch.zeros(T, D, dtype=REF_DTYPE, device=x.device)
        for j in range(W):
            acc += seq[j : j + T] * w[:, j]
        if bias is not None:
            acc += bias.to(REF_DTYPE)
        y[b] = _activate(acc, activation)
        conv_state[slot].copy_(seq[seq.shape[0] - (W - 1) :].transpose(0, 1).to(conv_state.dtype))
    return y.to(x.dtype)
