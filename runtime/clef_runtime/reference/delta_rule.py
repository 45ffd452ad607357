"""The gated delta rule, token by token, exactly as its recurrence reads (float64).

Per value head h (reading key head h // (HV // H)), with the state S of shape [K, V]:

    S   = S * exp(g_t)
    u   = beta_t * (v_t - S^T k_t)
    S   = S + k_t u^T
    o_t = S^T (scale * q_t)

Both the chunked prefill and the fused decode kernels are compared against this one loop.
"""

from __future__ import annotations

import torch

from clef_runtime.reference.common import REF_DTYPE, seq_bounds
from clef_runtime.reference.gating import l2norm


def _check_heads(q: torch.Tensor, v: torch.Tensor) -> int:
    H, HV = q.shape[2], v.shape[2]
    if HV % H != 0:
        raise ValueError(f"value heads ({HV}) must be a multiple of key heads ({H})")
    return HV // H


def _run(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    S: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence: q, k [L, HV, K]; v [L, HV, V]; g, beta [L, HV]; S [HV, K, V] (all float64)."""
    out = torch.empty_like(v)
    for t in range(q.shape[0]):
        S = S * torch.exp(g[t])[:, None, None]
        pred = torch.einsum("hkv,hk->hv", S, k[t])
        u = beta[t][:, None] * (v[t] - pred)
        S = S + torch.einsum("hk,hv->hkv", k[t], u)
        out[t] = torch.einsum("hkv,hk->hv", S, q[t] * scale)
    return out, S


def _prep(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, use_qk_l2norm: bool
) -> tuple[torch.Tensor, torch.Tensor, int]:
    group = _check_heads(q, v)
    if use_qk_l2norm:
        q, k = l2norm(q.to(REF_DTYPE)), l2norm(k.to(REF_DTYPE))
    # value head h reads key head h // group
    qe = q.to(REF_DTYPE).repeat_interleave(group, dim=2)
    ke = k.to(REF_DTYPE).repeat_interleave(group, dim=2)
    return qe, ke, group


def chunk_gated_delta_rule(
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
    B, T, _, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K**-0.5 if scale is None else scale
    qe, ke, _ = _prep(q, k, v, use_qk_l2norm)
    ve, ge, be = v.to(REF_DTYPE), g.to(REF_DTYPE), beta.to(REF_DTYPE)
    out = torch.zeros(B, T, HV, V, dtype=REF_DTYPE, device=v.device)
    finals = []
    for n, (b, s, e) in enumerate(seq_bounds(B, T, cu_seqlens)):
        S0 = (
            initial_state[n].to(REF_DTYPE)
            if initial_state is not None
            else torch.zeros(HV, K, V, dtype=REF_DTYPE, device=v.device)
        )
        o, S = _run(qe[b, s:e], ke[b, s:e], ve[b, s:e], ge[b, s:e], be[b, s:e], S0, scale)
        out[b, s:e] = o
        finals.append(S)
    final = torch.stack(finals).float() if output_final_state else None
    return out.to(v.dtype), final


def fused_recurrent_gated_delta_rule(
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
    B, T, _, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K**-0.5 if scale is None else scale
    qe, ke, _ = _prep(q, k, v, use_qk_l2norm)
    ve, ge, be = v.to(REF_DTYPE), g.to(REF_DTYPE), beta.to(REF_DTYPE)
    out = torch.zeros(B, T, HV, V, dtype=REF_DTYPE, device=v.device)
    for b in range(B):
        slot = b if state_indices is None else int(state_indices[b])
        if slot < 0:
            continue
        o, S = _run(qe[b], ke[b], ve[b], ge[b], be[b], state[slot].to(REF_DTYPE), scale)
        out[b] = o
        state[slot].copy_(S.to(state.dtype))
    return out.to(v.dtype)
