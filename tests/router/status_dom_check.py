#!/usr/bin/env python3
"""Checks the DOM of hiber-router's status page, as headless Chromium rendered it.

Reads the DOM (chromium --dump-dom) and checks it against expectations:
  --expect-json=FILE   everything the page must show for this /v2/status answer (fixture
                       mode): every node, GPU, resident model, function row with its numbers,
                       queue entry and swap row, and nothing more;
  targeted checks, for a live router whose numbers move (repeatable):
  --expect-function=FN                 a row for FN
  --expect-function-field=FN:FIELD=TEXT  the row's cell FIELD (requests, ok, failed, rejected,
                                       slo_ms, slo_met, p50_ms, p99_ms, instances, queued) reads TEXT
  --expect-functions=N                 exactly N function rows
  --expect-node=NAME[:up|:down]        a node card, in that state
  --expect-gpu=NODE/ORDINAL            a GPU tile
  --expect-resident=[NODE/ORDINAL:]FN  FN resident on that GPU (on any GPU without one)
  --expect-swap=FN[:LINK]              a swap row for FN (over LINK: nvlink, pcie or host)
  --expect-swaps-min=N                 at least N swap rows
  --expect-unreachable                 the "router unreachable" banner shows
Always: no page (JavaScript) error, and the banner hidden unless --expect-unreachable.
The number formats mirror the page's (router/status_page.html) and are computed here from the
JSON, independently. Exit status 0 when every check holds, 1 otherwise (each failure printed).
Standard library only.
"""
import argparse
import html.parser
import json
import math
import sys
from decimal import ROUND_HALF_UP, Decimal


# --- a minimal DOM -------------------------------------------------------------------------

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}


class Node:
    def __init__(self, tag, attrs, parent):
        self.tag, self.attrs, self.parent, self.children = tag, dict(attrs), parent, []

    def text(self):
        parts = []

        def walk(n):
            for c in n.children:
                if isinstance(c, str):
                    parts.append(c)
                else:
                    walk(c)
        walk(self)
        return " ".join("".join(parts).split())

    def iter(self):
        for c in self.children:
            if not isinstance(c, str):
                yield c
                yield from c.iter()

    def find_all(self, attr, value=None):
        return [n for n in self.iter()
                if attr in n.attrs and (value is None or n.attrs[attr] == value)]

    def find(self, attr, value=None):
        found = self.find_all(attr, value)
        return found[0] if found else None


class TreeBuilder(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {}, None)
        self.cur = self.root

    def handle_starttag(self, tag, attrs):
        n = Node(tag, [(k, "" if v is None else v) for k, v in attrs], self.cur)
        self.cur.children.append(n)
        if tag not in VOID:
            self.cur = n

    def handle_startendtag(self, tag, attrs):
        self.cur.children.append(Node(tag, [(k, "" if v is None else v) for k, v in attrs],
                                      self.cur))

    def handle_endtag(self, tag):
        n = self.cur
        while n is not None and n.tag != tag:
            n = n.parent
        if n is not None and n.parent is not None:
            self.cur = n.parent

    def handle_data(self, data):
        self.cur.children.append(data)


# --- the page's number formats, written again from their definition ---------------------------

def is_num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def num(x):
    return x if is_num(x) else 0


def to_fixed(x, digits):
    # Number.prototype.toFixed: the exact value of the double, ties away from zero.
    return str(Decimal(x).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def js_str(x):
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return str(x)


def fmt_bytes(b):
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    v, i = num(b), 0
    while v >= 1024 and i < len(units) - 1:
        v /= 1024
        i += 1
    return js_str(v) + " B" if i == 0 else to_fixed(v, 1) + " " + units[i]


def fmt_ms(x):
    return to_fixed(x, 1) + " ms" if is_num(x) else "—"


def fmt_pct(n, d):
    return to_fixed(n / d * 100, 1) + "%" if d > 0 else "—"


def fmt_age(s):
    if not is_num(s) or s < 0:
        s = 0
    if s < 60:
        return to_fixed(s, 1) + " s ago"
    if s < 3600:
        return f"{math.floor(s / 60)} min ago"
    return f"{math.floor(s / 3600)} h ago"


LINKS = {"nvlink": "NVLink", "pcie": "PCIe", "host": "host"}


# --- checks ---------------------------------------------------------------------------------

class Checker:
    def __init__(self, doc):
        self.doc = doc
        self.failures = []
        self.passed = 0

    def expect(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failures.append(what)
        return cond

    def equal(self, got, want, what):
        return self.expect(got == want, f"{what}: shows {got!r}, expected {want!r}")

    def by_id(self, ident):
        return self.doc.find("id", ident)

    def field(self, scope, name):
        n = scope.find("data-field", name)
        return n.text() if n is not None else None

    def banner(self, unreachable):
        banner, error = self.by_id("banner"), self.by_id("page-error")
        if self.expect(error is not None, "the page has no #page-error element"):
            self.expect("hidden" in error.attrs, f"the page reported an error: {error.text()!r}")
        if not self.expect(banner is not None, "the page has no #banner element"):
            return
        if unreachable:
            self.expect("hidden" not in banner.attrs, "the unreachable banner is hidden")
            self.expect("unreachable" in banner.text().lower(),
                        f"the banner does not say unreachable: {banner.text()!r}")
        else:
            self.expect("hidden" in banner.attrs,
                        f"the banner shows with a reachable router: {banner.text()!r}")

    def whole(self, s, stale):
        fns, nodes, swaps = s.get("functions") or [], s.get("nodes") or [], s.get("swaps") or []
        gpus = [g for n in nodes for g in (n.get("gpus") or [])]

        last = self.by_id("last-update")
        if self.expect(last is not None and "data-time" in last.attrs, "no #last-update time"):
            self.equal(float(last.attrs["data-time"]), s["time"], "#last-update data-time")
        if stale:
            self.expect(s["time"] is not None and "showing data from" in
                        self.by_id("banner").text(), "the banner does not say the data is old")

        completed = sum(num(f.get("ok")) + num(f.get("failed")) + num(f.get("shed")) for f in fns)
        summary = {
            "summary-nodes": f"{sum(1 for n in nodes if n.get('up'))} / {len(nodes)}",
            "summary-gpus": f"{sum(1 for g in gpus if g.get('running'))} / {len(gpus)}",
            "summary-functions": str(len(fns)),
            "summary-requests": js_str(sum(num(f.get("requests")) for f in fns)),
            "summary-slo": fmt_pct(sum(num(f.get("on_time")) for f in fns), completed),
            "summary-queued": js_str(sum(num(n.get("queued")) for n in nodes) +
                                     sum(num(f.get("queued")) for f in fns)),
        }
        for ident, want in summary.items():
            n = self.by_id(ident)
            self.equal(n.text() if n else None, want, f"#{ident}")

        # Nodes and GPUs.
        shown_nodes = {n.attrs["data-node"] for n in self.doc.find_all("data-node")}
        self.equal(shown_nodes, {n["name"] for n in nodes}, "the node cards")
        for n in nodes:
            card = self.doc.find("data-node", n["name"])
            if card is None:
                continue
            up = bool(n.get("up"))
            self.equal(card.attrs.get("data-up"), "true" if up else "false",
                       f"node {n['name']} data-up")
            self.equal(self.field(card, "up"), "up" if up else "down", f"node {n['name']} state")
            self.equal(self.field(card, "queued"), f"{js_str(num(n.get('queued')))} queued at hiberd",
                       f"node {n['name']} queued")
            self.equal(self.field(card, "scheduler"),
                       f"{js_str(num(n.get('shed')))} shed · "
                       f"{js_str(num(n.get('preemptions')))} leases preempted",
                       f"node {n['name']} shed and preempted")
            q = self.doc.find("data-queue-node", n["name"])
            self.equal(self.field(q, "queued") if q else None, js_str(num(n.get("queued"))),
                       f"queue entry of node {n['name']}")
        shown_gpus = {g.attrs["data-gpu"] for g in self.doc.find_all("data-gpu")}
        self.equal(shown_gpus, {f"{n['name']}/{g['ordinal']}" for n in nodes
                                for g in (n.get("gpus") or [])}, "the GPU tiles")
        for n in nodes:
            for g in n.get("gpus") or []:
                gid = f"{n['name']}/{g['ordinal']}"
                tile = self.doc.find("data-gpu", gid)
                if tile is None:
                    continue
                states = (["unhealthy"] if g.get("healthy") is False else []) + \
                         (["drained"] if g.get("drained") else [])
                self.equal(self.field(tile, "state"), ", ".join(states) or "healthy",
                           f"GPU {gid} state")
                running = g.get("running") or None
                self.equal(self.field(tile, "running"), f"running {running}" if running else "idle",
                           f"GPU {gid} running")
                self.equal(self.field(tile, "pool"),
                           f"{fmt_bytes(g.get('pool_used_bytes'))} / {fmt_bytes(g.get('pool_bytes'))}",
                           f"GPU {gid} pool")
                self.equal(self.field(tile, "fragmentation"),
                           f"frag {to_fixed(num(g.get('fragmentation')) * 100, 0)}%",
                           f"GPU {gid} fragmentation")
                chips = sorted(c.attrs["data-resident"] for c in tile.find_all("data-resident"))
                self.equal(chips, sorted(g.get("resident") or []), f"GPU {gid} resident models")
                for c in tile.find_all("data-resident"):
                    self.equal(c.text(), c.attrs["data-resident"], f"GPU {gid} resident chip")

        # Functions.
        rows = {r.attrs["data-function"]: r for r in self.doc.find_all("data-function")}
        self.equal(sorted(rows), sorted(f["name"] for f in fns), "the function rows")
        for f in fns:
            row = rows.get(f["name"])
            if row is None:
                continue
            done = num(f.get("ok")) + num(f.get("failed")) + num(f.get("shed"))
            slo = f.get("slo_ms")
            want = {
                "name": f["name"],
                "slo_ms": js_str(slo) + " ms" if is_num(slo) and slo > 0 else "—",
                "requests": js_str(num(f.get("requests"))),
                "ok": js_str(num(f.get("ok"))),
                "failed": js_str(num(f.get("failed"))),
                "rejected": js_str(num(f.get("rejected"))),
                "shed": js_str(num(f.get("shed"))),
                "slo_met": fmt_pct(num(f.get("on_time")), done),
                "p50_ms": fmt_ms(f.get("p50_ms")),
                "p99_ms": fmt_ms(f.get("p99_ms")),
                "instances": f"{js_str(num(f.get('busy')))} / {js_str(num(f.get('instances')))}",
                "queued": js_str(num(f.get("queued"))),
            }
            for name, text in want.items():
                self.equal(self.field(row, name), text, f"function {f['name']} {name}")
        empty = self.by_id("functions-empty")
        self.equal(empty is not None and "hidden" not in empty.attrs, not fns,
                   "'no functions registered' shown")

        # The router's queue: functions with requests waiting, and only those.
        queued = {f["name"]: js_str(num(f.get("queued"))) for f in fns if num(f.get("queued")) > 0}
        shown = {q.attrs["data-queue-function"]: self.field(q, "queued")
                 for q in self.doc.find_all("data-queue-function")}
        self.equal(shown, queued, "the router queue per function")

        # Swaps, newest first as the JSON lists them.
        shown = sorted(self.doc.find_all("data-swap"), key=lambda r: int(r.attrs["data-swap"]))
        self.equal(len(shown), len(swaps), "the number of swap rows")
        for i, (row, w) in enumerate(zip(shown, swaps)):
            src = "host" if w.get("source") == "host" or not is_num(w.get("source_gpu")) \
                else js_str(w["source_gpu"])
            want = {
                "function": w["function"],
                "node": w["node"],
                "route": f"{src} → {js_str(w['gpu'])}",
                "link": LINKS.get(w.get("link"), w.get("link")),
                "queued_ms": fmt_ms(w.get("queued_ms")),
                "age": fmt_age(s["time"] - w["time"]),
            }
            self.equal(row.attrs.get("data-link"), w.get("link"), f"swap {i} data-link")
            self.equal(int(row.attrs["data-swap"]), i, "swap row order")
            for name, text in want.items():
                self.equal(self.field(row, name), text, f"swap {i} {name}")
        empty = self.by_id("swaps-empty")
        self.equal(empty is not None and "hidden" not in empty.attrs, not swaps,
                   "'no swaps yet' shown")

    def targeted(self, a):
        rows = {r.attrs["data-function"]: r for r in self.doc.find_all("data-function")}
        for fn in a.expect_function:
            self.expect(fn in rows, f"no row for function {fn}")
        for spec in a.expect_function_field:
            fn, _, rest = spec.partition(":")
            name, _, text = rest.partition("=")
            if self.expect(fn in rows, f"no row for function {fn}"):
                self.equal(self.field(rows[fn], name), text, f"function {fn} {name}")
        if a.expect_functions is not None:
            self.equal(len(rows), a.expect_functions, "the number of function rows")
        for spec in a.expect_node:
            name, _, state = spec.partition(":")
            card = self.doc.find("data-node", name)
            if self.expect(card is not None, f"no card for node {name}") and state:
                self.equal(self.field(card, "up"), state, f"node {name} state")
        for gid in a.expect_gpu:
            self.expect(self.doc.find("data-gpu", gid) is not None, f"no tile for GPU {gid}")
        for spec in a.expect_resident:
            gid, _, fn = spec.rpartition(":")
            tiles = [self.doc.find("data-gpu", gid)] if gid else self.doc.find_all("data-gpu")
            self.expect(any(t is not None and t.find("data-resident", fn) is not None
                            for t in tiles),
                        f"{fn} not resident on " + (f"GPU {gid}" if gid else "any GPU"))
        swaps = self.doc.find_all("data-swap")
        for spec in a.expect_swap:
            fn, _, link = spec.partition(":")
            self.expect(any(self.field(r, "function") == fn and
                            (not link or r.attrs.get("data-link") == link) for r in swaps),
                        f"no swap row for {fn}" + (f" over {link}" if link else ""))
        if a.expect_swaps_min is not None:
            self.expect(len(swaps) >= a.expect_swaps_min,
                        f"{len(swaps)} swap rows, expected at least {a.expect_swaps_min}")


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dom", required=True, help="the dumped DOM (HTML)")
    p.add_argument("--expect-json")
    p.add_argument("--expect-function", action="append", default=[])
    p.add_argument("--expect-function-field", action="append", default=[])
    p.add_argument("--expect-functions", type=int)
    p.add_argument("--expect-node", action="append", default=[])
    p.add_argument("--expect-gpu", action="append", default=[])
    p.add_argument("--expect-resident", action="append", default=[])
    p.add_argument("--expect-swap", action="append", default=[])
    p.add_argument("--expect-swaps-min", type=int)
    p.add_argument("--expect-unreachable", action="store_true")
    a = p.parse_args()

    builder = TreeBuilder()
    with open(a.dom, encoding="utf-8") as f:
        builder.feed(f.read())
    builder.close()
    c = Checker(builder.root)
    c.banner(a.expect_unreachable)
    if a.expect_json:
        with open(a.expect_json, encoding="utf-8") as f:
            c.whole(json.load(f), stale=a.expect_unreachable)
    c.targeted(a)
    for failure in c.failures:
        print("FAIL:", failure)
    print(f"status page: {c.passed} checks passed, {len(c.failures)} failed")
    return 1 if c.failures or c.passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
