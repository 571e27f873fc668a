#!/usr/bin/env python3
"""Draws docs/performance/*.png from hexeract-bench's output.

    python3 scripts/plot-performance.py docs/performance/bench.txt docs/performance

Reads the `scenario=<name> key=value … [# comment]` lines the bench prints (`--quick` and
`--scenario sweeps`) and draws:

- throughput.png: every throughput scenario, Hexeract beside its raw baseline (msgs/s, log
  scale), the ratio written over each pair;
- peers.png: Hexeract beside each peer framework or client, on the work both do;
- latency.png: commit→handler latency (p50, p99, max) of each end-to-end pipeline at half and
  nine tenths of its raw pipeline's throughput (a row per pipeline, a panel per load), Hexeract
  beside the raw pipeline;
- sweeps.png: outbox drain as handlers per type grow (1, 4, 16) and as payloads grow (200 B,
  2 KiB, 64 KiB), Hexeract beside the raw loop running the same statements.

Needs matplotlib (`pip install matplotlib`); `scripts/performance` installs it when missing.
"""

import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HEX = "#3b6ea8"
BASE = "#b0b0b0"


def parse(paths):
    """{scenario: {key: value}} from every `scenario=` line; later lines add keys."""
    scenarios = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if not line.startswith("scenario="):
                continue
            line = line.split(" # ", 1)[0]
            fields = dict(
                match.groups() for match in re.finditer(r"(\w+)=(\S+)", line)
            )
            name = fields.pop("scenario")
            scenarios.setdefault(name, {}).update(fields)
    return scenarios


def number(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def throughput_pairs(scenarios, wanted):
    rows = []
    for name, fields in scenarios.items():
        if not wanted(name):
            continue
        hexeract, baseline = number(fields.get("hexeract")), number(fields.get("baseline"))
        if hexeract and baseline:
            # The line's ratio (the median of its pairs' ratios) where it has one, as printed;
            # the ratio of the median rates can differ from it.
            ratio = number(fields.get("ratio")) or hexeract / baseline
            rows.append((name, hexeract, baseline, ratio))
    return rows


def bars(rows, title, baseline_label, out):
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(rows) + 1.6))
    positions = range(len(rows))
    ax.barh([p + 0.2 for p in positions], [r[1] for r in rows], 0.4, color=HEX, label="Hexeract")
    ax.barh([p - 0.2 for p in positions], [r[2] for r in rows], 0.4, color=BASE, label=baseline_label)
    for p, row in zip(positions, rows):
        ax.text(max(row[1], row[2]) * 1.08, p, f"{row[3]:.2f}×", va="center", fontsize=8)
    ax.set_yticks(list(positions))
    ax.set_yticklabels([r[0] for r in rows], fontsize=8)
    ax.set_xscale("log")
    ax.set_xlim(right=max(max(r[1], r[2]) for r in rows) * 3)
    ax.set_xlabel("messages per second (log scale); ratio Hexeract / other at the right")
    ax.set_title(title)
    ax.invert_yaxis()
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def latency(lines, out):
    """One row per pipeline, one panel per offered load: p50, p99 and max of each side."""
    pipelines = sorted({key.split("@")[0] for key in lines})
    loads = sorted({key.split("@")[1] for key in lines})
    if not pipelines:
        return
    fig, axes = plt.subplots(
        len(pipelines), len(loads), figsize=(4.5 * len(loads), 2.8 * len(pipelines)), squeeze=False
    )
    quantiles = ["p50", "p99", "max"]
    positions = range(len(quantiles))
    for row, pipeline in enumerate(pipelines):
        for col, load in enumerate(loads):
            ax = axes[row][col]
            fields = lines.get(f"{pipeline}@{load}")
            if not fields:
                ax.set_visible(False)
                continue
            hexeract = [number(fields.get(f"hexeract_{q}_ms")) or 0 for q in quantiles]
            baseline = [number(fields.get(f"baseline_{q}_ms")) or 0 for q in quantiles]
            ax.bar([p - 0.2 for p in positions], hexeract, 0.4, color=HEX, label="Hexeract")
            ax.bar([p + 0.2 for p in positions], baseline, 0.4, color=BASE, label="raw pipeline")
            for p, value in zip(positions, hexeract):
                ax.text(p - 0.2, value, f"{value:.1f}", ha="center", va="bottom", fontsize=7)
            ax.set_xticks(list(positions))
            ax.set_xticklabels(quantiles)
            ax.set_ylabel("ms")
            name = pipeline.replace("_latency", "")
            ax.set_title(f"{name}, load {load} ({fields.get('offered')} msg/s)", fontsize=9)
            ax.legend(fontsize=7)
    fig.suptitle("commit → handler latency at fixed offered loads")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def sweeps(scenarios, out):
    handlers = [(int(n), scenarios.get(f"outbox_drain_handlers{n}")) for n in (1, 4, 16)]
    payloads = [(200, scenarios.get("outbox_drain_handlers1"))] + [
        (n, scenarios.get(f"outbox_drain_payload{n}")) for n in (2048, 65536)
    ]
    if not any(fields for _, fields in handlers + payloads):
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for ax, points, label in (
        (left, handlers, "handlers per message type"),
        (right, payloads, "payload bytes"),
    ):
        points = [(x, f) for x, f in points if f]
        xs = list(range(len(points)))
        ax.plot(xs, [number(f["hexeract"]) for _, f in points], "o-", color=HEX, label="Hexeract")
        ax.plot(xs, [number(f["baseline"]) for _, f in points], "s--", color="#777", label="raw take + ack")
        for x, (_, f) in zip(xs, points):
            ax.annotate(f"{number(f['ratio']):.2f}×", (x, number(f["hexeract"])), textcoords="offset points", xytext=(0, 8), fontsize=8, ha="center")
        ax.set_xticks(xs)
        ax.set_xticklabels([str(x) for x, _ in points])
        ax.set_xlabel(label)
        ax.set_ylabel("handler calls per second")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.suptitle("outbox drain on PostgreSQL, batch 100")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def latency_from_lines(paths):
    """{`<scenario>_latency@<load>`: fields}, one entry per line."""
    found = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if not line.startswith("scenario=") or "_latency " not in line + " ":
                continue
            fields = dict(m.groups() for m in re.finditer(r"(\w+)=(\S+)", line.split(" # ", 1)[0]))
            if "load" not in fields:
                continue
            found[f"{fields['scenario']}@{fields['load']}"] = fields
    return found


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: plot-performance.py BENCH_OUTPUT… OUT_DIR")
    *inputs, out_dir = sys.argv[1:]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    scenarios = parse(inputs)
    own = throughput_pairs(
        scenarios,
        lambda name: not name.startswith(("peer_", "outbox_drain_handlers", "outbox_drain_payload")),
    )
    bars(own, "Hexeract against a raw baseline doing the same work, same run", "raw baseline", out / "throughput.png")
    peers = throughput_pairs(scenarios, lambda name: name.startswith("peer_"))
    bars(peers, "Hexeract against peer libraries on the work both do, same run", "peer", out / "peers.png")
    latency(latency_from_lines(inputs), out / "latency.png")
    sweeps(scenarios, out / "sweeps.png")
    for png in sorted(out.glob("*.png")):
        print(png)


if __name__ == "__main__":
    main()
