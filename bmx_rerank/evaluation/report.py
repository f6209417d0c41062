"""Showing an evaluation: a table for the terminal, JSON for machines, a PNG bar chart."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bmx_rerank.evaluation.gate import Gate, interval_text
from bmx_rerank.evaluation.measure import MEASURES, PRIMARY, Comparison
from bmx_rerank.evaluation.selection import Selection


@dataclass
class Row:
    name: str
    bmx: Mapping[str, Any] | None
    means: dict[str, float]
    vs_engine: Comparison
    fallbacks: int = 0


@dataclass
class Report:
    index: str
    field: str
    queries: int
    folds: int
    rows: list[Row]
    selection: Selection
    engine: str = "engine"
    notes: list[str] = field(default_factory=list)
    per_query: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # name -> qid -> nDCG@10
    texts: Mapping[str, str] = field(default_factory=dict)  # query id -> text
    grid_size: int | None = None  # configurations in the grid before it was shrunk to the queries

    def row(self, name: str) -> Row:
        return next(r for r in self.rows if r.name == name)

    def to_json(self) -> dict[str, Any]:
        sel = self.selection
        return {
            "index": self.index,
            "field": self.field,
            "queries": self.queries,
            "measure": PRIMARY,
            "configurations": [
                {
                    "name": r.name,
                    "ext_bmx": None if r.bmx is None else dict(r.bmx),
                    **{k: round(v, 6) for k, v in r.means.items()},
                    "vs_engine": asdict(r.vs_engine),
                    "fallbacks": r.fallbacks,
                }
                for r in self.rows
            ],
            "selection": {
                "chosen": sel.chosen,
                "best": sel.best,
                "chosen_ext_bmx": None
                if self.row(sel.chosen).bmx is None
                else dict(self.row(sel.chosen).bmx),
                "folds": self.folds,
                "fold_choices": list(sel.fold_choices),
                "significance": sel.significance,
                "cross_validated": round(sel.cv_score, 6),
                "engine": round(sel.engine_score, 6),
                "compared": len(self.rows),
                "grid": self.grid_size or len(self.rows),
                "gate": None if sel.gate is None else sel.gate.to_json(self.texts),
                "decision": None if sel.gate is None else sel.gate.reason,
            },
            "notes": self.notes,
            "per_query": {
                name: {q: round(v, 6) for q, v in values.items()} for name, values in self.per_query.items()
            },
        }


def table(report: Report) -> str:
    """The terminal view: one line per configuration, then the cross-validated choice."""
    names = list(MEASURES)
    width = max(len(r.name) for r in report.rows) + 2
    head = f"{'configuration':<{width}}" + "".join(f"{n:>9}" for n in names)
    head += f"{'Δ nDCG@10':>11}{'win/loss/tie':>15}{'p':>8}"
    lines = [
        f"{report.index} [{report.field}]: {report.queries} judged queries",
        head,
        "-" * len(head),
    ]
    base = report.row(report.engine).means[PRIMARY]
    sel = report.selection
    for r in report.rows:
        c = r.vs_engine
        mark = " *" if r.name == sel.chosen else ""
        line = f"{r.name:<{width}}" + "".join(f"{100 * r.means[n]:>9.2f}" for n in names)
        if r.name == report.engine:
            line += f"{'':>11}{'':>15}{'':>8}"
        else:
            wlt = f"{c.wins}/{c.losses}/{c.ties}"
            line += f"{100 * (r.means[PRIMARY] - base):>+11.2f}{wlt:>15}{c.p_value:>8.3f}"
        if r.fallbacks:
            line += f"  ({r.fallbacks} fell back)"
        lines.append(line + mark)
    lines.append("")
    gain = 100 * (sel.cv_score - sel.engine_score)
    lines.append(
        f"{report.folds}-fold cross-validated {PRIMARY} of picking the best: {100 * sel.cv_score:.2f} vs engine "
        f"{100 * sel.engine_score:.2f} ({gain:+.2f}); fold choices: {', '.join(sel.fold_choices)}"
    )
    if sel.gate is not None:
        lines.extend(gate_lines(sel.gate, report.texts, report.grid_size))
    elif sel.chosen == report.engine and sel.best != report.engine:
        lines.append(f"chosen (*): engine (the best on all queries, {sel.best}, does not beat it held out)")
    if sel.gate is None or sel.chosen != (sel.gate.best if sel.gate.apply else report.engine):
        lines.append(f"chosen (*): {sel.chosen}")
    lines.extend(report.notes)
    return "\n".join(lines)


def gate_lines(gate: Gate, texts: Mapping[str, str], grid_size: int | None = None) -> list[str]:
    """The evidence behind the decision, in words: the expected gain on new queries with its interval,
    the chance of a loss, how many more queries would settle it, the queries the best hurts most."""
    compared = f"{gate.compared} configurations compared"
    if grid_size and grid_size > gate.compared:
        compared = (
            f"{gate.compared} of {grid_size} configurations compared, fewer for {gate.queries} judged queries"
        )
    lines = [
        f"expected gain on new queries of choosing the best this way: {100 * gate.expected:+.2f} {PRIMARY}, "
        f"{interval_text(gate)} (nested cross-validation, bootstrap of the whole choice; {compared})",
        f"chance that applying loses: {100 * gate.p_loss:.0f} %"
        + (
            f"; about {gate.more_queries} more judged queries would settle it"
            if gate.more_queries
            else "; settled"
            if gate.more_queries == 0
            else ""
        ),
    ]
    if gate.best != "engine" and gate.hurt:
        lines.append(f"queries {gate.best} hurts most:")
        for qid, change in gate.hurt:
            text = texts.get(qid, "")
            text = text if len(text) <= 70 else text[:67] + "..."
            lines.append(f"  {qid:<12} {100 * change:+7.2f}  {text}")
    lines.append(f"decision (*): {gate.reason}")
    return lines


def plot(report: Report, path: str | Path) -> Path:
    """A bar chart of nDCG@10 per configuration, the engine's as a line, the chosen one highlighted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report.rows
    values = [100 * r.means[PRIMARY] for r in rows]
    colors = ["#d62728" if r.name == report.selection.chosen else "#1f77b4" for r in rows]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(rows) + 2.5))
    ax.barh([r.name for r in rows], values, color=colors)
    ax.axvline(100 * report.selection.engine_score, color="black", linestyle="--", label="engine BM25")
    ax.axvline(
        100 * report.selection.cv_score, color="#d62728", linestyle=":", label="held out, picking the best"
    )
    gate = report.selection.gate
    low = min(values + [100 * report.selection.cv_score])
    high = max(values)
    title = f"{report.index} [{report.field}], {report.queries} queries"
    if gate is not None:
        base = 100 * report.selection.engine_score
        span = (base + 100 * gate.low, base + 100 * gate.high)
        ax.axvspan(
            *span, color="#2ca02c", alpha=0.15, label=f"engine + gain on new queries, {interval_text(gate)}"
        )
        ax.axvline(base + 100 * gate.expected, color="#2ca02c", label="engine + expected gain")
        low, high = min(low, span[0]), max(high, span[1])
        verdict = f"applied {gate.best}" if report.selection.chosen != report.engine else "engine kept"
        title += f": {verdict} (chance of a loss {100 * gate.p_loss:.0f} %)"
    ax.invert_yaxis()
    ax.set_xlim(max(0.0, low - 3), high + 1)
    ax.set_xlabel(f"{PRIMARY} x 100")
    ax.set_title(title, fontsize="small")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, fontsize="small")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
