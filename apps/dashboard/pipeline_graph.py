"""A pipeline's DAG laid out for the dashboard (an SVG drawn by `_pipeline_graph.html`, no script): stages in
columns by their longest distance from the entry, in rows by first appearance along the paths, edges from
each stage to the next on any path. With a plan's pipeline summary each stage shows its variant, batch,
replicas and latency budget, and each path its planned and predicted end-to-end latency against its SLO;
with live traffic, each path's p99 and violations over the last minute as the routers measured them."""
from __future__ import annotations

from typing import Any

NODE_W, NODE_H = 190, 70
COL_GAP, ROW_GAP, MARGIN = 60, 24, 12
__all__ = ["pipeline_graph"]


def _pct(ratio: float | None) -> str:
    return "—" if ratio is None else f"{ratio:.1%}"


def pipeline_graph(*, name: str, stages: list[str], paths: list[dict[str, Any]], summary: dict[str, Any] | None = None,
                   prediction: dict[str, Any] | None = None, pinned: dict[str, str] | None = None,
                   live: dict[str, dict[str, Any] | None] | None = None) -> dict[str, Any]:
    edges = sorted({(q["stages"][i], q["stages"][i + 1]) for q in paths for i in range(len(q["stages"]) - 1)})
    depth = {s: 0 for s in stages}
    for _ in stages:  # longest path from the entry; a DAG settles within len(stages) rounds
        for u, v in edges:
            depth[v] = max(depth[v], depth.get(u, 0) + 1)
    order = list(dict.fromkeys([s for q in paths for s in q["stages"]] + list(stages)))
    rows: dict[int, int] = {}
    position: dict[str, tuple[int, int]] = {}
    for s in order:
        col = depth.get(s, 0)
        position[s] = (col, rows.get(col, 0))
        rows[col] = rows.get(col, 0) + 1
    planned = (summary or {}).get("stages", {})
    nodes = []
    for s in order:
        col, row = position[s]
        info = planned.get(s)
        if info:
            lines = [f"{info['variant'].split('/', 1)[-1]} · batch {info['batch']}",
                     f"{info['replicas_placed']}/{info['replicas']} × {info['cores_per_replica']} core{'s' if info['cores_per_replica'] != 1 else ''}"
                     f" · {info['budget_ms']:.0f} ms"]
        else:
            lines = [f"pinned: {pinned[s]}" if pinned and pinned.get(s) else "variant: planner's choice"]
        short = info is not None and info["replicas_placed"] < info["replicas"]
        nodes.append({"name": s, "x": MARGIN + col * (NODE_W + COL_GAP), "y": MARGIN + row * (NODE_H + ROW_GAP), "lines": lines,
                      "short": short, "entry": s == (paths[0]["stages"][0] if paths else None)})
    at = {n["name"]: n for n in nodes}
    lines_out = [{"x1": at[u]["x"] + NODE_W, "y1": at[u]["y"] + NODE_H / 2, "x2": at[v]["x"], "y2": at[v]["y"] + NODE_H / 2}
                 for u, v in edges if u in at and v in at]
    planned_paths = (summary or {}).get("paths", {})
    predicted_paths = (prediction or {}).get("paths", {})
    path_rows = []
    for q in paths:
        planned_ms = (planned_paths.get(q["name"]) or {}).get("latency_ms")
        seen = predicted_paths.get(q["name"]) or {}
        path_rows.append({
            "name": q["name"], "route": " → ".join(q["stages"]), "slo_ms": q["slo_ms"], "demand_rps": q["demand_rps"],
            "planned_ms": planned_ms, "within": planned_ms is not None and planned_ms <= q["slo_ms"],
            "predicted_p99_ms": seen.get("latency_p99_ms"), "predicted_violation": seen.get("slo_violation_ratio"),
            "live": (live or {}).get(q["name"]),
            "live_violation": _pct(((live or {}).get(q["name"]) or {}).get("violation_ratio")),
            "predicted_violation_text": _pct(seen.get("slo_violation_ratio")),
            "live_within": bool((live or {}).get(q["name"]) and (live or {})[q["name"]]["p99_ms"] is not None
                                and (live or {})[q["name"]]["p99_ms"] <= q["slo_ms"]),
        })
    width = MARGIN * 2 + (max(depth.values(), default=0) + 1) * (NODE_W + COL_GAP) - COL_GAP
    height = MARGIN * 2 + max(rows.values(), default=1) * (NODE_H + ROW_GAP) - ROW_GAP
    return {"name": name, "nodes": nodes, "edges": lines_out, "paths": path_rows, "width": width, "height": height,
            "node_w": NODE_W, "node_h": NODE_H, "summary": summary, "live": live is not None}
