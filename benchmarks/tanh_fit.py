"""Fit the rational tanh approximations of DyT's CPU kernel (normbench/model/kernels/norms_cpu.cpp).

tanh(x) ~ x P(x^2) / Q(x^2) on 0 < x <= c, tanh(c) beyond, with P(0) = Q(0) = 1, fitted for the
smallest worst-case *relative* error by Lawson's algorithm (iteratively reweighted least squares
on the linearised error x P - tanh(x) Q). The kernel evaluates the fit in float arithmetic, so
each coefficient is then rounded to float in turn and the ones after it refitted. Prints the
coefficients as C++ literals and the worst relative error against float64 tanh over
[1e-6, 20], evaluated in float64 and in float32 (numpy, no fused multiply-add: a little worse
than the kernel's FMAs):

    python benchmarks/tanh_fit.py            # the two fits the kernel uses
    python benchmarks/tanh_fit.py 4 4 8.0    # numerator terms, denominator terms, clamp

Needs numpy only (installed with pandas).
"""

from __future__ import annotations

import sys

import numpy as np

FITS = {"TanhFloat": (4, 4, 8.0), "TanhBf16": (3, 3, 6.0)}


def _grid(c: float) -> np.ndarray:
    return np.concatenate([np.geomspace(1e-7, 1e-3, 400), np.linspace(1e-3, c, 40_000)])


def fit(n_p: int, n_q: int, c: float, fixed: dict, iterations: int = 400):
    """P (n_p terms) and Q (n_q + 1 terms, Q[0] = 1) minimising max |xP/Q - tanh| / tanh on (0, c].

    ``fixed`` maps ("p", k) or ("q", k) to values that are not fitted.
    """
    x = _grid(c)
    t, z = np.tanh(x), x * x
    columns = {("p", k): x * z**k for k in range(n_p)} | {("q", k): -t * z**k for k in range(1, n_q + 1)}
    free = [key for key in columns if key not in fixed]
    rhs = t - sum(value * columns[key] for key, value in fixed.items())
    a = np.stack([columns[key] for key in free], axis=1)
    weights, q_values = np.full_like(x, 1 / len(x)), np.ones_like(x)
    for _ in range(iterations):
        scale = np.sqrt(weights) / t / np.abs(q_values)  # relative error of x P / Q, not of x P - t Q
        solution, *_ = np.linalg.lstsq(a * scale[:, None], rhs * scale, rcond=None)
        coef = dict(fixed) | dict(zip(free, solution))
        p = np.array([coef[("p", k)] for k in range(n_p)])
        q = np.array([1.0] + [coef[("q", k)] for k in range(1, n_q + 1)])
        q_values = np.polyval(q[::-1], z)
        error = np.abs(x * np.polyval(p[::-1], z) / q_values - t) / t
        weights = weights * np.sqrt(error)  # Lawson: weight where the error is largest
        weights /= weights.sum()
    return p, q


def rounded_fit(n_p: int, n_q: int, c: float):
    """The fit with every coefficient a float, each rounded after refitting those not yet rounded."""
    fixed = {("p", 0): 1.0}  # tanh(x) = x (1 + O(x^2)): exact for tiny x
    for key in [("p", k) for k in range(1, n_p)] + [("q", k) for k in range(1, n_q + 1)]:
        p, q = fit(n_p, n_q, c, fixed)
        fixed[key] = float(np.float32((p if key[0] == "p" else q)[key[1]]))
    return (
        np.array([fixed[("p", k)] for k in range(n_p)]),
        np.array([1.0] + [fixed[("q", k)] for k in range(1, n_q + 1)]),
    )


def worst_errors(p: np.ndarray, q: np.ndarray, c: float) -> tuple[float, float]:
    """Worst relative error against tanh, evaluated in float64 and in float32 (Horner, as the kernel)."""
    x = np.geomspace(1e-6, 20, 400_000)
    exact = np.tanh(x)
    clamped = np.minimum(x, c)
    z = clamped * clamped
    in_double = clamped * np.polyval(p[::-1], z) / np.polyval(q[::-1], z)
    f32 = np.float32
    xf = np.minimum(x.astype(f32), f32(c))
    zf = xf * xf

    def horner(coefs):
        acc = np.full_like(zf, f32(coefs[-1]))
        for k in coefs[-2::-1]:
            acc = acc * zf + f32(k)
        return acc

    in_float = (xf * horner(p) / horner(q)).astype(np.float64)
    return (np.abs(in_double - exact) / exact).max(), (np.abs(in_float - exact) / exact).max()


def main() -> None:
    fits = {"fit": tuple(map(float, sys.argv[1:4]))} if len(sys.argv) == 4 else FITS
    for name, (n_p, n_q, c) in fits.items():
        p, q = rounded_fit(int(n_p), int(n_q), c)
        in_double, in_float = worst_errors(p, q, c)
        print(
            f"{name}: [{2 * int(n_p) - 1}/{2 * int(n_q)}] rational, clamped at {c}: worst relative error "
            f"{in_double:.2e} (float64 evaluation), {in_float:.2e} (float32)"
        )
        print("  p = {" + ", ".join(f"{v:.9e}f" for v in p) + "}")
        print("  q = {" + ", ".join(f"{v:.9e}f" for v in q) + "}")


if __name__ == "__main__":
    main()
