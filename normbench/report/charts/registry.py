"""The chart registry: ``@chart(name, title)`` adds a drawing function to ``CHARTS``, which
``normbench report`` draws in the page's order."""

from __future__ import annotations

# (name, title, draw), in the page's order once the package has sorted them (normbench.report.charts.PAGE);
# RUN_CHARTS need run directories, the others do not.
CHARTS: list[tuple[str, str, object]] = []
RUN_CHARTS: set[str] = set()


def chart(name: str, title: str, needs_runs: bool = True):
    """Register a chart: ``draw(d: ReportData) -> Figure | str | None`` (the string: why not drawn;
    None: not for these runs, left out without a note)."""

    def register(draw):
        CHARTS.append((name, title, draw))
        if needs_runs:
            RUN_CHARTS.add(name)
        return draw

    return register
