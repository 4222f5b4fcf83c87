#!/usr/bin/env python3
"""Checks a rendered plan report (the DOM headless Chromium dumped after the page's script ran, and
its screenshot) against piper-check --emit sim-json of the same plan.

    report_check.py DOM.html SIM.json SCREENSHOT.png

Exits 1, naming what differs, when the page did not render, shows other numbers than the
simulation, or the screenshot shows no timeline."""
import json
import struct
import sys
import zlib
from html.parser import HTMLParser


class Dom(HTMLParser):
    """The elements the checks read: their tag, attributes and text."""

    def __init__(self):
        super().__init__()
        self.elements, self.stack = [], []

    def handle_starttag(self, tag, attrs):
        e = {"tag": tag, "attrs": dict(attrs), "text": "", "parent": self.stack[-1] if self.stack else None}
        self.elements.append(e)
        if tag not in ("br", "meta", "img", "input", "link"):
            self.stack.append(e)

    def handle_endtag(self, tag):
        while self.stack:
            if self.stack.pop()["tag"] == tag:
                break

    def handle_data(self, data):
        for e in self.stack:
            e["text"] += data


def rank_list(text):
    """'0-3,8' -> [0, 1, 2, 3, 8] (ir::rank_list's format)."""
    out = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += range(int(a), int(b or a) + 1)
    return out


def union_length(intervals):
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a >= end:
            total += b - a
        elif b > end:
            total += b - end
        end = b if end is None else max(end, b)
    return total


def png_pixels(path):
    """(width, height, rows of RGB tuples) of an 8-bit RGB/RGBA PNG, as Chromium writes them."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path} is not a PNG")
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color = header[:4]
    if depth != 8 or color not in (2, 6):
        raise ValueError(f"{path}: PNG of depth {depth}, color type {color} not handled")
    bpp = 3 if color == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1: line[i] = (line[i] + a) & 255
            elif f == 2: line[i] = (line[i] + b) & 255
            elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[i:i + 3]) for i in range(0, stride, bpp)])
        prev = line
    return width, height, rows


def close(a, b, rel=1e-9):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-30)


def main():
    dom_path, sim_path, shot_path = sys.argv[1:4]
    dom = Dom()
    dom.feed(open(dom_path).read())
    sim = json.load(open(sim_path))
    problems = []
    body = next(e for e in dom.elements if e["tag"] == "body")
    errors = next(e for e in dom.elements if e["attrs"].get("id") == "errors")
    if body["attrs"].get("data-rendered") != "ok" or errors["text"].strip():
        problems.append(f"the page did not render: data-rendered={body['attrs'].get('data-rendered')!r}, "
                        f"errors: {errors['text'].strip()!r}")
    cards = {e["attrs"]["data-key"]: float(e["attrs"]["data-value"]) for e in dom.elements if "data-key" in e["attrs"]}
    for key in ("step_time", "eval_step_time"):
        if key not in cards or not close(cards[key], sim[key]):
            problems.append(f"{key}: the page shows {cards.get(key)}, sim-json {sim[key]}")
    rows = [e for e in dom.elements if e["tag"] == "tr" and "mem-row" in e["attrs"].get("class", "")]
    seen, covered = [], []
    for i, row in enumerate(rows):
        a, shown = row["attrs"], int(row["attrs"]["data-rank"])
        cells = [e for e in dom.elements if e["parent"] is row]
        ranks = rank_list(cells[0]["text"])
        covered += ranks
        r = sim["ranks"][shown]
        if shown not in ranks or r["peak_bytes"] != max(sim["ranks"][x]["peak_bytes"] for x in ranks):
            problems.append(f"program {i} (ranks {cells[0]['text']}): rank {shown} shown, not its fullest rank")
        if int(a["data-peak"]) != r["peak_bytes"]:
            problems.append(f"rank {shown}: peak {a['data-peak']} on the page, {r['peak_bytes']} in sim-json")
        for key in ("busy", "idle"):
            if not close(float(a["data-" + key]), r[key]):
                problems.append(f"rank {shown}: {key} {a['data-' + key]} on the page, {r[key]} in sim-json")
        for cell in cells:
            cat = cell["attrs"].get("data-category")
            if cat and int(cell["attrs"]["data-bytes"]) != r["by_category"][cat]:
                problems.append(f"rank {shown}: {cat} {cell['attrs']['data-bytes']} on the page, {r['by_category'][cat]} in sim-json")
        seen.append((i, shown))
    if sorted(covered) != list(range(len(sim["ranks"]))):
        problems.append(f"the memory table's programs cover ranks {sorted(covered)}, sim-json has {len(sim['ranks'])}")
    if not rows:
        problems.append("no memory rows on the page")
    # The timeline: each program's compute ops, as drawn, cover exactly its busy time.
    for i, shown in seen:
        ops = [e["attrs"] for e in dom.elements
               if e["tag"] == "rect" and e["attrs"].get("data-class") == str(i) and "compute" in e["attrs"].get("class", "")]
        drawn = union_length([(float(o["data-start"]), float(o["data-start"]) + float(o["data-dur"])) for o in ops])
        if not ops or not close(drawn, sim["ranks"][shown]["busy"], 1e-6):
            problems.append(f"program {i}: its drawn compute covers {drawn}, sim-json's busy is {sim['ranks'][shown]['busy']}")
    tiers = {e["attrs"]["data-tier"] for e in dom.elements if "data-tier" in e["attrs"]}
    if tiers != {"inside a host", "across hosts"}:
        problems.append(f"communication tiers on the page: {sorted(tiers)}")
    width, height, pixels = png_pixels(shot_path)
    counts = {}
    for row in pixels:
        for p in row:
            counts[p] = counts.get(p, 0) + 1
    for name, rgb in (("forward", (0x7c, 0xc4, 0x7c)), ("backward", (0x6f, 0x9f, 0xd8)), ("idle", (0xe9, 0xe9, 0xe9))):
        if counts.get(rgb, 0) < 200:
            problems.append(f"the screenshot ({width}x{height}) shows {counts.get(rgb, 0)} pixels of the timeline's {name} colour")
    for p in problems:
        print("report_check:", p, file=sys.stderr)
    if not problems:
        print(f"report_check: {len(rows)} programs, {len(cards)} summary figures and the timeline agree with sim-json; "
              f"screenshot {width}x{height}: {counts[(0x7c, 0xc4, 0x7c)]} forward, {counts[(0x6f, 0x9f, 0xd8)]} backward pixels")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
