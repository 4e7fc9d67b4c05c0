"""Charts: one function per chart, registered with ``@chart(name, title)`` (``registry``).

A chart function takes the ``ReportData`` and returns a matplotlib ``Figure``, a string
saying why it was not drawn (its data is missing), or None when it belongs to an analysis these
runs were not asked for (the scale charts without a scale axis); ``draw_charts`` saves each as
``NAME.png`` (plus the other formats asked for), in ``PAGE``'s order, and ``run_report`` embeds it in
report.html. The charts live by family: ``loss`` (loss and tuning), ``scaling`` (scale and
prediction), ``layers`` (layers, gradients, logits, stability) and ``speed`` (throughput and the norm
micro-benchmark); all of them use one visual mapping (``styles``) and draw with the same helpers
(``panels``). Adding a chart is one decorated function in its family's module and its name in ``PAGE``.
"""

import io
from pathlib import Path

from normbench.core.fileio import write_atomic
from normbench.report.charts import layers, loss, scaling, speed  # noqa: F401  (each registers its charts)
from normbench.report.charts.registry import CHARTS, RUN_CHARTS, chart

FORMATS = ("png", "svg", "pdf")
DPI = 100

# The page's order: loss and tuning, scale and prediction, the gradients, the throughput beside them,
# the logits and stability, and the micro-benchmark last.
PAGE = (
    "loss_curves",
    "final_loss",
    "tuning",
    "scale_gap",
    "scale_best_value",
    "predict",
    "scale_tuning",
    "grad_by_layer",
    "depth_profile",
    "grad_profile",
    "grad_norm",
    "throughput",
    "logits",
    "stability",
    "bench",
)
CHARTS.sort(key=lambda entry: PAGE.index(entry[0]))


def draw_charts(d, out: Path, formats, warn) -> tuple[list, list[str]]:
    """Draw every registered chart; a chart left out this time is deleted from ``out``.

    Returns the charts for the page and, per chart not drawn, 'name (why)'."""
    drawn, written, notes = [], set(), []
    for name, title, draw in CHARTS:
        try:
            no_runs = name in RUN_CHARTS and d.agg is None
            none = "no completed run" if len(d.runs) else "no run directories among the inputs"
            result = none if no_runs else draw(d)
        except Exception as err:  # odd data in one chart must not cost the tables and the other charts
            warn(f"chart {name} failed: {err!r}")
            result = f"failed: {err!r}"
        if result is None:  # not for these runs
            continue
        if isinstance(result, str):
            notes.append(f"{name} ({result})")
            drawn.append((title, None, result))
            continue
        for fmt in ["png", *sorted(set(formats) - {"png"})]:  # PNG always: the page embeds it
            buffer = io.BytesIO()
            result.savefig(buffer, format=fmt, dpi=DPI)
            write_atomic(out / f"{name}.{fmt}", buffer.getvalue())
            written.add(f"{name}.{fmt}")
            if fmt == "png":
                drawn.append((title, buffer.getvalue(), None))
    # A chart left out this time must not survive from an earlier report in the same folder.
    for name, _, _ in CHARTS:
        for fmt in FORMATS:
            if f"{name}.{fmt}" not in written:
                (out / f"{name}.{fmt}").unlink(missing_ok=True)
    return drawn, notes


__all__ = ["CHARTS", "DPI", "FORMATS", "PAGE", "RUN_CHARTS", "chart", "draw_charts"]
