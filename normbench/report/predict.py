"""Prediction along the scale axis: each configuration's loss and its gap to the baseline at a size
the sweep did not run, with a backtest that says whether such a prediction earned its keep here.

``normbench report --scale KEY --predict VALUE[,VALUE...]``. VALUE is in parameters when the
scale axis is a model size (the sizes' ``params``), in training tokens when it is a token budget,
in KEY's own units when neither changes (normbench.report.scale's ``x``).

Per configuration, its best-value mean loss at each size is fitted by L(x) = E + A x^-alpha
(Kaplan et al. 2020; per-variant fits compared at a target size as in Tay et al. 2022 and
Clark et al. 2022) by least squares (``fit_law``: variable projection, alpha in (0, 4], A > 0).
A fit is *converged* when the best alpha lies inside its range and A > 0: loss falling with size
as a power law. Where the baseline's or
the configuration's power law does not converge, the gap is extrapolated instead by the scale
axis's own log-linear fit (gap against log2 x, normbench.report.stats.fit_trend) and the output
says so; with nothing that fits, the prediction is "not converged", never a number. A fit that
converges but misfits the measured means (a lack-of-fit F test of its residuals against the seeds'
spread pooled over the sizes rejects at MISFIT_P; it needs a size more than the fit's parameters),
or a comparison whose backtest interval missed the gap measured at the held-out size, reads "no
prediction: <why>": an interval that carries the seeds' noise alone would be tight exactly where the
model is wrong.

The uncertainty comes from the seeds: each size's mean carries its seeds' spread, and the fit carries
it to the prediction. The fit's response to each size's mean is measured by central differences
(over ± that mean's standard error), the per-seed values are weighted by it (paired by seed across
the configurations of a gap: runs of one seed share the data order and the init), and the sizes'
shares of the variance are summed: a Student-t interval at Satterthwaite's degrees of freedom, as
the trend's slope has (normbench.report.stats.fit_trend). A bootstrap over 3 seeds has only ten
distinct draws and came out far too narrow; this interval covers a planted law's truth at 94.7-96.0%
(``python benchmarks/interval_coverage.py``). It carries the seeds' noise only: that the law
itself holds beyond the grid is an assumption, and a target more than FAR x the largest size
measured is flagged so.

The backtest (≥ 4 sizes): the largest size is held out, predicted from the others, and each
comparison's predicted verdict (better / worse / tied: its interval excluding 0 or not) is set
against the measured one at that size, beside the naive rule "the verdict at the largest
remaining size" (DataDecide, arXiv 2504.11393, found that one small size's ranking picked the
winner about 80% of the time and that no scaling-law method beat it for the compute).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import optimize, stats

from normbench.core.errors import ConfigError
from normbench.report.scale import Scale, _x_words
from normbench.report.stats import CONFIDENCE, NEEDS_SEEDS, fit_trend, satterthwaite
from normbench.report.tables import _fmt_value

FAR = 10.0  # a target beyond FAR x the largest measured size is flagged as far
MIN_SIZES = 3  # a three-parameter law needs three sizes
BACKTEST_SIZES = 4  # the backtest fits on all but the largest: three left to fit
ALPHA_MAX = 4.0
NOT_CONVERGED = "not converged"
POWER = "power law"
LOG_LINEAR = "log-linear gap (a power law did not converge)"
NO_PREDICTION = "no prediction"
MISFIT_P = 0.01  # a fit whose lack-of-fit test rejects at this level predicts nothing (1% false alarms)


def parse_predict(text: str) -> list[float]:
    """'1.2e6,4e6' -> [1.2e6, 4e6]; one line naming the bad value otherwise."""
    values = []
    for part in (p.strip() for p in text.split(",")):
        try:
            value = float(part.replace("_", ""))
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(
                f"--predict {part!r}: not a positive number",
                allowed=["sizes in parameters (or tokens for a token key), e.g. 1.2e6,4e6"],
            )
        values.append(value)
    return values


def check_sizes(key: str, values) -> None:
    """Fewer than MIN_SIZES sizes among ``values`` (the runs' KEY): one line saying what is needed."""
    sizes = sorted(pd.to_numeric(pd.Series(values), errors="coerce").dropna().unique())
    if len(sizes) < MIN_SIZES:
        raise ConfigError(
            f"--predict fits L = E + A x^-alpha per configuration and needs ≥ {MIN_SIZES} sizes; "
            f"{key} has {len(sizes)} ({', '.join(map(_fmt_value, sizes))})",
            allowed=[f"a sweep over ≥ {MIN_SIZES} values of {key} (the backtest needs {BACKTEST_SIZES})"],
        )


@dataclass(frozen=True)
class Law:
    """L(x) = E + A x^-alpha, or why there is none."""

    E: float
    A: float
    alpha: float
    converged: bool

    def __call__(self, x) -> np.ndarray:
        return self.E + self.A * np.asarray(x, float) ** -self.alpha


FAILED = Law(math.nan, math.nan, math.nan, False)


ALPHA_GRID = np.linspace(0.01, ALPHA_MAX, 80)


def _profile(u: np.ndarray, loss: np.ndarray, alpha) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each alpha: E and B of the least-squares line loss = E + B u^-alpha, and its residual sum."""
    z = u[None, :] ** -np.atleast_1d(alpha)[:, None]
    zc = z - z.mean(axis=1, keepdims=True)
    B = (zc * (loss - loss.mean())).sum(axis=1) / (zc**2).sum(axis=1)
    E = loss.mean() - B * z.mean(axis=1)
    rss = ((E[:, None] + B[:, None] * z - loss) ** 2).sum(axis=1)
    return E, B, rss


def fit_law(x, loss) -> Law:
    """Least squares of E + A x^-alpha on (x, loss), alpha in (0, ALPHA_MAX], A ≥ 0.

    Variable projection: for a given alpha the law is linear in E and A, so the residual sum is
    a function of alpha alone, searched on a grid and refined by ``scipy.optimize.minimize_scalar``
    between the grid's neighbours of its best point: the global least-squares fit, without a
    local solver's dependence on where it starts. x is scaled by its geometric mean first.
    """
    x, loss = np.asarray(x, float), np.asarray(loss, float)
    keep = np.isfinite(x) & np.isfinite(loss) & (x > 0)
    x, loss = x[keep], loss[keep]
    if len(np.unique(x)) < MIN_SIZES:
        return FAILED
    x0 = math.exp(np.mean(np.log(x)))
    u = x / x0
    _, _, rss = _profile(u, loss, ALPHA_GRID)
    i = int(np.nanargmin(rss))
    if i in (0, len(ALPHA_GRID) - 1):  # the best alpha at a bound: no power law in these points
        return FAILED
    result = optimize.minimize_scalar(
        lambda a: _profile(u, loss, a)[2][0],
        bounds=(ALPHA_GRID[i - 1], ALPHA_GRID[i + 1]),
        method="bounded",
        options={"xatol": 1e-6},
    )
    alpha = float(result.x)
    E, B, _ = (float(v[0]) for v in _profile(u, loss, alpha))
    if not (result.success and B > 0 and math.isfinite(E)):
        return FAILED
    return Law(E, B * x0**alpha, alpha, True)


def _log_linear(x, gap_means, gap_se, targets) -> np.ndarray:
    """The scale axis's WLS line of the gap on log2 x, evaluated at ``targets`` (NaN when it cannot fit)."""
    x, gap_means, gap_se = (np.asarray(v, float) for v in (x, gap_means, gap_se))
    keep = np.isfinite(gap_means)
    if len(np.unique(x[keep])) < 2:
        return np.full(len(targets), math.nan)
    fit = fit_trend(x[keep], gap_means[keep], np.nan_to_num(gap_se[keep]), np.full(keep.sum(), 2.0))
    t0, t1 = np.log2(x[keep].min()), np.log2(x[keep].max())
    return fit.first + (fit.last - fit.first) * (np.log2(np.asarray(targets, float)) - t0) / (t1 - t0)


def _misfit_p(residuals: np.ndarray, spreads: list[list[float]], n_params: int) -> float:
    """The lack-of-fit F test of a fit to the sizes' means: the residuals against the seeds' spread
    pooled over the sizes (each size's mean carrying var/n). Pooled, not per size: a variance from three
    seeds is too rough to divide by one size at a time. NaN without a size to spare or a spread."""
    keep = [j for j, r in enumerate(residuals) if math.isfinite(r) and len(spreads[j]) >= 2]
    dof = sum(len(spreads[j]) - 1 for j in keep)
    if len(keep) <= n_params or dof == 0:
        return math.nan
    pooled = sum(np.var(spreads[j], ddof=1) * (len(spreads[j]) - 1) for j in keep) / dof
    if pooled <= 0:
        return 0.0 if any(residuals[j] != 0 for j in keep) else 1.0
    f = sum(residuals[j] ** 2 * len(spreads[j]) for j in keep) / pooled / (len(keep) - n_params)
    return float(stats.f.sf(f, len(keep) - n_params, dof))


def _seeds(sample) -> dict:
    return sample if isinstance(sample, dict) else dict(enumerate(sample))


def _means(samples: dict, configs: list, sizes: list, draw: dict | None = None) -> np.ndarray:
    """configs x sizes of mean losses; ``draw`` (size -> seeds drawn) resamples each size's seeds."""
    out = np.full((len(configs), len(sizes)), math.nan)
    for i, config in enumerate(configs):
        for j, size in enumerate(sizes):
            seeds = _seeds(samples.get((config, size), {}))
            picked = [seeds[k] for k in (draw[size] if draw else seeds) if k in seeds]
            if picked:
                out[i, j] = float(np.mean(picked))
    return out


def _paired(samples: dict, config, baseline, size) -> list[float]:
    """The per-seed gaps of ``config`` to ``baseline`` at ``size``, over the seeds both ran."""
    a, b = _seeds(samples.get((config, size), {})), _seeds(samples.get((baseline, size), {}))
    return [a[k] - b[k] for k in a if k in b]


def _gap_se(samples: dict, config, baseline, sizes) -> np.ndarray:
    """Per size, the standard error of the paired per-seed gaps (NaN with fewer than 2 seeds)."""
    out = []
    for size in sizes:
        d = _paired(samples, config, baseline, size)
        out.append(float(np.std(d, ddof=1) / math.sqrt(len(d))) if len(d) >= 2 else math.nan)
    return np.array(out)


def _word(low: float, high: float) -> str:
    if not (math.isfinite(low) and math.isfinite(high)):
        return NOT_CONVERGED
    return "worse" if low > 0 else "better" if high < 0 else "tied"


def _outputs(xs: np.ndarray, means: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The law fitted to ``means``: its loss at each target, then E, A and alpha (NaN where it fails)."""
    law = fit_law(xs, means)
    if not law.converged:
        return np.full(len(targets) + 3, math.nan)
    return np.concatenate([law(targets), [law.E, law.A, law.alpha]])


def _slopes(f, means: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """sizes x outputs: how each of ``f``'s outputs moves per unit of one size's mean, by central
    differences over ± that mean's standard error (the scale of the noise the interval carries)."""
    rows = []
    for j, h in enumerate(steps):
        up, down = means.copy(), means.copy()
        up[j], down[j] = means[j] + h, means[j] - h
        rows.append((f(up) - f(down)) / (2 * h))
    return np.array(rows)


def _step(samples: dict, config, size) -> float:
    """The standard error of one configuration's mean at ``size`` (a tiny step without a spread)."""
    values = list(_seeds(samples.get((config, size), {})).values())
    se = float(stats.sem(values)) if len(values) >= 2 else 0.0
    return se if se > 0 else 1e-6


def _part(samples: dict, size, weights: dict) -> tuple[float, float]:
    """One size's share of a prediction's variance, and its degrees of freedom: the prediction moves by
    ``weights[config]`` per unit of that configuration's mean there. Over the seeds every weighted
    configuration ran (paired: runs of one seed share the data order and the init); configurations
    without a seed in common count as independent."""
    weights = {c: w for c, w in weights.items() if w != 0}
    if not weights:
        return 0.0, math.inf
    if any(not math.isfinite(w) for w in weights.values()):
        return math.nan, math.nan
    runs = {c: _seeds(samples.get((c, size), {})) for c in weights}
    shared = set.intersection(*(set(r) for r in runs.values()))
    if len(shared) >= 2:
        d = [sum(w * runs[c][k] for c, w in weights.items()) for k in shared]
        return float(np.var(d, ddof=1) / len(d)), len(d) - 1.0
    if any(len(r) < 2 for r in runs.values()):
        return math.nan, math.nan
    var = sum(w**2 * np.var(list(runs[c].values()), ddof=1) / len(runs[c]) for c, w in weights.items())
    return float(var), min(len(r) for r in runs.values()) - 1.0


def _t_interval(point: float, parts: list[tuple[float, float]]) -> tuple[float, float, float]:
    """point ± Student's t at Satterthwaite's degrees of freedom over the sizes' shares of the variance."""
    v, df = (np.array(x, float) for x in zip(*parts)) if parts else (np.zeros(0), np.zeros(0))
    if not math.isfinite(point) or not np.isfinite(v).all():
        return math.nan, math.nan, math.nan
    total, dof = satterthwaite(v, df)
    if total == 0:
        return point, point, math.inf
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, dof)) * math.sqrt(total)
    return point - half, point + half, dof


@dataclass
class _Fit:
    """The fits predict() reads a gap from: each configuration's means, law, slopes and misfit."""

    samples: dict
    configs: list
    sizes: list
    xs: np.ndarray
    targets: np.ndarray
    point: list
    laws: list
    slopes: list
    misfits: list

    def gap(self, i: int, b: int) -> tuple:
        """(the gap of configuration i to the baseline b at each target by their power laws, its
        lack-of-fit p, per target the weights of each size's means in it)."""
        config, baseline, n = self.configs[i], self.configs[b], len(self.sizes)
        gap_point = self.laws[i](self.targets) - self.laws[b](self.targets)
        misfit = np.nanmin([self.misfits[i], self.misfits[b], math.inf])
        weights = [
            [{config: self.slopes[i][j, t], baseline: -self.slopes[b][j, t]} for j in range(n)]
            for t in range(len(self.targets))
        ]
        return gap_point, misfit, weights

    def log_linear_gap(self, i: int, b: int) -> tuple:
        """``gap`` by the log-linear fit of the gaps (linear in them: exact slopes), where a power law
        did not converge."""
        config, baseline, xs, n = self.configs[i], self.configs[b], self.xs, len(self.sizes)
        se = _gap_se(self.samples, config, baseline, self.sizes)
        gaps = self.point[i] - self.point[b]
        line = _log_linear(xs, gaps, se, xs)
        paired = [_paired(self.samples, config, baseline, size) for size in self.sizes]
        g = _slopes(lambda m: _log_linear(xs, m, se, self.targets), gaps, np.ones(n))
        weights = [
            [{config: g[j, t], baseline: -g[j, t]} for j in range(n)] for t in range(len(self.targets))
        ]
        return _log_linear(xs, gaps, se, self.targets), _misfit_p(gaps - line, paired, 2), weights


def predict(samples: dict, configs: list, baseline, sizes: list, x: dict, targets: list) -> pd.DataFrame:
    """One row per (configuration, target): the law, the predicted loss and gap with their intervals.

    ``samples``: (config, size) -> {seed: final loss}; ``x``: size -> its parameters (or tokens);
    ``targets``: in x's units.
    """
    xs = np.array([x[s] for s in sizes], float)
    targets = np.asarray(targets, float)
    nt = len(targets)
    point = _means(samples, configs, sizes)
    laws = [fit_law(xs, row) for row in point]
    b = configs.index(baseline)
    # per configuration, sizes x (loss at each target, E, A, alpha): the fit's response to each mean
    slopes = [
        _slopes(lambda m: _outputs(xs, m, targets), point[i], np.array([_step(samples, c, s) for s in sizes]))
        for i, c in enumerate(configs)
    ]

    def own(i: int, k: int, value: float) -> tuple[float, float, float]:
        return _t_interval(
            value, [_part(samples, s, {configs[i]: slopes[i][j, k]}) for j, s in enumerate(sizes)]
        )

    misfits = [
        _misfit_p(point[i] - law(xs), [list(_seeds(samples.get((c, s), {})).values()) for s in sizes], 3)
        if law.converged
        else math.nan
        for i, (c, law) in enumerate(zip(configs, laws))
    ]
    largest = float(xs.max())
    rows = []
    fit = _Fit(samples, configs, sizes, xs, targets, point, laws, slopes, misfits)
    for i, config in enumerate(configs):
        law = laws[i]
        power = law.converged and laws[b].converged
        gap_point, misfit, weights = fit.gap(i, b) if power or i == b else fit.log_linear_gap(i, b)
        method = POWER if power or (i == b and law.converged) else LOG_LINEAR
        if not np.isfinite(gap_point).all() and i != b:
            method = NOT_CONVERGED
        p_ci = [own(i, nt + k, p) for k, p in enumerate((law.E, law.A, law.alpha))]
        for t, target in enumerate(targets):
            l_lo, l_hi, _ = own(i, t, float(law(target)))
            gap = 0.0 if i == b else float(gap_point[t])
            if i == b:
                g_lo, g_hi, g_df = 0.0, 0.0, math.inf
            else:
                g_lo, g_hi, g_df = _t_interval(
                    gap, [_part(samples, s, weights[t][j]) for j, s in enumerate(sizes)]
                )
            word = "baseline" if i == b else _word(g_lo, g_hi)
            misfit_p = math.nan if i == b or not math.isfinite(misfit) else float(misfit)
            withheld = (
                f"the {'power law' if method == POWER else 'log-linear gap'} misfits the measured means "
                f"(lack-of-fit p = {misfit_p:.2g} < {MISFIT_P})"
                if misfit_p < MISFIT_P and word != NOT_CONVERGED
                else ""
            )
            rows.append(
                {
                    "config": config,
                    "baseline": baseline,
                    "target": float(target),
                    "times_largest": float(target) / largest,
                    "far": float(target) > FAR * largest,
                    "method": "baseline" if i == b else method,
                    "E": law.E,
                    "E_ci_low": p_ci[0][0],
                    "E_ci_high": p_ci[0][1],
                    "A": law.A,
                    "A_ci_low": p_ci[1][0],
                    "A_ci_high": p_ci[1][1],
                    "alpha": law.alpha,
                    "alpha_ci_low": p_ci[2][0],
                    "alpha_ci_high": p_ci[2][1],
                    "loss_pred": float(law(target)) if law.converged else math.nan,
                    "loss_ci_low": l_lo,
                    "loss_ci_high": l_hi,
                    "gap_pred": gap if math.isfinite(gap) else math.nan,
                    "gap_ci_low": g_lo,
                    "gap_ci_high": g_hi,
                    "gap_df": g_df,
                    "misfit_p": misfit_p,
                    "interval_word": word,  # what the interval alone says, withheld or not
                    "withheld": withheld,
                    "verdict": NO_PREDICTION if withheld else word,
                }
            )
    return pd.DataFrame(rows)


def scale_samples(s: Scale) -> tuple[dict, list, dict]:
    """The scale axis's per-seed samples, its sizes in order, and each size's x."""
    sizes = sorted(s.table[s.key].unique())
    x = s.table.groupby(s.key)["x"].first().to_dict()
    return s.samples, sizes, x


def prediction(s: Scale, targets: list[float]) -> pd.DataFrame:
    """predict.csv: every configuration at every target."""
    samples, sizes, x = scale_samples(s)
    return predict(samples, s.configs, s.baseline, sizes, x, targets)


def _measured_word(row) -> str | None:
    if pd.isna(row["diff_ci_low"]):
        return None  # too few seeds to call it
    return _word(row["diff_ci_low"], row["diff_ci_high"])


def backtest(s: Scale) -> pd.DataFrame | None:
    """backtest.csv: the largest size held out and predicted from the others (None below BACKTEST_SIZES)."""
    samples, sizes, x = scale_samples(s)
    if len(sizes) < BACKTEST_SIZES:
        return None
    held, rest = sizes[-1], sizes[:-1]
    predicted = predict(samples, s.configs, s.baseline, rest, x, [x[held]]).set_index("config")
    table = s.table.set_index(["config", s.key])
    rows = []
    for config in s.configs:
        if config == s.baseline:
            continue
        at, before = table.loc[(config, held)], table.loc[(config, rest[-1])]
        p = predicted.loc[config]
        measured, naive = _measured_word(at), _measured_word(before)
        counted = measured is not None and p["interval_word"] != NOT_CONVERGED
        rows.append(
            {
                "config": config,
                "baseline": s.baseline,
                "held_out": held,
                "held_out_x": x[held],
                "method": p["method"],
                "gap_pred": p["gap_pred"],
                "gap_ci_low": p["gap_ci_low"],
                "gap_ci_high": p["gap_ci_high"],
                "gap_measured": at["diff_vs_baseline"],
                "measured_ci_low": at["diff_ci_low"],
                "measured_ci_high": at["diff_ci_high"],
                "covered": bool(counted and p["gap_ci_low"] <= at["diff_vs_baseline"] <= p["gap_ci_high"])
                if counted
                else None,
                "verdict_pred": p["interval_word"],
                "verdict_measured": measured or NEEDS_SEEDS,
                "fit_right": (p["interval_word"] == measured) if counted else None,
                "naive_from": rest[-1],
                "verdict_naive": naive or NEEDS_SEEDS,
                "naive_right": (naive == measured) if measured is not None and naive is not None else None,
            }
        )
    return pd.DataFrame(rows)


def withhold(pred: pd.DataFrame, back: pd.DataFrame | None) -> pd.DataFrame:
    """predict.csv with every prediction of a comparison whose backtest interval missed the measured
    gap withheld: a method that failed where it could be checked is not trusted beyond the grid."""
    if back is None or not len(back):
        return pred
    missed = back[back["covered"].eq(False)].set_index("config")
    pred = pred.copy()
    for i, row in pred.iterrows():
        if row["config"] in missed.index and row["verdict"] not in (NOT_CONVERGED, "baseline"):
            m = missed.loc[row["config"]]
            why = (
                f"the backtest's interval [{m['gap_ci_low']:+.3f}, {m['gap_ci_high']:+.3f}] missed the "
                f"gap measured at the held-out size ({m['gap_measured']:+.3f})"
            )
            pred.loc[i, "withheld"] = "; ".join(w for w in (row["withheld"], why) if w)
            pred.loc[i, "verdict"] = NO_PREDICTION
    return pred


def _amount(value: float, unit: str) -> str:
    """1.2M parameters, 400K tokens, model.d_model 512."""
    if unit not in ("parameters", "training tokens"):
        return f"{unit} {value:g}"
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix} {unit}"
    return f"{value:g} {unit}"


def predict_sentences(s: Scale, pred: pd.DataFrame, back: pd.DataFrame | None) -> list[str]:
    """The prediction's sentences: the method, one per comparison and target, the backtest's line."""
    unit = _x_words(s)
    out = [
        f"Prediction: each configuration's best-value loss fitted by L = E + A x^-alpha against its "
        f"{unit} ({len(s.table[s.key].unique())} sizes), 95% t-intervals from the seeds' spread at each "
        "size carried through the fit; the intervals carry the seeds' noise, not whether the law holds "
        "beyond the grid."
    ]
    for row in pred.itertuples(index=False):
        if row.config == s.baseline:
            if row.method == "baseline" and math.isnan(row.loss_pred):
                out.append(
                    f"{row.config} (baseline): the power law did not converge; gaps are extrapolated "
                    f"by the log-linear fit of the gap."
                )
            continue
        at = _amount(row.target, unit)
        far = (
            f" ({row.times_largest:.0f}x the largest size measured: far beyond the grid, the interval "
            f"is a lower bound on the uncertainty)"
            if row.far
            else f" ({row.times_largest:.2g}x the largest size measured)"
        )
        if row.verdict == NOT_CONVERGED:
            out.append(f"At {at}, {row.config} against {s.baseline}: {NOT_CONVERGED} (no prediction){far}.")
            continue
        if row.verdict == NO_PREDICTION:
            out.append(f"At {at}, {row.config} against {s.baseline}: {NO_PREDICTION}: {row.withheld}.")
            continue
        ci = (
            f"[{row.gap_ci_low:+.3f}, {row.gap_ci_high:+.3f}]"
            if math.isfinite(row.gap_ci_low)
            else "(no interval: too few seeds, or no fit near the measured means)"
        )
        how = "" if row.method == POWER else f" by the {row.method}"
        out.append(
            f"At {at} {row.config} is predicted {row.gap_pred:+.3f} {ci} from {s.baseline}{how}: "
            f"{row.verdict}{far}."
        )
    if back is not None and len(back):
        fit = back["fit_right"].dropna()
        naive = back["naive_right"].dropna()
        covered = back["covered"].dropna()
        held = _fmt_value(back["held_out"].iloc[0])
        out.append(
            f"Backtest, held-out size {s.key}={held} predicted from the smaller ones: the fit called "
            f"{int(fit.sum())} of {len(fit)} comparisons right, the naive rule (the verdict at "
            f"{_fmt_value(back['naive_from'].iloc[0])}) {int(naive.sum())} of {len(naive)}; the fit's "
            f"interval covered the measured gap in {int(covered.sum())} of {len(covered)}"
            + (
                f" ({len(back) - len(fit)} not counted: too few seeds or no fit)"
                if len(fit) < len(back)
                else ""
            )
            + "."
        )
    elif back is None:
        out.append(f"No backtest: it needs ≥ {BACKTEST_SIZES} sizes (one held out, three to fit).")
    return out
