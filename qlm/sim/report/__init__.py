"""What `qlm simulate` writes: requests.csv, summary.json, report.md with PNG plots, and the
summary table it prints; for a rate sweep, sweep.json and a sweep report. Formats are
documented in qlm/sim/README.md. Each file answers one question:

    summary.py   what summary.json, requests.csv and timings.json hold
    tables.py    the summary as a terminal table and as a Markdown table; the miss causes
    plots.py     the PNG plots (attainment, TTFT CDF, queue length, swaps, sweep curves)
    markdown.py  report.md of one run
    sweep.py     sweep.json and the sweep's report.md
"""

from qlm.sim.report.markdown import RunInfo, write_report
from qlm.sim.report.plots import (
    PLOTS,
    plot_attainment,
    plot_queue,
    plot_swaps,
    plot_sweep,
    plot_ttft_cdf,
)
from qlm.sim.report.summary import (
    CSV_COLUMNS,
    SUMMARY_KEYS,
    TIMING_KEYS,
    policy_summary,
    summary_document,
    timings_document,
    write_json,
    write_requests_csv,
)
from qlm.sim.report.sweep import SweepPoint, sweep_document, write_sweep_report
from qlm.sim.report.tables import (
    causes_markdown_table,
    class_names,
    markdown_table,
    summary_table,
)

__all__ = [
    "CSV_COLUMNS",
    "PLOTS",
    "SUMMARY_KEYS",
    "TIMING_KEYS",
    "RunInfo",
    "SweepPoint",
    "causes_markdown_table",
    "class_names",
    "markdown_table",
    "plot_attainment",
    "plot_queue",
    "plot_swaps",
    "plot_sweep",
    "plot_ttft_cdf",
    "policy_summary",
    "summary_document",
    "summary_table",
    "sweep_document",
    "timings_document",
    "write_json",
    "write_report",
    "write_requests_csv",
    "write_sweep_report",
]
