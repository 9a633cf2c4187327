"""What a decode step costs on this box: ``t ≈ a + b·rows + c·prompt_tokens``, learned online.

``rows`` are the batch entries whose logits a step keeps (one per generating
sequence and draft, the last token of each prompt read to its end, padding);
``prompt_tokens`` are the prompt tokens it reads without keeping logits. On a
small model with a large vocabulary the output rows dominate (Gemma 3 270M on two
cores: about 5 ms a row), on a GPU the fixed cost does; the fit finds out which.

The fit is least squares over exponentially weighted sums (the newest step weighs
most, so the model follows the box as its load changes), with every coefficient
kept non-negative: a negative one would promise free work. Until enough steps that
read prompts were seen the model says it is not :attr:`StepCostModel.ready`, and the
planner falls back to a plain rate (tokens per second).
"""

from __future__ import annotations

import itertools
import math

#: Weight each step's sums keep when a new step arrives (about the last 50 steps count).
FORGET = 0.98
#: Steps reading prompt tokens needed before the prompt coefficient is believed.
MIN_PROMPT_SAMPLES = 3
#: Ridge added to the normal equations' diagonal, relative to it (keeps an unseen shape solvable).
RIDGE = 1e-6
#: Steps longer than this (a stall: swapping, a paused VM) say nothing about the work; they are not learned from.
MAX_SAMPLE_S = 30.0

Coefficients = tuple[float, float, float]


def _solve(m: list[list[float]], v: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(v)
    a = [row[:] + [v[i]] for i, row in enumerate(m)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-18:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, n):
            f = a[r][col] / a[col][col]
            for k in range(col, n + 1):
                a[r][k] -= f * a[col][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (a[r][n] - sum(a[r][k] * x[k] for k in range(r + 1, n))) / a[r][r]
    return x


class StepCostModel:
    """Online fit of step time to (1, rows, prompt tokens); ``predict`` and ``prompt_tokens_within`` use it."""

    def __init__(self, forget: float = FORGET) -> None:
        self.forget = forget
        self._xx = [[0.0] * 3 for _ in range(3)]
        self._xt = [0.0] * 3
        self._tt = 0.0
        self.prompt_samples = 0  # steps that read prompt tokens (at most counted to the minimum)
        self._coef: Coefficients = (0.0, 0.0, 0.0)
        self._stale = False  # steps were observed since the last fit

    @property
    def coef(self) -> Coefficients:
        """(a, b, c), fitted when asked (a step with no prompt to read never asks, so decoding pays nothing)."""
        if self._stale:
            self._coef, self._stale = self._fit(), False
        return self._coef

    @property
    def ready(self) -> bool:
        return self.prompt_samples >= MIN_PROMPT_SAMPLES and self.coef[2] > 0.0

    def observe(self, rows: int, prompt_tokens: int, seconds: float) -> None:
        """Learn from one step that kept ``rows`` logits rows, read ``prompt_tokens`` and took ``seconds``."""
        if seconds <= 0.0 or seconds > MAX_SAMPLE_S or rows + prompt_tokens <= 0:
            return
        x = (1.0, float(rows), float(prompt_tokens))
        f = self.forget
        for i in range(3):
            for j in range(3):
                self._xx[i][j] = f * self._xx[i][j] + x[i] * x[j]
            self._xt[i] = f * self._xt[i] + x[i] * seconds
        self._tt = f * self._tt + seconds * seconds
        if prompt_tokens > 0 and self.prompt_samples < MIN_PROMPT_SAMPLES:
            self.prompt_samples += 1
        self._stale = True

    def _fit(self) -> Coefficients:
        """Least squares with non-negative coefficients: the best of the feature subsets whose solution has no negative one."""
        best: Coefficients = self._coef
        best_sse = math.inf
        for size in (3, 2, 1):
            for subset in itertools.combinations(range(3), size):
                m = [[self._xx[i][j] for j in subset] for i in subset]
                for k in range(size):
                    m[k][k] += RIDGE * (m[k][k] + 1e-12)
                sol = _solve(m, [self._xt[i] for i in subset])
                if sol is None or any(c < 0.0 for c in sol):
                    continue
                theta = [0.0, 0.0, 0.0]
                for i, c in zip(subset, sol, strict=True):
                    theta[i] = c
                sse = self._sse(theta)
                if sse < best_sse - 1e-15:
                    best, best_sse = (theta[0], theta[1], theta[2]), sse
            if best_sse < math.inf and size == 3:
                break  # the full model is non-negative: nothing smaller fits better
        return best

    def _sse(self, theta: list[float]) -> float:
        quad = sum(theta[i] * self._xx[i][j] * theta[j] for i in range(3) for j in range(3))
        return self._tt - 2.0 * sum(theta[i] * self._xt[i] for i in range(3)) + quad

    def predict(self, rows: int, prompt_tokens: int) -> float:
        a, b, c = self.coef
        return a + b * rows + c * prompt_tokens

    def prompt_tokens_within(self, seconds: float, rows: int) -> int:
        """How many prompt tokens a step keeping ``rows`` rows may read and still last ``seconds`` (0 if none fit)."""
        a, b, c = self.coef
        if c <= 0.0:
            return 0
        return max(0, math.floor((seconds - a - b * rows) / c))

    @property
    def prompt_rate(self) -> float | None:
        """Prompt tokens per second beyond a step's fixed and row costs; None until :attr:`ready`."""
        return 1.0 / self.coef[2] if self.ready else None
