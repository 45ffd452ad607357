"""The in-chunk triangular solve of launch 1 in NumPy, with the diagonal blocks' doubling in IEEE
float32, 3xTF32, TF32 or f16 operands (the GPU's tensor-core modes, emulated: TF32 rounds an
operand's mantissa to 10 bits; 3xTF32 sums the three TF32 products of the split operands; f16
rounds an operand to float16, range included: subnormals, overflow), then the module's block
combine (depth 3: T = D⁻¹ − W + M² (D⁻¹ − W), W = M D⁻¹, M = D⁻¹ L) in TF32 or f16.  Prints the
mean relative error of D⁻¹, of T = (I + A)⁻¹ and of T rounded to bf16 (what the walk takes)
against float64 over 60 chunks, and the largest |T| entry, on the bench's input distribution, on
the worst case of test_repeated_keys_full_beta_no_decay, with strong decays (tiny entries: f16's
subnormal range) and with β up to 2 (negative eigenvalues allowed: the largest entries).  The
Triton interpreter ignores input_precision, so this is the CPU's only view of what those modes
do (docs/performance.md, fifth and eleventh passes).

    python3 hack/solve_precision_emulation.py
"""

from __future__ import annotations

import numpy as np

BT, BC = 64, 16
rng = np.random.default_rng(0)


def tf32(x: np.ndarray) -> np.ndarray:
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x1000) & 0xFFFFE000  # to nearest (ties away), 10-bit mantissa
    return bits.astype(np.uint32).view(np.float32)


def bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16 (to nearest even), as float32."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def dot(a: np.ndarray, b: np.ndarray, precision: str) -> np.ndarray:
    a, b = a.astype(np.float32), b.astype(np.float32)
    if precision == "ieee":
        return np.matmul(a, b, dtype=np.float32)
    if precision == "f16":  # float16 operands, float32 accumulation
        return np.matmul(a.astype(np.float16).astype(np.float32), b.astype(np.float16).astype(np.float32))
    ab, bb = tf32(a), tf32(b)
    if precision == "tf32":
        return np.matmul(ab, bb, dtype=np.float32)
    small = np.matmul(ab, tf32(b - bb), dtype=np.float32) + np.matmul(tf32(a - ab), bb, dtype=np.float32)
    return small + np.matmul(ab, bb, dtype=np.float32)


def chunk_A(kind: str) -> np.ndarray:
    """A = β k̂ k̂ᵀ ⊙ decay, strictly lower, for one chunk of 64 tokens (K = 128)."""
    g = -np.log1p(np.exp(-rng.normal(3, 1, BT)))  # logsigmoid(N(3, 1))
    beta = 1 / (1 + np.exp(-rng.normal(0, 1, BT)))
    if kind == "repeated":  # runs of 40 equal-ish keys, β = 1, g = 0
        base = rng.normal(size=(2, 128))
        k = base[(np.arange(BT) // 40) % 2] + 1e-3 * rng.normal(size=(BT, 128))
        g[:], beta[:] = 0, 1
    else:
        k = rng.normal(size=(BT, 128))
    if kind == "decay":  # strong decays: entries down to e^-60 (float16 flushes below 6e-8)
        g = -np.log1p(np.exp(-rng.normal(-1, 1, BT)))
    if kind == "beta2":  # β in (0, 2), correlated keys: the largest entries of T
        beta = 2 / (1 + np.exp(-rng.normal(2, 1, BT)))
        k = rng.normal(size=(1, 128)) + 0.3 * rng.normal(size=(BT, 128))
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    G = np.cumsum(g)
    return np.tril(beta[:, None] * (k @ k.T) * np.exp(G[:, None] - G[None, :]), -1).astype(np.float32)


def solve(A: np.ndarray, doubling: str, combine: str = "tf32") -> tuple[np.ndarray, np.ndarray]:
    """(T, D⁻¹) as launch 1 forms them: doubling on the 16×16 diagonal blocks, then
    T = D⁻¹ − W + M² (D⁻¹ − W) with W = M D⁻¹ and M = D⁻¹ L, its dots in `combine`."""
    r = np.arange(BT)
    same = (r // BC)[:, None] == (r // BC)[None, :]
    N = np.where(same, A, 0)
    X = np.eye(BT, dtype=np.float32) - np.where((r // 2)[:, None] == (r // 2)[None, :], N, 0)
    for lvl in range(1, 4):
        joins = ((r >> (lvl + 1))[:, None] == (r >> (lvl + 1))[None, :]) & (
            (r >> lvl)[:, None] != (r >> lvl)[None, :]
        )
        X = X - dot(dot(X, np.where(joins, N, 0), doubling), X, doubling)
    M = dot(X, np.where(same, 0, A), combine)
    W = dot(M, X, combine)
    return X - W + dot(dot(M, M, combine), X - W, combine), X


def main() -> None:
    same = (np.arange(BT) // BC)[:, None] == (np.arange(BT) // BC)[None, :]
    modes = (
        ("ieee", "tf32"),
        ("tf32x3", "tf32"),
        ("tf32", "tf32"),
        ("f16", "tf32"),
        ("tf32", "f16"),
        ("f16", "f16"),
    )
    for kind in ("random", "repeated", "decay", "beta2"):
        chunks = [chunk_A(kind) for _ in range(60)]
        for doubling, combine in modes:
            e_d, e_t, e_b, top = [], [], [], 0.0
            for A in chunks:
                A64 = A.astype(np.float64)
                t_ref = np.linalg.inv(np.eye(BT) + A64)
                d_ref = np.linalg.inv(np.eye(BT) + np.where(same, A64, 0))
                T, Dinv = solve(A, doubling, combine)
                e_t.append(np.linalg.norm(T - t_ref) / np.linalg.norm(t_ref))
                e_b.append(np.linalg.norm(bf16(T) - t_ref) / np.linalg.norm(t_ref))
                e_d.append(np.linalg.norm(Dinv - d_ref) / np.linalg.norm(d_ref))
                top = max(top, float(np.abs(t_ref).max()))
            print(
                f"{kind:8s} doubling {doubling:6s} combine {combine:4s}: D^-1 {np.mean(e_d):.1e}"
                f"  T {np.mean(e_t):.1e}  T as bf16 {np.mean(e_b):.1e}  max|T| {top:.1f}"
            )


if __name__ == "__main__":
    main()
