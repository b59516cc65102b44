"""CRAFT's concept bank and its Sobol importance (Fel, Picard, Béthune et al. 2023, "CRAFT: Concept Recursive
Activation FacTorization for Explainability", CVPR; the reference code is ``craft-xai``'s ``Craft``).

Concept bank (Sec. 3.1, Eq. 1). With A the (n, D) activations of n crops of one class's images (non-negative),

    A ≈ U W,   U >= 0 (n, k),  W >= 0 (k, D)

by scikit-learn's ``NMF(n_components=k)`` with the reference's settings (NNDSVDa initialisation, which is
deterministic; coordinate descent; at most 200 iterations). Row j of W is concept j in the activation space.
The coefficients of new activations are the same solver run with W fixed (``NMF.transform``, a non-negative
least squares by coordinate descent from zero), as the reference's ``Craft.transform``, but run to a tolerance
of 1e-8 (the reference stops at scikit-learn's 1e-4): the least squares is convex, so its answer then does not
depend on the order of the concepts, which a stop at 1e-4 changes by about 1e-3 of the coefficients.

Importance (Sec. 3.2, Eq. 3-4): the total-order Sobol index of concept j for a function f of k masks
M ∈ [0, 1]^k put on the coefficients (f(M) = the class logit of (U ⊙ M) W),

    S_T,j = E_{M~j}[ Var_{M_j}( f(M) | M~j ) ] / Var(f(M)),

estimated by Jansen's estimator (1999) over a replicated design of N quasi-Monte-Carlo points: A and B are N × k
Halton points (the first and last k columns of a 2k-dimensional unscrambled Halton sequence), C_j is A with
column j taken from B, and

    Ŝ_T,j = Σ_n ( f(A_n) − f(C_j,n) )² / (2 N V̂),   V̂ = the unbiased variance of f(A_n) over n.

An index is unit-free (a share of the logit's variance, 0 when the concept never matters, and at least its
first-order share); the indices of k concepts may add up to more than 1 where concepts interact.
"""
from __future__ import annotations

import warnings

import numpy as np

MAX_ITER = 200  # NMF iterations at most (scikit-learn's default, the reference's)
TRANSFORM_TOL = 1e-8  # coordinate descent's stopping tolerance for the coefficients with the bank fixed
TRANSFORM_ITER = 2000  # its iterations at most
DESIGN = 32  # N, points of the sampling matrices A and B (the reference's ``nb_design``)


def fit_concept_bank(activations: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, D) non-negative activations -> (U (n, k), W (k, D)) float64 by ``NMF(n_components=k,
    init="nndsvda")`` (module docstring). 1 <= k <= min(n, D)."""
    a = np.asarray(activations, dtype=np.float64)
    if a.ndim != 2 or a.size == 0:
        raise ValueError(f"expected (samples, channels) activations, got shape {a.shape}")
    if (a < 0).any():
        raise ValueError("NMF needs non-negative activations")
    if not 1 <= k <= min(a.shape):
        raise ValueError(f"k={k} concepts: choose 1 to {min(a.shape)} for {a.shape[0]} samples of "
                         f"{a.shape[1]} channels")
    from sklearn.decomposition import NMF
    from sklearn.exceptions import ConvergenceWarning

    model = NMF(n_components=k, init="nndsvda", max_iter=MAX_ITER)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        u = model.fit_transform(a)
    return u, model.components_


def concept_coefficients(activations: np.ndarray, bank: np.ndarray) -> np.ndarray:
    """(m, D) non-negative activations -> (m, k) float64 coefficients U >= 0 with ``bank`` W (k, D) fixed:
    scikit-learn's ``NMF.transform`` of a model whose components are W (coordinate descent from zero), as the
    reference's ``Craft.transform``, to the tolerance `TRANSFORM_TOL` (module docstring)."""
    from sklearn.decomposition import non_negative_factorization
    from sklearn.exceptions import ConvergenceWarning

    w = np.asarray(bank, dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        u, _, _ = non_negative_factorization(np.asarray(activations, dtype=np.float64), H=w, n_components=w.shape[0],
                                             init="custom", update_H=False, max_iter=TRANSFORM_ITER,
                                             tol=TRANSFORM_TOL)
    return u


def sobol_design(k: int, design: int = DESIGN) -> np.ndarray:
    """((k + 2) * design, k) float32 masks in [0, 1): the rows of A, then of B, then of C_1 ... C_k (module
    docstring), A and B from an unscrambled Halton sequence in 2k dimensions (the reference's
    ``HaltonSequence``; its first point is 0)."""
    from scipy.stats import qmc

    ab = qmc.Halton(2 * k, scramble=False).random(design).astype(np.float32)  # (N, 2k)
    a, b = ab[:, :k], ab[:, k:]
    c = np.repeat(a[None], k, axis=0)  # (k, N, k)
    for j in range(k):
        c[j, :, j] = b[:, j]
    return np.concatenate([a, b, c.reshape(-1, k)], axis=0)


def jansen_total_indices(outputs: np.ndarray, k: int, design: int = DESIGN) -> np.ndarray:
    """(k,) total-order Sobol indices Ŝ_T,j by Jansen's estimator (module docstring) from the ((k + 2) *
    design,) outputs f of the `sobol_design` rows, in its order. NaN where f does not vary over A."""
    y = np.asarray(outputs, dtype=np.float64).ravel()
    if y.size != (k + 2) * design:
        raise ValueError(f"expected {(k + 2) * design} outputs for k={k} and {design} design points, got {y.size}")
    fa = y[:design]
    fc = y[2 * design:].reshape(k, design)
    variance = fa.var(ddof=1)
    if not variance > 0:
        return np.full(k, np.nan)
    return ((fa[None] - fc) ** 2).sum(axis=1) / (2 * design * variance)
