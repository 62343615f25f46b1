"""Sphinx extension: draw the benchmark results in ``docs/bench/*.json`` when the docs are built.

A page asks for one plot per results file::

    ```{benchplot} bench_2ranks.json
    The caption.
    ```

The directive reads the JSON (a path relative to ``benchplots_source``, itself relative to the source
directory), recognises which benchmark wrote it from its keys, draws it with matplotlib's Agg backend
into ``benchplots_output`` (relative to the source directory; ``_build/benchplots``: not committed) and inserts the figure.
A PNG is redrawn only when its JSON or this file is newer; drawing is deterministic (no timestamps in
the file, fixed size and DPI). The writers of the JSON files:

* ``python -m hpccoll bench --json``: ``{"ranks", "rows": [{"collective", "size", "oop": {...},
  "baseline_us", ...}]}``
* ``benchmarks/bench_quick.py --json``: ``{"ranks", "mpi", "rows": [{"collective", "bytes_per_rank",
  "raw", "out", "alloc", "ratio_out", "ratio_alloc", ...}], ...}``
* ``benchmarks/bench_shm.py --json``: ``{"ranks", "rows": [{"collective", "bytes", "x_private", "x_mpi",
  "x_auto", "x_shared", ...}], ...}``
* ``benchmarks/bench_alltoall.py --json``: ``{"a": [{"bytes_per_rank", "learned/raw", ...}], "b": {...},
  "c": [{"block_bytes", "at_once/raw", "steps/raw", ...}]}``

A file in none of these forms is a warning (and so an error under ``-W``), not a silently missing plot.
"""

import json
import math
import os
from typing import Any, Callable, Dict, List, Sequence, Tuple

from docutils import nodes
from docutils.parsers.rst import directives
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullLocator
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

Rows = List[Dict[str, Any]]
Series = List[Tuple[str, Sequence[float], Sequence[float], Dict[str, Any]]]

WIDTH, HEIGHT, DPI = 9.0, 3.6, 100


def _size_label(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n:g} B"


def _leading(v: float) -> int:
    return int(round(v / 10 ** math.floor(math.log10(v) + 1e-9)))


def _by(rows: Rows, key: str) -> Dict[str, Rows]:
    out: Dict[str, Rows] = {}
    for r in rows:
        out.setdefault(str(r[key]), []).append(r)
    return out


def _axes(fig: Any, n: int) -> List[Any]:
    return [fig.add_subplot(1, n, i + 1) for i in range(n)]


def _panel(ax: Any, series: Series, *, title: str, xlabel: str, ylabel: str, logy: bool, one: bool) -> None:
    for label, xs, ys, style in series:
        ax.plot(xs, ys, label=label, **style)
    ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
        lo, hi = ax.get_ylim()
        few = math.log10(hi / lo) < 1.5  # under about one and a half decades: label 2, 3 and 5 too
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if few and _leading(v) in (2, 3, 5) else ""))
    if one:
        ax.axhline(1.0, color="0.5", linewidth=0.8, linestyle=":")
    ticks = sorted({x for _, xs, _, _ in series for x in xs})
    if ticks:
        step = math.ceil(len(ticks) / 6)
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticks(ticks[::step])
        ax.set_xticklabels([_size_label(t) for t in ticks[::step]], fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(True, which="major", linewidth=0.3)
    ax.legend(fontsize=6)


def _line(xs: Sequence[float], ys: Sequence[float], **style: Any) -> Tuple[Sequence[float], Sequence[float], Dict]:
    return xs, ys, dict(marker="o", markersize=3, linewidth=1, **style)


def _hpccoll_bench(fig: Any, data: Dict[str, Any]) -> str:
    """``python -m hpccoll bench --json``: time against raw mpi4py, and the ratio."""
    left, right = _axes(fig, 2)
    times: Series = []
    ratios: Series = []
    for i, (coll, rows) in enumerate(_by(data["rows"], "collective").items()):
        rows = sorted(rows, key=lambda r: r["size"])
        xs = [r["size"] for r in rows]
        color = f"C{i}"
        times.append((f"{coll} (hpccoll)", *_line(xs, [r["oop"]["time_us"] for r in rows], color=color)))
        if all(r.get("baseline_us") for r in rows):
            times.append(
                (f"{coll} (raw mpi4py)", *_line(xs, [r["baseline_us"] for r in rows], color=color, linestyle="--"))
            )
            ratios.append((coll, *_line(xs, [r["oop"]["time_us"] / r["baseline_us"] for r in rows], color=color)))
    _panel(left, times, title="time per call", xlabel="size", ylabel="us", logy=True, one=False)
    _panel(right, ratios, title="hpccoll / raw mpi4py", xlabel="size", ylabel="time ratio", logy=False, one=True)
    return f"python -m hpccoll bench, {data['ranks']} ranks"


def _bench_quick(fig: Any, data: Dict[str, Any]) -> str:
    """``benchmarks/bench_quick.py --json``: hpccoll over raw mpi4py, into ``out=`` and into a new array."""
    left, right = _axes(fig, 2)
    out: Series = []
    alloc: Series = []
    for i, (coll, rows) in enumerate(_by(data["rows"], "collective").items()):
        rows = sorted(rows, key=lambda r: r["bytes_per_rank"])
        xs = [r["bytes_per_rank"] for r in rows]
        out.append((coll, *_line(xs, [r["ratio_out"] for r in rows], color=f"C{i}")))
        alloc.append((coll, *_line(xs, [r["ratio_alloc"] for r in rows], color=f"C{i}")))
    for ax, series, title in ((left, out, "into out= (preallocated)"), (right, alloc, "into a new array")):
        _panel(ax, series, title=title, xlabel="bytes per rank", ylabel="hpccoll / raw", logy=False, one=True)
    mpi = str(data.get("mpi", "")).split(",")[0].replace("Version:", "").split()
    return f"benchmarks/bench_quick.py, {data['ranks']} ranks" + (f", {' '.join(mpi)}" if mpi else "")


def _bench_shm(fig: Any, data: Dict[str, Any]) -> str:
    """``benchmarks/bench_shm.py --json``: raw time / hpccoll time per transport, one panel per collective."""
    groups = _by(data["rows"], "collective")
    for ax, (coll, rows) in zip(_axes(fig, len(groups)), groups.items()):
        rows = sorted(rows, key=lambda r: r["bytes"])
        xs = [r["bytes"] for r in rows]
        series: Series = []
        for i, col in enumerate(("private", "mpi", "auto", "shared")):
            if all(f"x_{col}" in r for r in rows):
                series.append((col, *_line(xs, [r[f"x_{col}"] for r in rows], color=f"C{i}")))
        _panel(ax, series, title=coll, xlabel="bytes", ylabel="raw / hpccoll (> 1: faster)", logy=True, one=True)
    return f"benchmarks/bench_shm.py, {data['ranks']} ranks"


def _bench_alltoall(fig: Any, data: Dict[str, Any]) -> str:
    """``benchmarks/bench_alltoall.py --json``: part (a), and part (c) where it ran."""
    panels = [data["a"]] + ([data["c"]] if data.get("c") else [])
    axes = _axes(fig, len(panels))
    rows = sorted(data["a"], key=lambda r: r["bytes_per_rank"])
    xs = [r["bytes_per_rank"] for r in rows]
    keys = ("learned/raw", "given/raw", "async/raw", "pairs/raw", "given/rawv", "uneven/raw", "transpose/raw")
    series: Series = [(k, *_line(xs, [r[k] for r in rows], color=f"C{i}")) for i, k in enumerate(keys) if k in rows[0]]
    _panel(
        axes[0],
        series,
        title="(a) all_to_all, out=",
        xlabel="bytes per rank",
        ylabel="time ratio",
        logy=False,
        one=True,
    )
    if len(axes) > 1:
        rows = sorted(data["c"], key=lambda r: r["block_bytes"])
        xs = [r["block_bytes"] for r in rows]
        keys = ("at_once/raw", "steps/raw")
        series = [(k, *_line(xs, [r[k] for r in rows], color=f"C{i}")) for i, k in enumerate(keys) if k in rows[0]]
        _panel(
            axes[1], series, title="(c) by block size", xlabel="block bytes", ylabel="time ratio", logy=False, one=True
        )
    ranks = (data.get("b") or {}).get("ranks")
    return "benchmarks/bench_alltoall.py" + (f", {ranks} ranks" if ranks else "")


def kind_of(data: Any) -> Callable[[Any, Dict[str, Any]], str]:
    """The drawing function for one results file, by its keys; ``ValueError`` if none fits."""
    if isinstance(data, dict):
        rows = data.get("rows")
        first = rows[0] if isinstance(rows, list) and rows and isinstance(rows[0], dict) else {}
        if "oop" in first and "size" in first:
            return _hpccoll_bench
        if "ratio_out" in first and "bytes_per_rank" in first:
            return _bench_quick
        if "x_private" in first and "bytes" in first:
            return _bench_shm
        a = data.get("a")
        if isinstance(a, list) and a and "bytes_per_rank" in a[0]:
            return _bench_alltoall
    raise ValueError("not a results file of python -m hpccoll bench, bench_quick, bench_shm or bench_alltoall")


def draw(source: str, target: str) -> None:
    """Draw ``source`` (a results JSON) into ``target`` (a PNG)."""
    with open(source) as f:
        data = json.load(f)
    fn = kind_of(data)
    fig = Figure(figsize=(WIDTH, HEIGHT), dpi=DPI)
    FigureCanvasAgg(fig)
    title = fn(fig, data)
    fig.suptitle(f"{title} ({os.path.basename(source)})", fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = target + ".tmp"
    fig.savefig(tmp, format="png", dpi=DPI, metadata={"Software": None})
    os.replace(tmp, target)


class BenchPlot(SphinxDirective):
    """``benchplot``: one results JSON drawn as a figure; the directive's content is the caption."""

    required_arguments = 1
    has_content = True
    option_spec = {"alt": directives.unchanged}

    def run(self) -> List[nodes.Node]:
        config = self.env.config
        name = self.arguments[0]
        source = os.path.join(self.env.srcdir, config.benchplots_source, name)
        png = os.path.splitext(os.path.basename(name))[0] + ".png"
        target = os.path.join(self.env.srcdir, config.benchplots_output, png)
        self.env.note_dependency(source)
        self.env.note_dependency(__file__)
        try:
            newest = max(os.path.getmtime(source), os.path.getmtime(__file__))
            if not os.path.exists(target) or os.path.getmtime(target) < newest:
                draw(source, target)
        except (OSError, ValueError, KeyError, TypeError) as e:
            logger.warning("benchplot %s: %s", name, e, location=self.get_location())
            return []
        uri = "/" + "/".join((config.benchplots_output.strip("/"), png))
        figure = nodes.figure()
        figure += nodes.image(uri=uri, alt=self.options.get("alt", name))
        if self.content:
            caption_nodes, messages = self.parse_inline("\n".join(self.content), lineno=self.content_offset)
            figure += nodes.caption("", "", *caption_nodes)
            figure += messages
        return [figure]


def setup(app: Sphinx) -> Dict[str, Any]:
    app.add_config_value("benchplots_source", "bench", "env")
    app.add_config_value("benchplots_output", "_build/benchplots", "env")
    app.add_directive("benchplot", BenchPlot)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
