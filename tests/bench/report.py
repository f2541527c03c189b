"""Figures collected per scenario and operator, and the one table: medians and ratios."""

from __future__ import annotations

import argparse
import statistics
from collections import Counter

Value = float | str

# (scenario, figure key) -> row label; {w} {d} {s} {S} are filled from the sizes.
ROWS: list[tuple[str, str, str]] = [
    ("start", "start", "apply -> {w} workers Running, s"),
    ("fail", "fail", "worker exits 137 -> {w} Running again, s"),
    ("fail", "fail_failed", "worker exits 137 -> job Failed instead, s"),
    ("delete", "delete", "1 of {d} pods deleted -> Running again, s"),
    ("delete", "delete_failed", "1 of {d} pods deleted -> job Failed instead, s"),
    ("steady", "all_running", "{s}: apply -> all Running, s"),
    ("steady", "req_user", "{s} steady: operator requests/s (API server, its user)"),
    ("steady", "req_self", "{s} steady: operator requests/s (its own counter)"),
    ("steady", "req_apiserver", "{s} steady: API server requests/s above baseline"),
    ("steady", "cpu", "{s} steady: operator CPU %"),
    ("steady", "rss", "{s} steady: operator RSS MB"),
    ("steady", "baseline", "{s}: baseline API server requests/s (no operator)"),
    ("scale", "all_running", "{S}: apply -> all Running, s"),
    ("scale", "req_user", "{S} steady: operator requests/s (API server, its user)"),
    ("scale", "req_self", "{S} steady: operator requests/s (its own counter)"),
    ("scale", "req_apiserver", "{S} steady: API server requests/s above baseline"),
    ("scale", "cpu", "{S} steady: operator CPU %"),
    ("scale", "rss", "{S} steady: operator RSS MB"),
    ("scale", "restart_back", "{S} restart: failed canaries Running again, s"),
    ("scale", "restart_wrong", "{S} restart: other pods created/deleted"),
    ("scale", "restart_not_running", "{S} restart: other jobs not Running at 60 s"),
    ("scale", "baseline", "{S}: baseline API server requests/s (no operator)"),
]


class Results:
    def __init__(self) -> None:
        self.values: dict[tuple[str, str, str], list[Value]] = {}

    def add(self, scenario: str, contender: str, figures: dict[str, Value]) -> None:
        for key, value in figures.items():
            self.values.setdefault((scenario, key, contender), []).append(value)


def median(values: list[Value]) -> Value | None:
    """The median when every value is a number, else the most common text with its count."""
    if not values:
        return None
    numbers = [v for v in values if isinstance(v, float | int)]
    if len(numbers) == len(values):
        return float(statistics.median(numbers))
    text, n = Counter(str(v) if not isinstance(v, str) else v for v in values).most_common(1)[0]
    return f"{text} ({n}/{len(values)})" if len(values) > 1 else text


def fmt(v: Value | None) -> str:
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    return f"{v:.2f}" if abs(v) < 100 else f"{v:.0f}"


def ratio(a: Value | None, b: Value | None) -> str:
    if not isinstance(a, float) or not isinstance(b, float):
        return ""
    if abs(b) < 1e-9:
        return "" if abs(a) < 1e-9 else "inf"
    return f"{a / b:.2f}x"


def table(results: Results, args: argparse.Namespace, names: list[str]) -> str:
    sizes = {"w": args.workers, "d": args.delete_workers,
             "s": "{}x{}".format(*args.steady), "S": "{}x{}".format(*args.scale)}
    head = ["figure (medians)", *names, f"{names[0]}/{names[-1]}" if len(names) > 1 else "",
            "reps"]
    rows = [head]
    for scenario, key, label in ROWS + [(s, "error", f"{s}: error") for s in
                                        ("start", "fail", "delete", "steady", "scale")]:
        cells = [results.values.get((scenario, key, n), []) for n in names]
        if not any(cells):
            continue
        medians = [median(c) for c in cells]
        rows.append([label.format(**sizes), *map(fmt, medians),
                     ratio(medians[0], medians[-1]) if len(names) > 1 else "",
                     "/".join(str(len(c)) for c in cells)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [" | ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def brief(figures: dict[str, Value]) -> str:
    return ", ".join(f"{k} {fmt(v)}" for k, v in figures.items())
