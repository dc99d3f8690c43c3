"""A picture of a plan (`cpullm plan --svg FILE`): one node of the chosen shape, its NUMA nodes side by side, the
CPUs each rank (or, with throughput placement, each server) takes there, the cores kept for the HTTP front end,
and how each NUMA node's memory splits into the weight shard, the KV cache, the runtime and what is left."""

from __future__ import annotations

import textwrap
from html import escape

from cpullm.api.plan import Plan
from cpullm.api.spec import Placement
from cpullm.core.constants import GiB

WIDTH, MARGIN, CELL, GAP = 760, 16, 12, 2
COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#edc948", "#76b7b2", "#e15759", "#9c755f")
# Apart from COLOURS: a rank is told from what its memory holds.
MEMORY = (("weights", "#1f3b63"), ("KV cache", "#2e7d32"), ("runtime", "#b8860b"), ("free", "#e0e0e0"))
CELLS_SHOWN = 128  # per NUMA node: a bigger node is drawn at 128 and says how many it has
CHAR = 6.4  # the width of one character at 11px, roughly: for wrapping and the legend


def _lines(text: str, width: float) -> list[str]:
    return textwrap.wrap(text, max(10, int(width / CHAR)))


def _text(x: float, y: float, text: str, size: int = 12, weight: str = "normal") -> str:
    return f'<text x="{x:.0f}" y="{y:.0f}" font-size="{size}" font-weight="{weight}">{escape(text)}</text>'


def _rect(x: float, y: float, w: float, h: float, fill: str, stroke: str = "none") -> str:
    return f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{fill}" stroke="{stroke}"/>'


def _owners(plan: Plan) -> list[str | None]:
    """Who runs on each NUMA node of one node: a rank of the pod, a throughput server, or nothing. Ranks are drawn
    where the plan knows their NUMA node (Plan.rank_numa_nodes); else the kubelet's cpuset decides which NUMA nodes
    the ranks get, and the picture says so."""
    numa = plan.node_profile.numa_nodes
    if plan.placement == Placement.THROUGHPUT:
        per_node = max(1, plan.capacity // max(1, len(plan.eligible_nodes)))
        return [f"server {i}" if i < per_node else None for i in range(numa)]
    known, ranks = plan.rank_numa_nodes(), plan.tensor_parallel_size
    if known is None:  # as many NUMA nodes drawn in use as there are ranks; which ones is the kubelet's choice
        return ["a rank (which NUMA node: the kubelet's cpuset)" if i < ranks else None for i in range(numa)]
    return [f"rank {known.index(i)}" if i in known else None for i in range(numa)]


def plan_svg(plan: Plan) -> str:
    node = plan.node_profile
    numa = node.numa_nodes
    owners = _owners(plan)
    column = (WIDTH - 2 * MARGIN - (numa - 1) * 8) / numa
    per_row = max(1, int((column - 16) // (CELL + GAP)))
    numa_cpus = node.cpus // numa
    shown = min(numa_cpus, CELLS_SHOWN)
    grid_height = -(-shown // per_row) * (CELL + GAP)
    numa_memory = node.memory_bytes / numa
    per_rank = (plan.weight_shard_bytes, plan.kv_cache_gi_b * GiB, plan.rank_extra_bytes)
    captions = []
    for owner in owners:
        used = per_rank if owner else (0, 0, 0)
        amounts = [*used, max(0.0, numa_memory - sum(used))]
        named = ", ".join(f"{name} {a / GiB:.1f}" for a, (name, _) in zip(amounts, MEMORY, strict=True) if a)
        captions.append((amounts, _lines(f"{numa_memory / GiB:.1f} GiB: {named}", column - 16)))
    caption_lines = max(len(lines) for _, lines in captions)
    note = _lines(f"note: {plan.placement_note}", WIDTH - 2 * MARGIN) if plan.placement_note else []
    top = 64
    box_height = 36 + grid_height + 46 + 14 * caption_lines
    height = top + box_height + 58 + 14 * len(note)
    parts = [
        _text(
            MARGIN,
            22,
            f"{plan.placement}, TP {plan.tensor_parallel_size}: {plan.replicas} pod(s) of "
            f"{plan.cpu} CPU and {plan.memory_limit_bytes / GiB:.1f} GiB",
            15,
            "bold",
        ),
        _text(
            MARGIN,
            42,
            f"one of {len(plan.eligible_nodes)} node(s) like {plan.eligible_nodes[0]}: {node.arch}, "
            f"{numa} NUMA node(s), {node.cpus} CPUs, {node.memory_bytes / GiB:.1f} GiB",
        ),
    ]
    for index, (owner, (amounts, lines)) in enumerate(zip(owners, captions, strict=True)):
        x = MARGIN + index * (column + 8)
        colour = COLOURS[index % len(COLOURS)] if owner else "#bbbbbb"
        parts.append(_rect(x, top, column, box_height, "#fafafa", "#999999"))
        parts.append(_text(x + 8, top + 18, f"NUMA node {index}: {owner or 'not used'}", 12, "bold"))
        taken = plan.cpus_per_rank if owner else 0
        reserved = plan.reserved_cpus_per_rank if owner else 0
        for cpu in range(shown):
            fill = "#dddddd"
            if cpu < taken:
                fill = "#333333" if cpu < reserved else colour
            row, col = divmod(cpu, per_row)
            parts.append(_rect(x + 8 + col * (CELL + GAP), top + 28 + row * (CELL + GAP), CELL, CELL, fill))
        more = f" (of {numa_cpus}, {shown} drawn)" if shown < numa_cpus else ""
        bar_y = top + 36 + grid_height
        parts.append(_text(x + 8, bar_y + 4, f"{taken} CPUs, {reserved} for the front end{more}", 11))
        offset = 0.0
        for amount, (_, fill) in zip(amounts, MEMORY, strict=True):
            width = (column - 16) * min(amount, numa_memory) / numa_memory if numa_memory else 0
            parts.append(_rect(x + 8 + offset, bar_y + 12, width, 18, fill))
            offset += width
        parts += [_text(x + 8, bar_y + 46 + 14 * i, line, 11) for i, line in enumerate(lines)]
    legend_y = top + box_height + 24
    cpus = [("CPUs of a rank or server", COLOURS[0]), ("the front end's", "#333333"), ("unused", "#dddddd")]
    for row, entries in enumerate((cpus, [(f"{name} (memory)", fill) for name, fill in MEMORY])):
        x, y = MARGIN, legend_y + 18 * row
        for label, fill in entries:
            parts += [_rect(x, y - 10, 10, 10, fill), _text(x + 14, y, label, 11)]
            x += 24 + CHAR * len(label)
    legend_y += 18
    parts += [_text(MARGIN, legend_y + 22 + 14 * i, line, 11) for i, line in enumerate(note)]
    body = "\n".join(parts)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'font-family="sans-serif">\n{_rect(0, 0, WIDTH, height, "white")}\n{body}\n</svg>\n'
    )
