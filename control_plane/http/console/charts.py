"""Charts of the workspace's runs, per UTC hour, from the database: started, finished by how
they ended, p50/p95 duration, tokens and cost; all agents or one.

Drawn on the server as inline SVG (rect and polyline elements with presentation
attributes, no script, no style attribute): nothing to vendor, nothing loaded from
anywhere, and the Content-Security-Policy stays as strict as every other page's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from control_plane.auth import context as auth_context
from control_plane.ground import validate
from control_plane.ground.errors import InvalidArgument
from control_plane.http.console.web import Console, render
from control_plane.store import console as store

WINDOWS = {"24h": 24, "48h": 48, "7d": 168}
BAR = 10  # SVG units per hour


@dataclass
class Series:
    name: str
    unit: str
    values: list[float]
    kind: str = "bar"  # bar | line
    css: str = ""

    @property
    def top(self) -> float:
        return max(self.values, default=0) or 1


@dataclass
class Chart:
    title: str
    series: list[Series]
    hours: list[datetime] = field(default_factory=list)

    @property
    def width(self) -> int:
        return max(len(self.hours), 1) * BAR

    @property
    def top(self) -> float:
        return max(s.top for s in self.series)

    def bars(self, s: Series, slot: int, slots: int) -> list[dict[str, Any]]:
        """One rect per hour, side by side with the chart's other bar series."""
        w = BAR / slots
        return [
            {
                "x": round(i * BAR + slot * w + 0.5, 2),
                "y": round(100 - 100 * v / self.top, 2),
                "w": round(w - 1, 2),
                "h": round(100 * v / self.top, 2),
                "v": v,
                "at": self.hours[i],
            }
            for i, v in enumerate(s.values)
        ]

    def points(self, s: Series) -> str:
        return " ".join(
            f"{i * BAR + BAR / 2:g},{100 - 100 * v / self.top:.2f}" for i, v in enumerate(s.values)
        )


def _window(value: str) -> int:
    if not value:
        return WINDOWS["24h"]
    if value not in WINDOWS:
        raise InvalidArgument("window", f"must be one of {', '.join(WINDOWS)}")
    return WINDOWS[value]


def charts_of(
    hours: list[datetime], started: list[dict[str, Any]], finished: list[dict[str, Any]]
) -> list[Chart]:
    s = {r["at"]: r for r in started}
    f = {r["at"]: r for r in finished}

    def col(rows: dict[datetime, dict[str, Any]], key: str, scale: float = 1) -> list[float]:
        return [float(rows[h][key] or 0) / scale if h in rows else 0.0 for h in hours]

    return [
        Chart(
            "Runs started, completed, failed",
            [
                Series("started", "runs", col(s, "started"), css="started"),
                Series("completed", "runs", col(f, "completed"), css="completed"),
                Series("failed", "runs", col(f, "failed"), css="failed"),
            ],
            hours,
        ),
        Chart(
            "Duration of finished runs (p50, p95)",
            [
                Series("p50", "s", col(f, "p50"), "line", "p50"),
                Series("p95", "s", col(f, "p95"), "line", "p95"),
            ],
            hours,
        ),
        Chart(
            "Tokens (in + out)", [Series("tokens", "tokens", col(f, "tokens"), css="tokens")], hours
        ),
        Chart(
            "Cost",
            [Series("cost", "$", col(f, "cost_micros", 1_000_000), css="cost")],
            hours,
        ),
    ]


class ChartPages:
    def __init__(self, console: Console) -> None:
        self.c = console

    async def charts(self, request: Request) -> Response:
        q = request.query_params
        agent = validate.slug("agent", q["agent"]) if q.get("agent") else None
        span = _window(q.get("window", ""))
        now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
        hours = [now - timedelta(hours=span - 1 - i) for i in range(span)]
        ws = auth_context.workspace("")
        started, finished = await store.chart_rows(self.c.pool, ws, agent, hours[0])
        by_agent = [] if agent else await store.chart_by_agent(self.c.pool, ws, hours[0])
        return render(
            request,
            "charts.html",
            by_agent=by_agent,
            charts=charts_of(hours, started, finished),
            hours=hours,
            agent=agent or "",
            window=q.get("window", "") or "24h",
            windows=list(WINDOWS),
            totals={
                "started": sum(int(r["started"]) for r in started),
                "completed": sum(int(r["completed"]) for r in finished),
                "failed": sum(int(r["failed"]) for r in finished),
                "tokens": sum(int(r["tokens"] or 0) for r in finished),
                "cost_micros": sum(int(r["cost_micros"] or 0) for r in finished),
            },
        )
