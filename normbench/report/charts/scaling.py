"""The scale and prediction charts (with a size axis, --scale; --predict): the difference to the
baseline and the best value of the tuned key against size, each configuration's fitted law and its
prediction beyond the grid, and the tuning curves one panel per size."""

from __future__ import annotations

import math

import matplotlib.ticker
import numpy as np
import pandas as pd

from normbench.report.charts.loss import _tuning_curve, _tuning_marks, _tuning_points
from normbench.report.charts.panels import _figure, _legend, _plain, metric_label
from normbench.report.charts.registry import chart
from normbench.report.charts.styles import _scale_styles
from normbench.report.load import ReportData
from normbench.report.metrics import metric
from normbench.report.tables import _fmt_value


def _size_chart(fig, ax, s, ylabel: str, title: str):
    """A one-panel scale chart finished: a log2 x-axis at the sizes' parameters (or tokens),
    labelled with the size key's values; labels, grid, legend."""
    at = s.table.groupby(s.key)["x"].first()
    ax.set_xscale("log", base=2)
    below = "" if s.x == s.key else f" (below: the size's {s.x})"
    ax.set_xticks(
        at.to_numpy(float), [_fmt_value(k) + ("" if s.x == s.key else f"\n{x:,.0f}") for k, x in at.items()]
    )
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set(xlabel=_plain(s.key + below), ylabel=_plain(ylabel), title=_plain(title))
    ax.grid(alpha=0.3)
    _legend(fig, [ax])
    return fig


def _scale_or_why(d: ReportData, without_tune: str | None = None):
    """The scale axis, why a scale chart is not drawn (``without_tune``: the reason when nothing is
    tuned), or None without a scale axis: a report that compares no sizes has no scale charts."""
    if d.scale is None:
        return None
    return without_tune if without_tune and not d.tune else d.scale


@chart("scale_gap", "Difference to the baseline against size")
def chart_scale_gap(d: ReportData):
    s = _scale_or_why(d)
    if s is None or isinstance(s, str):
        return s
    others = [c for c in s.configs if c != s.baseline]
    if not others:
        return "one configuration: nothing to compare with the baseline"
    styles, trend = _scale_styles(d), s.trend.set_index("config")
    fig, (ax,) = _figure(1, width=8.0, height=5.0)
    ax.axhline(0.0, color="black", linewidth=1, label=_plain(f"baseline: {s.baseline}"))
    for config in others:
        part, style = (
            s.table[s.table["config"].eq(config)].dropna(subset=["diff_vs_baseline"]),
            styles[config],
        )
        ax.plot(
            part["x"],
            part["diff_vs_baseline"],
            color=style["color"],
            linestyle=style["linestyle"],
            marker=style["marker"] or "o",
            markersize=5,
            label=_plain(f"{config} ({trend.at[config, 'trend']})"),
        )
        band = part.dropna(subset=["diff_ci_low"])
        ax.fill_between(
            band["x"],
            band["diff_ci_low"],
            band["diff_ci_high"],
            color=style["color"],
            alpha=0.15,
            linewidth=0,
        )
        fitted = part.dropna(subset=["diff_se"])
        if pd.notna(trend.at[config, "slope_per_doubling"]):  # the WLS line over the sizes it was fitted on
            ax.plot(
                [fitted["x"].min(), fitted["x"].max()],
                [trend.at[config, "fitted_first"], trend.at[config, "fitted_last"]],
                color=style["color"],
                linestyle=":",
                linewidth=2.5,
                alpha=0.7,
                label="fitted trend (least squares)",
            )
    return _size_chart(
        fig,
        ax,
        s,
        f"final val loss - {s.baseline}'s (positive: worse)",
        f"Difference to {s.baseline} at each size\n(each at its best value; band = 95% CI,\n"
        f"paired by seed; dotted = the fitted trend)",
    )


@chart("scale_best_value", "Best value of the tuned key against size")
def chart_scale_best_value(d: ReportData):
    s = _scale_or_why(d, "no tuning key: no best value per size")
    if s is None or isinstance(s, str):
        return s
    styles, trend = _scale_styles(d), s.trend.set_index("config")
    fig, (ax,) = _figure(1, width=8.0, height=5.0)
    # later lines thinner: configurations with the same best stay visible
    for i, config in enumerate(s.configs):
        part, style = s.table[s.table["config"].eq(config)].dropna(subset=["best_value"]), styles[config]
        drift = trend.at[config, "best_drift_half_decades"]
        ax.plot(
            part["x"],
            part["best_value"],
            color=style["color"],
            linestyle=style["linestyle"],
            marker=style["marker"] or "o",
            markersize=max(3, 10 - 2 * i),
            linewidth=max(1.0, 3.0 - 0.5 * i),
            label=_plain(config + ("" if pd.isna(drift) else f" (drift {drift:+.1f} half-decades)")),
        )
    grid = sorted(pd.to_numeric(d.runs[d.tune], errors="coerce").dropna().unique())
    if grid and grid[0] > 0:
        ax.set_yscale("log")
    ax.set_yticks(grid, [f"{v:g}" for v in grid])
    ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    return _size_chart(
        fig,
        ax,
        s,
        f"best {d.tune} (ticks: the swept grid)",
        f"Best {d.tune} at each size\n(lowest mean final loss over completed seeds)",
    )


@chart("predict", "Each configuration's fitted law and the prediction beyond the grid")
def chart_predict(d: ReportData):
    s, pred = d.scale, d.predict
    if s is None or pred is None:
        return None  # no prediction asked for (--predict)
    styles = _scale_styles(d)
    fig, axes = _figure(2, width=6.0, height=4.6, ncols=2)
    targets = sorted(pred["target"].unique())
    grid = np.geomspace(s.table["x"].min(), max(targets[-1], s.table["x"].max()), 200)
    fitted, drawn = [], set()
    for k, config in enumerate(s.configs):
        style, part = styles[config], s.table[s.table["config"].eq(config)]
        rows = pred[pred["config"].eq(config)]
        law = rows.iloc[0]
        # configurations side by side at each size (8% apart on the log axis), each marker edged,
        # so points of equal loss do not hide one another
        shift = 1.08 ** (k - (len(s.configs) - 1) / 2)
        marks = dict(
            color=style["color"], marker=style["marker"], markeredgecolor="black", markeredgewidth=0.6
        )
        mean = part["final_val_loss_mean"]
        axes[0].errorbar(
            part["x"] * shift,
            mean,
            yerr=[(mean - part["ci_low"]).fillna(0), (part["ci_high"] - mean).fillna(0)],
            linestyle="none",
            capsize=3,
            label=_plain(config),
            **marks,
        )
        if np.isfinite(law["alpha"]):
            fitted.append(config)
            axes[0].plot(
                grid,
                law["E"] + law["A"] * grid ** -law["alpha"],
                color=style["color"],
                linestyle=style["linestyle"],
                label=_plain(f"{config}: {law['E']:.3f} + {law['A']:.3g} x^-{law['alpha']:.3f}"),
            )
        for ax, y, low, high, what in (
            (axes[0], "loss_pred", "loss_ci_low", "loss_ci_high", "loss"),
            (axes[1], "gap_pred", "gap_ci_low", "gap_ci_high", "gap"),
        ):
            shown = rows.dropna(subset=[y, low])
            if (config == s.baseline and what == "gap") or shown.empty:
                continue
            drawn.add(what)
            ax.errorbar(
                shown["target"] * shift,
                shown[y],
                yerr=[shown[y] - shown[low], shown[high] - shown[y]],
                color=style["color"],
                marker="D",
                markerfacecolor="white",
                markeredgecolor=style["color"],
                linestyle="none",
                capsize=4,
            )
        if config != s.baseline:
            measured = part.dropna(subset=["diff_vs_baseline"])
            axes[1].plot(
                measured["x"] * shift, measured["diff_vs_baseline"], linestyle=style["linestyle"], **marks
            )
            band = measured.dropna(subset=["diff_ci_low"])
            axes[1].fill_between(
                band["x"], band["diff_ci_low"], band["diff_ci_high"], color=style["color"], alpha=0.15, lw=0
            )
    axes[1].axhline(0.0, color="black", linewidth=1)
    largest = s.table["x"].max()
    unit = {"params": "parameters", "tokens": "training tokens"}.get(s.x, s.key)
    for ax, ylabel, title in (
        (
            axes[0],
            f"{metric_label(d)} at each best value",
            "Measured loss" + ", fitted law" * bool(fitted) + ", prediction" * ("loss" in drawn),
        ),
        (
            axes[1],
            f"{metric(d.metric).header} - {s.baseline}'s",
            f"Gap to {s.baseline}: measured" + ", predicted" * ("gap" in drawn),
        ),
    ):
        ax.axvline(largest, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log")
        ax.set(xlabel=_plain(f"{unit} (dotted: the largest size measured)"), ylabel=_plain(ylabel))
        ax.set_title(_plain(title))
        ax.grid(alpha=0.3)
    failed = [c for c in s.configs if c not in fitted]
    lines = [
        "filled markers: measured mean at each size (95% CI), configurations side by side",
        "lines: L = E + A x^-alpha fitted per configuration" if fitted else "",
        f"no power law converged for {', '.join(failed)}: no fitted line" if failed else "",
        "open diamonds: the prediction with its 95% interval" if drawn else "",
    ]
    fig.suptitle(_plain("\n".join(line for line in lines if line)))
    _legend(fig, axes)
    return fig


@chart("scale_tuning", "Final loss against the tuned key, one panel per size")
def chart_scale_tuning(d: ReportData):
    """Wortsman et al.'s Fig. 1 at each size: how the LR curve moves as the model grows."""
    s = _scale_or_why(d, "no tuning key: one value per size")
    if s is None or isinstance(s, str):
        return s
    from normbench.report.stats import mean_ci

    runs = d.runs.assign(
        _value=pd.to_numeric(d.runs[d.tune], errors="coerce"),
        _config=s.run_config,
        _size=pd.to_numeric(d.runs[s.key], errors="coerce"),
    )
    styles, sizes = _scale_styles(d), sorted(s.table[s.key].unique())
    fig, axes = _figure(len(sizes), width=4.8, height=4.0, ncols=4)
    finite = []
    for ax, size in zip(axes, sizes):
        notes = []
        for config in s.configs:
            at = runs[runs["_config"].eq(config) & runs["_size"].eq(size)]
            row = s.table[s.table["config"].eq(config) & s.table[s.key].eq(size)]
            if at.empty or row.empty:
                continue
            points = _tuning_points(at, mean_ci)
            r = row.iloc[0]
            # the sensitivity goes in the panel's note: in the label it would split a configuration's legend
            # entry
            mark = pd.Series(
                {
                    "config": config,
                    "lr_sensitivity": math.nan,
                    "best_value": r["best_value"],
                    "final_val_loss_mean": r["final_val_loss_mean"],
                    "loss_init": at["init_val_loss"].mean(),
                }
            )
            _tuning_curve(ax, mark, points, styles[config])
            _tuning_marks(ax, mark, points, styles[config])
            if pd.notna(r["lr_sensitivity"]):
                notes.append(f"{config} {r['lr_sensitivity']:.3f}")
            finite += [
                v
                for p in points
                for v in (p[1], *((p[2].low, p[2].high) if p[2] else ()))
                if math.isfinite(v)
            ]
        values = runs["_value"].dropna()
        if len(values) and (values > 0).all() and values.max() / values.min() >= 10:
            ax.set_xscale("log")
        ax.set(
            title=_plain(f"{s.key}={_fmt_value(size)}"),
            xlabel=_plain(d.tune),
            ylabel=metric_label(d),
        )
        if notes:
            ax.text(
                0.02,
                0.98,
                _plain("sensitivity:\n" + "\n".join(notes)),
                transform=ax.transAxes,
                va="top",
                fontsize="x-small",
                bbox=dict(facecolor="white", alpha=0.8, linewidth=0),
            )
        ax.grid(alpha=0.3, which="both")
    if finite:  # one y range for every panel, so the curves' heights compare across sizes
        span = max(finite) - min(finite) or 0.1
        for ax in axes:
            ax.set_ylim(min(finite) - 0.08 * span, max(finite) + 0.08 * span)
    fig.suptitle(
        _plain(
            f"Final validation loss against {d.tune} at each {s.key}\n(mean over completed seeds, "
            f"band = 95% CI, * = best value,\n× = diverged seeds, drawn at the loss at init)"
        )
    )
    _legend(fig, axes)
    return fig
