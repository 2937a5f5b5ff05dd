"""The report's figure: one PNG with four panels (task success, corrupt final states,
duplicate + leaked effects, steps relative to the fault-free run), each system as a bar
group per fault rate. On the steps panel the calls the AgentTx client re-sent by itself
are stacked, hatched, on top of the agent's steps, so both readings show.

matplotlib is an optional dependency (`pip install agenttx[bench]`, included in the dev
set-up); it is imported only when a plot is asked for, with the non-interactive Agg
backend, so the benchmark never needs a display.
"""

from __future__ import annotations

import pathlib
from typing import Any

from .report import TARGETS

_COLORS = {"agenttx": "#2b6cb0", "naive_retry": "#dd8452", "restart": "#8c8c8c"}
_PANELS = (
    ("success_rate", "tasks ending in exactly the correct state", "%", 100.0),
    ("corrupt", "corrupt final states (tasks)", "tasks", 1.0),
    ("effects", "duplicate + leaked effects", "effects", 1.0),
    ("steps_ratio", "agent steps vs the fault-free run (hatched: client re-sends)", "x", 1.0),
)


def plot(report: dict[str, Any], path: str | pathlib.Path) -> None:
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError("--plot needs matplotlib: pip install 'agenttx[bench]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    ps = report["p"]
    systems = list(dict.fromkeys(r["system"] for r in results))
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    width = 0.8 / max(1, len(systems))
    for ax, (key, title, unit, scale) in zip(axes.flat, _PANELS, strict=True):
        for k, system in enumerate(systems):
            values = []
            for p in ps:
                row = next(r for r in results if r["system"] == system and r["p"] == p)
                v = row["duplicate_effects"] + row["leaked_effects"] if key == "effects" \
                    else row[key]
                values.append(v * scale)
            xs = [i + (k - (len(systems) - 1) / 2) * width for i in range(len(ps))]
            bars = ax.bar(xs, values, width, label=system, color=_COLORS.get(system))
            ax.bar_label(bars, fmt="%.0f" if key != "steps_ratio" else "%.2f", fontsize=7,
                         label_type="edge" if key != "steps_ratio" else "center")
            if key == "steps_ratio":
                extra = [next(r for r in results if r["system"] == system and r["p"] == p)
                         .get("steps_ratio_with_resent", v) - v for p, v in zip(ps, values,
                                                                               strict=True)]
                if any(e > 0 for e in extra):
                    ax.bar(xs, extra, width, bottom=values, color=_COLORS.get(system),
                           alpha=0.35, hatch="//", edgecolor="white")
        if key == "success_rate":
            ax.axhline(100 * TARGETS["success_rate_min"], color="#2b6cb0", ls=":", lw=1)
        if key == "steps_ratio":
            ax.axhline(TARGETS["steps_ratio_max"], color="#2b6cb0", ls=":", lw=1)
        ax.set_title(title, fontsize=10)
        ax.set_xticks(range(len(ps)), [f"p = {p:g}" for p in ps])
        ax.set_ylabel(unit)
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(systems), fontsize=9,
               bbox_to_anchor=(0.5, 0.955), frameon=False)
    fig.suptitle(f"Agent outcomes under per-call faults: {report['tasks']} tasks, "
                 f"seed {report['seed']} (dotted: AgentTx targets at p = 0.3)", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=110)
    plt.close(fig)
