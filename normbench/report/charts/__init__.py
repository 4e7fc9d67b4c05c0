"""Charts: one function per chart, registered with ``@chart(name, title)`` (``registry``).

A chart function takes the ``ReportData`` and returns a matplotlib ``Figure``, a string
saying why it was not drawn (its data is missing), or None when it belongs to an analysis these
runs were not asked for (the scale charts without a scale axis); ``run_report`` saves each as ``NAME.png``
(plus the other formats asked for) and embeds it in report.html, in ``PAGE``'s order. The charts live
by family: ``loss`` (loss and tuning), ``scaling`` (scale and prediction), ``layers`` (layers,
gradients, logits, stability) and ``speed`` (throughput and the norm micro-benchmark); all of them
use one visual mapping (``styles``) and draw with the same helpers (``panels``). Adding a chart is one
decorated function in its family's module and its name in ``PAGE``.
"""

from normbench.report.charts import layers, loss, scaling, speed  # noqa: F401  (each registers its charts)
from normbench.report.charts.registry import CHARTS, RUN_CHARTS, chart

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

__all__ = ["CHARTS", "PAGE", "RUN_CHARTS", "chart"]
