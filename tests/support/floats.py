"""Tolerances for floats computed two ways, derived from rounding, so a comparison
holds on any CPU.

Two computations of one real number agree only as far as their roundings do.
Which order a sum is carried out in (and so how it rounds) is the BLAS or
vectorized kernel's choice, and that choice depends on the CPU (AVX-512 or
AVX2, oneDNN's ISA, the thread count): a tolerance taken from what passed on
one machine fails on the next. The bound used here is the textbook one
(Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., eq. 3.4
and lemma 3.1): a sum of ``n`` terms, each product or term rounded once,
evaluated in any order in a format of unit roundoff ``u``, is within
``gamma(n) * sum |terms|`` of the exact sum, ``gamma(n) = n u / (1 - n u)``.
Two such evaluations are within twice that of each other.

A test names what it compares (how many roundings an element passes through
on the longer of its two paths, and the sum of the magnitudes involved, taken
from its own data) and asks for `within` that bound, never for an absolute
number that happened to pass. Exact equality stays where bit-identity is the
claim: copies, gathers and scatters that do no arithmetic, and the
simulator's results, which are deterministic by design.
"""

from __future__ import annotations

#: Unit roundoff (half the machine epsilon) of each float format.
U_FLOAT32 = 2.0 ** -24
U_FLOAT64 = 2.0 ** -53
U_BFLOAT16 = 2.0 ** -8


def gamma(n: int, u: float = U_FLOAT32) -> float:
    """Higham's gamma_n: the relative error bound of ``n`` successive roundings."""
    if n * u >= 1:
        raise ValueError(f"{n} roundings at u={u:g}: the bound does not hold (n u >= 1)")
    return n * u / (1 - n * u)


def sum_tolerance(abs_terms, n: int, u: float = U_FLOAT32):
    """The most two evaluations of the same ``n``-rounding sum may differ by:
    ``2 gamma(n) * abs_terms``, where ``abs_terms`` is the sum of the absolute
    values of the terms (a number, or a tensor/array of them per element)."""
    return 2 * gamma(n, u) * abs_terms


def within(got, want, tolerance, what: str = "") -> None:
    """Assert ``|got - want| <= tolerance`` element by element (``tolerance`` a
    number or broadcastable to ``got``), NaN nowhere; the message shows the
    worst element against its bound."""
    import torch

    got, want = torch.as_tensor(got, dtype=torch.float64), torch.as_tensor(want, dtype=torch.float64)
    assert got.shape == want.shape, f"{what}: shapes {tuple(got.shape)} vs {tuple(want.shape)}"
    assert not (got.isnan().any() or want.isnan().any()), f"{what}: NaN"
    tol = torch.as_tensor(tolerance, dtype=torch.float64).expand_as(got)
    excess = (got - want).abs() - tol
    if got.numel() and float(excess.max()) > 0:
        i = int(excess.argmax())
        diff = float((got - want).abs().flatten()[i])
        raise AssertionError(f"{what}: |diff| {diff:.3g} > bound {float(tol.flatten()[i]):.3g} "
                             f"at element {i} of {got.numel()}")
