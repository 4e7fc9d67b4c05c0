"""Reports: turn run directories (and bench CSVs) into verdicts, tables, charts and one HTML page.

The package behind ``normbench report``, one module per stage (see normbench.report.build):
load (reading runs), metrics (what --metric may be: its label, unit, direction), tables
(grouping, the aggregate), stats (seed statistics with scipy), tuning (best value per
configuration, LR sensitivity, comparison with the best), scale (each comparison across sizes
and its trend), verdict (the generated sentences), charts (one registered function per chart)
and render (HTML, Markdown, terminal).

One rule runs through it: the verdict's statistics use *completed* runs only. Diverged and failed
runs are counted in their own columns and marked on the charts, never averaged in.
"""

from normbench.report.build import run_report
from normbench.report.charts import CHARTS
from normbench.report.load import load_runs
from normbench.report.tables import default_group_keys

__all__ = ["CHARTS", "default_group_keys", "load_runs", "run_report"]
