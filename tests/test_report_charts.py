"""The report's charts read right at a glance: every configuration stays visible where curves
coincide, the final-loss chart draws the interval the verdict states, close curve ends get a zoom,
and a chart's title promises only what it draws. Checked on the drawn matplotlib figures (their
lines, their rendered pixels) of fabricated run directories."""

from __future__ import annotations

import json
import math

import matplotlib.colors
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from test_report import capture_charts, make_run, report
from test_report_predict import gpt_params, law, plant

from normbench.report.stats import compare

STEPS = tuple(range(10, 170, 10))  # 16 records per curve: long enough for markers every few points
CONFIGS = {"ln/pre", "rms/pre", "ln/post", "rms/post"}


def four_configs(root, finals: dict) -> None:
    """ln/rms x pre/post over seeds 0 and 1; ``finals[(norm, placement)]`` = one final loss per seed.
    make_run derives the curves from the final loss: equal finals give identical curves."""
    for (norm, placement), per_seed in finals.items():
        for seed, final in enumerate(per_seed):
            make_run(
                root,
                f"{norm}-{placement}-{seed}",
                norm=norm,
                placement=placement,
                seed=seed,
                final=final,
                steps=STEPS,
            )


def config_lines(ax) -> dict:
    return {line.get_label(): line for line in ax.get_lines() if line.get_label() in CONFIGS}


def pixels_of(fig, ax, color) -> int:
    """How many pixels inside ``ax`` have exactly ``color`` (within rounding), legend left out."""
    for legend in fig.legends:
        legend.set_visible(False)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    image = np.asarray(canvas.buffer_rgba())[..., :3].astype(float) / 255
    box = ax.get_window_extent()
    height = image.shape[0]
    crop = image[int(height - box.y1) : int(height - box.y0), int(box.x0) : int(box.x1)]
    target = np.array(matplotlib.colors.to_rgb(color))
    return int((np.abs(crop - target).max(axis=-1) < 0.02).sum())


def test_identical_curves_of_four_configurations_all_stay_visible(tmp_path, monkeypatch):
    """ln and rms train to exactly the same curves: four legend entries must show four lines, each
    with its own (colour, line style, marker), and each colour must reach the page."""
    drawn = capture_charts(monkeypatch, "loss_curves", "grad_by_layer", "grad_norm")
    four_configs(
        tmp_path,
        {
            ("ln", "pre"): (2.0, 2.02),
            ("rms", "pre"): (2.0, 2.02),
            ("ln", "post"): (2.3, 2.32),
            ("rms", "post"): (2.3, 2.32),
        },
    )
    report([tmp_path])
    fig = drawn["loss_curves"]
    legend = {text.get_text() for legend in fig.legends for text in legend.get_texts()}
    assert legend >= CONFIGS
    for name in ("loss_curves", "grad_by_layer", "grad_norm"):
        for ax in drawn[name].axes:
            if not ax.get_visible() or not ax.get_lines():
                continue
            lines = config_lines(ax)
            assert set(lines) == CONFIGS, (name, ax.get_title())
            triples = {(ln.get_color(), str(ln.get_linestyle()), ln.get_marker()) for ln in lines.values()}
            assert len(triples) == 4, (name, triples)
            # the two lines of one placement coincide; each must still show its own colour
            for placement in ("pre", "post"):
                ln, rms = lines[f"ln/{placement}"], lines[f"rms/{placement}"]
                assert list(ln.get_ydata()) == pytest.approx(list(rms.get_ydata()))
                assert {ln.get_linewidth(), rms.get_linewidth()} != {ln.get_linewidth()}  # thick, then thin
    train = drawn["loss_curves"].axes[0]
    for label, line in config_lines(train).items():
        assert pixels_of(fig, train, line.get_color()) > 30, label
    # where two lines are one curve, the panel says which
    notes = train.get_legend().get_title().get_text()
    assert "ln/pre, rms/pre" in notes and "ln/post, rms/post" in notes


def test_curves_that_differ_are_not_called_one(tmp_path, monkeypatch):
    drawn = capture_charts(monkeypatch, "loss_curves")
    four_configs(
        tmp_path,
        {
            ("ln", "pre"): (2.0, 2.02),
            ("rms", "pre"): (2.4, 2.42),
            ("ln", "post"): (2.8, 2.82),
            ("rms", "post"): (3.2, 3.22),
        },
    )
    report([tmp_path])
    train = drawn["loss_curves"].axes[0]
    assert train.get_legend() is None
    assert len({line.get_linewidth() for line in config_lines(train).values()}) == 1


# The same seed shifts every configuration alike (data order, init): the unpaired intervals of
# the means overlap, the paired interval of the difference excludes 0.
SEED_SHIFT = (0.0, 0.3, -0.25)
PAIRED = {("ln", "pre"): 2.0, ("rms", "pre"): 2.05, ("ln", "post"): 2.11}


def test_final_loss_chart_draws_the_verdicts_paired_interval(tmp_path, monkeypatch):
    drawn = capture_charts(monkeypatch, "final_loss")
    per_seed = {}
    for (norm, placement), base in PAIRED.items():
        label = f"{norm}/{placement}"
        per_seed[label] = {seed: base + shift + 0.003 * seed for seed, shift in enumerate(SEED_SHIFT)}
        for seed, final in per_seed[label].items():
            make_run(
                tmp_path,
                f"{label.replace('/', '-')}-{seed}",
                norm=norm,
                placement=placement,
                seed=seed,
                final=final,
            )
    _, text = report([tmp_path])
    fig = drawn["final_loss"]
    runs_ax, diff_ax = fig.axes[:2]
    assert "as the verdict tests it" in diff_ax.get_title() and "paired by seed" in diff_ax.get_title()
    ticks = [t.get_text() for t in diff_ax.get_xticklabels()]
    assert ticks == ["ln/pre", "rms/pre", "ln/post"]
    flat = " ".join(text.split())
    for i, label in enumerate(ticks[1:], start=1):
        expected = compare(per_seed[label], per_seed["ln/pre"])  # the paired test, on the planted numbers
        assert expected.paired and 0.0 not in expected.ci
        (container,) = [c for c in diff_ax.containers if c.lines[0].get_xdata()[0] == i]
        point = container.lines[0].get_ydata()[0]
        ((_, low), (_, high)) = container.lines[2][0].get_segments()[0]
        assert (point, low, high) == pytest.approx((expected.diff, expected.ci.low, expected.ci.high))
        # the same interval the verdict prints
        assert f"{label} by {expected.diff:+.3f} [{expected.ci.low:+.3f}, {expected.ci.high:+.3f}]" in flat
    # the left panel: every run's loss, the runs of one seed joined in the table's order
    joined = [line for line in runs_ax.get_lines() if line.get_color() == "grey"]
    assert len(joined) == 3
    for seed, line in enumerate(joined):
        assert list(line.get_ydata()) == pytest.approx([per_seed[c][seed] for c in ticks])


def write_curves(run, values, steps) -> None:
    """Replace a run's validation curve with ``values`` at ``steps``."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    lines = [r for r in lines if r["kind"] != "eval"]
    lines += [{"kind": "eval", "step": s, "val_loss": v} for s, v in zip(steps, values)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


@pytest.mark.parametrize("gap, zoomed", [(0.09, True), (1.0, False)])
def test_curves_ending_close_together_get_a_zoom_panel(tmp_path, monkeypatch, gap, zoomed):
    """Both fall from 4.2 towards their end; ends 0.09 apart over a 2-nat fall get a panel over the
    last 30% of steps with its own y limits; ends 1.0 apart do not."""
    drawn = capture_charts(monkeypatch, "loss_curves")
    steps = list(range(0, 160, 10))
    for norm, end in (("ln", 2.1), ("rms", 2.1 + gap)):
        for seed in (0, 1):
            run = make_run(tmp_path, f"{norm}{seed}", norm=norm, seed=seed, final=end)
            write_curves(run, [end + (4.2 - end) * math.exp(-s / 25) for s in steps], steps)
    report([tmp_path])
    axes = [ax for ax in drawn["loss_curves"].axes if ax.get_visible()]
    zooms = [ax for ax in axes if "zoomed" in ax.get_title()]
    if not zoomed:
        assert not zooms
        return
    (zoom,) = [ax for ax in zooms if ax.get_title().startswith("Validation")]
    xs = [x for line in zoom.get_lines() if line.get_label() in ("ln", "rms") for x in line.get_xdata()]
    assert min(xs) >= 0.7 * 150 and max(xs) == 150
    low, high = zoom.get_ylim()
    assert 2.0 < low < 2.1 and 2.19 < high < 2.5  # the two ends fill the panel, not the fall from 4.2
    assert zoom.get_ylim()[1] - zoom.get_ylim()[0] < 0.2 * (4.2 - 2.1)


def close_curves(root, steps) -> None:
    """ln and rms, two seeds each, falling from 4.2 to ends 0.09 apart, evaluated at ``steps``."""
    for norm, end in (("ln", 2.1), ("rms", 2.19)):
        for seed in (0, 1):
            run = make_run(root, f"{norm}{seed}", norm=norm, seed=seed, final=end, steps=(100, 200, 300))
            write_curves(run, [end + (4.2 - end) * math.exp(-s / 60) for s in steps], steps)


def test_the_validation_zoom_shows_at_least_three_evaluations(tmp_path, monkeypatch):
    """Evaluations every 100 steps of a 300-step run: the last 30% holds one; the zoom holds three."""
    drawn = capture_charts(monkeypatch, "loss_curves")
    close_curves(tmp_path, [0, 100, 200, 300])
    report([tmp_path])
    (zoom,) = [
        ax for ax in drawn["loss_curves"].axes if ax.get_title().startswith("Validation loss vs step, zoomed")
    ]
    for label in ("ln", "rms"):
        (line,) = [line for line in zoom.get_lines() if line.get_label() == label]
        assert list(line.get_xdata()) == [100, 200, 300]
    assert "zoomed from step 100" in zoom.get_title()


def test_a_validation_curve_of_two_evaluations_gets_no_zoom(tmp_path, monkeypatch):
    drawn = capture_charts(monkeypatch, "loss_curves")
    close_curves(tmp_path, [0, 300])
    report([tmp_path])
    titles = [ax.get_title() for ax in drawn["loss_curves"].axes if ax.get_visible()]
    assert any(t.startswith("Validation loss vs step") for t in titles)
    assert not any(t.startswith("Validation loss vs step, zoomed") for t in titles)


def test_predict_title_promises_no_fitted_line_when_the_fit_failed(tmp_path, monkeypatch):
    drawn = capture_charts(monkeypatch, "predict")
    params = gpt_params((16, 24, 32, 48))
    # straight lines in log N, equal for both norms: no power law converges, the points coincide
    line = lambda n: 4.0 - 0.1 * math.log(n)
    plant(tmp_path, {"ln": line, "rms": line}, params, own=0.0005)
    report([tmp_path], scale_key="model.d_model", baseline="norm=ln", predict="2e6")
    fig = drawn["predict"]
    title = fig.get_suptitle()
    assert "lines: L = E" not in title and "no power law converged for ln, rms" in title
    assert "fitted law" not in fig.axes[0].get_title()
    # every configuration's measured points drawn, side by side at each size
    points = {c.get_label(): c.lines[0] for c in fig.axes[0].containers if c.get_label() in ("ln", "rms")}
    assert set(points) == {"ln", "rms"}
    ln_x, rms_x = points["ln"].get_xdata(), points["rms"].get_xdata()
    assert all(a < b for a, b in zip(ln_x, rms_x)) and points["ln"].get_marker() != points["rms"].get_marker()


def test_predict_title_names_the_fitted_lines_when_the_fit_converged(tmp_path, monkeypatch):
    drawn = capture_charts(monkeypatch, "predict")
    plant(tmp_path, {"ln": law(2.0, 40.0, 0.35), "rms": law(2.1, 60.0, 0.4)}, gpt_params((16, 24, 32, 48)))
    report([tmp_path], scale_key="model.d_model", baseline="norm=ln", predict="2e6")
    fig = drawn["predict"]
    assert (
        "lines: L = E + A x^-alpha fitted" in fig.get_suptitle() and "no power law" not in fig.get_suptitle()
    )
    assert "fitted law" in fig.axes[0].get_title()


def test_styles_are_unique_and_a_tuned_configuration_keeps_its_colour():
    """24 rows (4 norms x 2 placements x 3 learning rates): no two share colour, line style and
    marker; the rows of one configuration share its colour, whatever their results' order."""
    import pandas as pd

    from normbench.report.charts.styles import make_styles

    rows = [
        (f"{n}/{p} lr={lr}", n, p)
        for n in ("ln", "rms", "dyt", "bn")
        for p in ("pre", "post")
        for lr in (0.001, 0.01, 0.1)
    ]
    runs = pd.DataFrame(rows, columns=["config", "norm", "placement"])
    styles = make_styles(runs, runs[["config"]].iloc[::-1], "train.lr")  # results order: reversed
    triples = {(s["color"], str(s["linestyle"]), s["marker"]) for s in styles.values()}
    assert len(styles) == len(triples) == 24
    for n in ("ln", "rms", "dyt", "bn"):
        for p in ("pre", "post"):
            assert len({styles[f"{n}/{p} lr={lr}"]["color"] for lr in (0.001, 0.01, 0.1)}) == 1
    assert len({styles[f"{n}/{p} lr=0.01"]["color"] for n, p in {(r[1], r[2]) for r in rows}}) == 8
    assert styles["ln/pre lr=0.01"]["marker"] != styles["rms/pre lr=0.01"]["marker"]  # a marker per norm


def test_the_final_loss_chart_draws_the_compared_metric_with_its_unit(tmp_path, monkeypatch):
    """Under --metric tokens_per_s the left panel shows each run's throughput, labelled in tokens/s,
    not its loss in nats/token."""
    drawn = capture_charts(monkeypatch, "final_loss")
    speeds = {}
    for norm, base in (("ln", 1000.0), ("rms", 1500.0)):
        for seed in (0, 1):
            speeds[(norm, seed)] = base + 10.0 * seed
            make_run(
                tmp_path,
                f"{norm}-{seed}",
                norm=norm,
                seed=seed,
                final=2.0 + 0.1 * seed,
                tokens_per_s=speeds[(norm, seed)],
            )
    report([tmp_path], metric="tokens_per_s")
    runs_ax = drawn["final_loss"].axes[0]
    assert runs_ax.get_ylabel() == "tokens/s"
    plotted = sorted(
        y for line in runs_ax.get_lines() if line.get_color() != "grey" for y in line.get_ydata()
    )
    assert plotted == pytest.approx(sorted(speeds.values()))
