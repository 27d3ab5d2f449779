"""Gaussian kernel density of the predicted class in the last hidden layer (Feinman et al. 2017,
"Detecting adversarial samples from artifacts").

For a feature ``f`` (``D``-dimensional) and the stored training features ``φ(x)``, ``x ∈ X_c``, of
its predicted class ``c``::

    KD(f) = (1/|X_c|) Σ_{x ∈ X_c} exp(−‖f − φ(x)‖² / σ²)

computed in log-space, ``log KD(f) = logsumexp_x(−‖f − φ(x)‖²/σ²) − log |X_c|``; the detector
score is ``−log KD(f) ≥ 0`` (larger = lower density = more suspicious). ``X_c`` is a per-class
subsample of the training split small enough to ship (:func:`subsample_per_class`).

Bandwidth: the kernel is the Gaussian ``N(φ(x), (σ²/2)·I)`` up to its normaliser
``(πσ²)^{−D/2}``, so the normalised held-out log-likelihood of validation features ``f_j`` with
labels ``c_j`` is ``ℓ(σ) = mean_j [log KD_{c_j}(f_j) − (D/2)·log(πσ²)]``. :func:`choose_bandwidth`
maximises ``ℓ`` over a log-spaced grid and widens the grid until the maximum is interior.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class ClassKDE:
    """Per-class kernel samples, sorted by class: rows ``offsets[c]:offsets[c+1]`` of ``samples``
    (``N×D``) belong to class ``c``; ``bandwidth`` is σ."""

    samples: torch.Tensor
    offsets: torch.Tensor
    bandwidth: float
    # derived once: the samples in float32 and each class's row range; per-class terms lazily
    _rows: torch.Tensor = field(init=False, repr=False, compare=False)
    _bounds: list[tuple[int, int]] = field(init=False, repr=False, compare=False)
    _terms: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        counts = self.offsets.diff()
        if counts.numel() < 1 or bool((counts < 1).any()) or int(self.offsets[-1]) != len(self):
            raise ValueError(f"kde offsets {self.offsets.tolist()} do not split {len(self)} rows")
        object.__setattr__(self, "samples", self.samples.contiguous())
        rows = self.samples.float()
        object.__setattr__(self, "_rows", rows)
        bounds = self.offsets.tolist()
        object.__setattr__(self, "_bounds", list(itertools.pairwise(bounds)))

    def __len__(self) -> int:
        return int(self.samples.shape[0])

    @property
    def n_classes(self) -> int:
        return int(self.offsets.numel()) - 1

    def log_density(self, f: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
        """``log KD(f_b)`` of each row under the kernel samples of class ``classes[b]``, ``B``.

        One matrix product per class present, ``‖f − s‖² = ‖f‖² + ‖s‖² − 2 f·s`` (not clamped:
        the expansion's round-off only moves a term inside the ``logsumexp``). Differentiable in
        ``f``; float64 when ``f`` is.

        The rows are grouped by class with one stable sort (the rows of a class keep their order,
        so each class's product sees the same rows, aligned alike, as a per-class selection
        would, and gives the same bits); only the matrix product is computed per class. When
        every class has as many samples (the bundled models), the ``logsumexp`` runs once over
        all rows too (a row's reduction is the same whatever rows are beside it); otherwise once
        per class (16 rows in 8 classes: 27 torch calls, or 39, instead of 107 one class at a
        time).
        """
        if f.shape[0] == 1:  # the common single-image request: no grouping
            return self._class_log_density(f, int(classes.item()))
        if f.shape[0] == 0:
            return f.new_zeros(0)
        order = torch.argsort(classes, stable=True)
        counts = torch.bincount(classes, minlength=self.n_classes).tolist()
        grouped = f[order]
        present = [(c, n) for c, n in enumerate(counts) if n]
        groups = grouped.split([n for _, n in present])
        if f.shape[1] * f.element_size() % 64:
            # a group then starts off a 64-byte boundary, and BLAS may take another path (other
            # last bits) than for the fresh, aligned copy a per-class selection makes: copy it
            groups = tuple(rows.clone() for rows in groups)
        table = self._offset_table(f.dtype)
        if table is not None:  # one logsumexp over every row
            products = [
                rows @ self._class_terms(c, f.dtype)[0]
                for (c, _), rows in zip(present, groups, strict=True)
            ]
            offsets = table.index_select(0, classes[order])
            inner = logsumexp_rows(torch.cat(products) - offsets)
            log_n: torch.Tensor | float = self._class_terms(0, f.dtype)[2]
        else:
            parts, logs = [], []
            for (c, n), rows in zip(present, groups, strict=True):
                weights, offsets, log_n_c = self._class_terms(c, f.dtype)
                parts.append(logsumexp_rows(rows @ weights - offsets))
                logs += [log_n_c] * n
            inner = torch.cat(parts)
            log_n = torch.tensor(logs, dtype=f.dtype, device=f.device)
        values = inner - (grouped * grouped).sum(1) / self.bandwidth**2 - log_n
        return torch.empty_like(values).index_copy_(0, order, values)  # back to the rows' order

    def _class_log_density(self, f: torch.Tensor, c: int) -> torch.Tensor:
        """``logsumexp_i(−‖f_b − s_i‖²/σ²) − log n_c`` over the samples ``s_i`` of class ``c``,
        as ``logsumexp_i(f_b·(2s_i/σ²) − ‖s_i‖²/σ²) − ‖f_b‖²/σ² − log n_c`` (``‖f_b‖²`` is the
        same for every ``i``; the scaled samples and norms are precomputed per class).
        :meth:`log_density` computes the same expression for several classes at once."""
        weights, offsets, log_n = self._class_terms(c, f.dtype)
        inner = logsumexp_rows(f @ weights - offsets)
        return inner - (f * f).sum(1) / self.bandwidth**2 - log_n

    def _class_terms(self, c: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, float]:
        """``(2 s_iᵀ/σ² (D×n_c), ‖s_i‖²/σ² (n_c), log n_c)`` of class ``c``, cached per dtype."""
        key = (c, dtype)
        cached = self._terms.get(key)
        if cached is None:
            lo, hi = self._bounds[c]
            s = self._rows[lo:hi].double()
            scale = 1.0 / self.bandwidth**2
            cached = (
                (2.0 * scale * s.T).to(dtype).contiguous(),
                (scale * (s * s).sum(1)).to(dtype),
                math.log(hi - lo),
            )
            self._terms[key] = cached
        return cached

    def _offset_table(self, dtype: torch.dtype) -> torch.Tensor | None:
        """Every class's ``‖s_i‖²/σ²`` as one ``C×n`` table when every class has ``n`` samples
        (else ``None``), cached per dtype."""
        key = ("table", dtype)
        if key not in self._terms:
            sizes = {hi - lo for lo, hi in self._bounds}
            rows = [self._class_terms(c, dtype)[1] for c in range(self.n_classes)]
            self._terms[key] = torch.stack(rows) if len(sizes) == 1 else None
        return self._terms[key]

    def class_samples(self, c: int) -> torch.Tensor:
        return self.samples[int(self.offsets[c]) : int(self.offsets[c + 1])]


# exp(−87) ≈ 1.6e-38 is still a normal float32 (the smallest is e^−87.34 ≈ 1.2e-38)
EXP_FLOOR = 87.0


def logsumexp_rows(x: torch.Tensor) -> torch.Tensor:
    """``torch.logsumexp(x, dim=1)``, several times faster for a float32 kernel density on the
    CPU, and the same floats but where the sum's rounding meets an exact tie.

    Why: on the CPU, float32 ``exp(t)`` costs tens of nanoseconds per element where the result
    is below the smallest normal float (``t < −87.34``), against about one elsewhere
    (torch 2.13: 5 000 such elements 447 µs against 6 µs, ``bench/logsumexp_floor.py``). A kernel
    density's terms ``t_i − max_j t_j`` are mostly that far down (most samples are far away).

    How: every ``t_i < max − 87`` is raised to ``max − 87``, so its ``exp(t_i − max)`` is
    ``e^−87 ≈ 1.6e-38`` instead of a value in ``[0, 1.6e-38)``. The row's sum of exponentials is
    at least 1 (the maximum's own term) and the raised terms together stay below ``n·1.7e-38``,
    far under half an ulp of 1 (6e-8), so they round away — unless a partial sum lands exactly on
    a rounding tie, where round-half-to-even lets even 1e-38 decide: a row built for it (ties at
    every scale; a reviewer's, in ``tests/models/test_detection_scores.py``) moves the sum by one
    ulp, ≈ 1.2e-7 in the result. Real scores never showed it (0 of 10 200 test digits × 10 scores
    of each bundled model differ, ``bench/logsumexp_floor.py``). Slower where nothing underflows
    (one ``amax`` and one ``maximum`` more). Rows of ``−∞`` or with NaN are unchanged. Only
    without autograd (the raised terms would lose their, negligible, gradients) and for float32.
    """
    if (
        x.dtype == torch.float32
        and x.shape[-1] > 0
        and not (x.requires_grad and torch.is_grad_enabled())
    ):
        x = torch.maximum(x, x.amax(dim=1, keepdim=True) - EXP_FLOOR)
    return torch.logsumexp(x, dim=1)


def subsample_per_class(
    features: torch.Tensor,
    labels: torch.Tensor,
    n_classes: int,
    per_class: int,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """At most ``per_class`` random rows of every class, sorted by class: ``(samples, offsets)``.

    Every class must have at least one row.
    """
    if per_class < 1:
        raise ValueError(f"per_class must be ≥ 1, got {per_class}")
    picked, offsets = [], [0]
    for c in range(n_classes):
        rows = (labels == c).nonzero().squeeze(1)
        if rows.numel() == 0:
            raise ValueError(f"class {c} has no examples to build its kernel density from")
        order = torch.randperm(rows.numel(), generator=generator)[:per_class]
        picked.append(features[rows[order.sort().values]])
        offsets.append(offsets[-1] + picked[-1].shape[0])
    return torch.cat(picked), torch.tensor(offsets, dtype=torch.int64)


def held_out_log_likelihood(
    kde_samples: torch.Tensor,
    offsets: torch.Tensor,
    f: torch.Tensor,
    labels: torch.Tensor,
    sigma: float,
) -> float:
    """``ℓ(σ) = mean_j [log KD_{c_j}(f_j) − (D/2)·log(πσ²)]`` in float64 (module docstring)."""
    kde = ClassKDE(kde_samples.double(), offsets, sigma)
    log_kd = kde.log_density(f.double(), labels).double()
    d = f.shape[1]
    return float(log_kd.mean()) - 0.5 * d * math.log(math.pi * sigma**2)


def choose_bandwidth(
    kde_samples: torch.Tensor,
    offsets: torch.Tensor,
    f: torch.Tensor,
    labels: torch.Tensor,
    *,
    points: int = 25,
    span: float = 100.0,
    max_widenings: int = 8,
) -> tuple[float, list[tuple[float, float]]]:
    """σ maximising the held-out log-likelihood on a log grid; ``(σ, [(σ_i, ℓ(σ_i)), …])``.

    The grid has ``points`` values spanning a factor ``span`` around ``σ₀`` = the root median
    squared distance from a validation feature to the kernel samples of its class; when the best
    value is at an edge the grid is extended past that edge (up to ``max_widenings`` times), so the
    chosen σ is never a grid edge. ``ValueError`` if it still is.
    """
    sigma0 = _median_distance(kde_samples, offsets, f, labels)
    ratio = span ** (1.0 / (points - 1))
    grid = [sigma0 * span**-0.5 * ratio**i for i in range(points)]
    curve: dict[float, float] = {}
    for _ in range(max_widenings + 1):
        for s in grid:
            if s not in curve:
                curve[s] = held_out_log_likelihood(kde_samples, offsets, f, labels, s)
        ordered = sorted(curve)
        best = max(ordered, key=curve.__getitem__)
        if best == ordered[0]:
            grid = [ordered[0] / ratio**i for i in range(1, points // 2 + 1)]
        elif best == ordered[-1]:
            grid = [ordered[-1] * ratio**i for i in range(1, points // 2 + 1)]
        else:
            return best, [(s, curve[s]) for s in ordered]
    raise ValueError("the held-out likelihood peaks at the grid's edge; no bandwidth chosen")


def _median_distance(
    kde_samples: torch.Tensor, offsets: torch.Tensor, f: torch.Tensor, labels: torch.Tensor
) -> float:
    """Root of the median squared distance from ``f_j`` to the samples of class ``labels[j]``."""
    values = []
    for c in labels.unique().tolist():
        s = kde_samples[int(offsets[c]) : int(offsets[c + 1])].double()
        fc = f[labels == c].double()
        values.append(torch.cdist(fc, s).pow(2).flatten())
    med = float(torch.cat(values).median())
    if not med > 0.0:
        raise ValueError("validation features coincide with the kernel samples; cannot pick σ")
    return math.sqrt(med)
