#!/usr/bin/env python3
"""Plot recall_any@k and recall_all@k against k, ours against BM25, from `perpetuity eval --json`.

Usage:
    perpetuity eval --format locomo ../shared/data/locomo/locomo10.json --json > /tmp/eval.json
    python3 tools/plot_eval.py /tmp/eval.json --out docs/eval_locomo.svg

Python 3 standard library only: the SVG is written by hand. The file is written to a temporary
name beside the output, flushed to disk, then renamed over it.
"""

import argparse
import json
import os
import sys
from xml.sax.saxutils import escape

WIDTH, HEIGHT = 720, 440
LEFT, RIGHT, TOP, BOTTOM = 70, 200, 50, 60
# (metric, system key in the report, label, colour, dash pattern)
SERIES = [
    ("recall_any", "overall", "recall_any@k, ours", "#1f5fa8", ""),
    ("recall_any", "bm25", "recall_any@k, BM25", "#1f5fa8", "6 4"),
    ("recall_all", "overall", "recall_all@k, ours", "#c0392b", ""),
    ("recall_all", "bm25", "recall_all@k, BM25", "#c0392b", "6 4"),
]


def plot(report, level):
    ks = report["ks"]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    k_min, k_max = min(ks), max(ks)

    def x(k):
        span = k_max - k_min
        return LEFT + (plot_w * (k - k_min) / span if span else plot_w / 2)

    def y(value):
        return TOP + plot_h * (1.0 - value)

    questions = report["overall"][level]["questions"]
    title = f"{report['dataset']}: {level}-level recall against k ({questions} questions)"
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="24" text-anchor="middle" font-size="15">{escape(title)}</text>',
    ]
    for tick in range(0, 11, 2):
        value = tick / 10
        out.append(
            f'<line x1="{LEFT}" y1="{y(value):.1f}" x2="{LEFT + plot_w}" y2="{y(value):.1f}" '
            f'stroke="#dddddd"/>'
        )
        out.append(
            f'<text x="{LEFT - 8}" y="{y(value) + 4:.1f}" text-anchor="end">{value:.1f}</text>'
        )
    for k in ks:
        out.append(
            f'<line x1="{x(k):.1f}" y1="{TOP + plot_h}" x2="{x(k):.1f}" y2="{TOP + plot_h + 5}" '
            f'stroke="black"/>'
        )
        out.append(f'<text x="{x(k):.1f}" y="{TOP + plot_h + 20}" text-anchor="middle">{k}</text>')
    out.append(
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="black"/>'
    )
    out.append(
        f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 15}" text-anchor="middle">k (turns retrieved)</text>'
    )
    out.append(
        f'<text x="18" y="{TOP + plot_h / 2}" text-anchor="middle" '
        f'transform="rotate(-90 18 {TOP + plot_h / 2})">share of questions</text>'
    )
    for i, (metric, system, label, colour, dash) in enumerate(SERIES):
        values = [report[system][level][f"{metric}@{k}"] for k in ks]
        points = " ".join(f"{x(k):.1f},{y(v):.1f}" for k, v in zip(ks, values))
        dashes = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(
            f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"{dashes}/>'
        )
        for k, v in zip(ks, values):
            out.append(f'<circle cx="{x(k):.1f}" cy="{y(v):.1f}" r="3" fill="{colour}"/>')
        legend_y = TOP + 10 + 22 * i
        legend_x = LEFT + plot_w + 15
        out.append(
            f'<line x1="{legend_x}" y1="{legend_y}" x2="{legend_x + 30}" y2="{legend_y}" '
            f'stroke="{colour}" stroke-width="2"{dashes}/>'
        )
        out.append(f'<text x="{legend_x + 38}" y="{legend_y + 4}">{escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_atomically(path, text):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", help="the JSON printed by `perpetuity eval --json` (- for stdin)")
    parser.add_argument("--out", default="docs/eval_locomo.svg", help="SVG file to write")
    parser.add_argument("--level", choices=["turn", "session"], default="turn")
    args = parser.parse_args()
    if args.report == "-":
        report = json.load(sys.stdin)
    else:
        with open(args.report, encoding="utf-8") as f:
            report = json.load(f)
    write_atomically(args.out, plot(report, args.level))


if __name__ == "__main__":
    main()
