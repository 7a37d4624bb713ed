"""The ``coef`` table of the coordinate-descent programs and the step taken on it.

A row per coefficient, :data:`COEF_WIDTH` columns: value (:data:`BETA`), last
change (:data:`DELTA`), curvature (:data:`CURV`), L1 penalty (:data:`PEN`, < 0:
frozen), column mean (:data:`MEAN`) and L2 weight (:data:`L2`).  The shards'
``pull`` turns a round's summed partials into new rows with
:func:`soft_step` (the soft-thresholded coordinate step), its curvature
damped by :func:`eso_factor`, through :func:`stepped`.
"""

from __future__ import annotations

import numpy as np

BETA, DELTA, CURV, PEN, MEAN, L2 = range(6)
COEF_WIDTH = 6


def soft_step(beta, grad, curv, pen):
    """The coordinate minimiser's change: ``S(curv beta - grad, pen) / curv - beta``
    (``grad``: derivative of the smooth part; ``pen < 0`` or ``curv <= 0``: frozen)."""
    live = (curv > 0) & (pen >= 0)
    c = np.where(live, curv, 1.0)
    z = c * beta - grad
    new = np.sign(z) * np.maximum(np.abs(z) - np.maximum(pen, 0.0), 0.0) / c
    return np.where(live, new - beta, 0.0)


def eso_factor(damped, plain):
    """ESO damping of the curvature: ``damped / plain`` (the curvature sums with and
    without the rows' overlap weights), at least 1, and 1 where ``plain`` is not
    positive."""
    return np.where(plain > 0, np.maximum(damped / np.where(plain > 0, plain, 1.0), 1.0), 1.0)


def relaxed(beta, step, omega):
    """``omega * step`` where the L1 term is linear from ``beta`` to ``beta + omega * step``
    (no sign change, not ending at 0), else ``step``."""
    if omega == 1.0:
        return step
    new = beta + step
    far = beta + omega * step
    same = (new != 0) & (np.sign(far) == np.sign(new)) & ((beta == 0) | (np.sign(beta) == np.sign(new)))
    return np.where(same, omega * step, step)


def stepped(current, grad, curv, omega=1.0):
    """``coef`` rows after the coordinate step: :data:`BETA` moved by the step, which
    :data:`DELTA` records."""
    new = current.copy()
    step = relaxed(current[:, BETA], soft_step(current[:, BETA], grad, curv, current[:, PEN]), omega)
    new[:, BETA] += step
    new[:, DELTA] = step
    return new
