#!/usr/bin/env python3
"""coll-teach's pictures against its text view, the HTML page rendered in a real headless browser.

For each case, coll-teach runs under mpirun with --svg and --html. From the text it prints (the rounds and the
buffer contents after each), this test derives what every round's panel must show: an arrow from rank C to rank B
for each "receives ... from rC" of rank B in that round, labelled as C's matching "sends ... to rB", orange
("added") when B "adds it to its own"; and beneath each rank its blocks as the "after round K" line lists them.
The pictures are read by geometry, not by labels: an arrow's rank is the rank box its end points lie in, a block's
rank the box above it. The SVG is checked for every round; the HTML page is opened in Chromium with #step=K in its
address, which moves the slider to K through its input event, and the page's DOM after its script ran must show
exactly panel K, the same as the text. Exit 77 (a ctest skip) when no Chromium is installed.

  teach_pictures.py MPIRUN COLL_TEACH WORKDIR
"""
import html.parser
import os
import re
import shutil
import subprocess
import sys

BROWSERS = ["chromium-headless-shell", "chromium"]


class Panels(html.parser.HTMLParser):
    """The g.step panels of an SVG or an HTML DOM: boxes, arrows with labels, blocks, and whether shown."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.panels = []
        self.depth = 0  # nesting of <g> inside the current panel
        self.text_of = None  # the element whose text is being read
        self.title = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = a.get("class", "").split()
        if tag == "g" and "step" in cls and self.depth == 0:
            self.panels.append({"round": int(a["data-round"]), "title": a.get("data-title", ""),
                                "hidden": "none" in a.get("style", ""), "boxes": [], "names": [], "arrows": [],
                                "labels": [], "blocks": []})
            self.depth = 1
            return
        if tag == "g" and self.depth:
            self.depth += 1
        if tag == "output" and a.get("id") == "step-title":
            self.text_of = ("output", None)
            self.title = ""
        if not self.depth:
            return
        panel = self.panels[-1]
        if tag == "rect" and "rank" in cls:
            panel["boxes"].append((float(a["x"]), float(a["width"])))
        elif tag == "path" and "msg" in cls:
            numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", a["d"])]
            panel["arrows"].append({"x1": numbers[0], "x2": numbers[4], "added": "added" in cls})
        elif tag == "text" and cls and cls[0] in ("label", "block", "rank-name"):
            self.text_of = (cls[0], (float(a["x"]), float(a["y"])))
            self.buffer = ""

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag == "g" and self.depth:
            self.handle_endtag(tag)

    def handle_endtag(self, tag):
        if tag == "g" and self.depth:
            self.depth -= 1
        if tag == "output" and self.text_of and self.text_of[0] == "output":
            self.text_of = None
        if tag == "text" and self.text_of and self.text_of[0] != "output":
            kind, where = self.text_of
            self.panels[-1][{"label": "labels", "block": "blocks", "rank-name": "names"}[kind]].append(
                (where, self.buffer))
            self.text_of = None

    def handle_data(self, data):
        if self.text_of and self.text_of[0] == "output":
            self.title += data
        elif self.text_of:
            self.buffer += data


def rank_at(panel, x):
    """The rank whose box spans x, by the rank name drawn inside that box."""
    for left, width in panel["boxes"]:
        if left <= x <= left + width:
            for (nx, _), name in panel["names"]:
                if left <= nx <= left + width:
                    return int(name[1:])
    raise AssertionError(f"x = {x} lies in no rank's box")


def drawn(panel):
    """What a panel shows, read by geometry: sorted arrows (from, to, label, added) and blocks per rank."""
    if len(panel["labels"]) != len(panel["arrows"]):
        raise AssertionError(f"round {panel['round']}: {len(panel['arrows'])} arrows, {len(panel['labels'])} labels")
    arrows = sorted((rank_at(panel, a["x1"]), rank_at(panel, a["x2"]), label, a["added"])
                    for a, (_, label) in zip(panel["arrows"], panel["labels"]))
    blocks = {}
    for (x, y), text in sorted(panel["blocks"], key=lambda b: b[0][1]):
        blocks.setdefault(rank_at(panel, x), []).append(text)
    return arrows, [" | ".join(blocks[r]) for r in sorted(blocks)]


def expected(text):
    """Per round, from the text view: the arrows (from, to, label, added) and each rank's contents line."""
    sent = {}  # (from, to) -> the sender's phrases in round order
    receives = []  # (round, to, from, added)
    contents = {}
    round_ = 0
    after = None
    for line in text.splitlines():
        m = re.match(r"round (\d+)$", line)
        if m:
            round_ = int(m.group(1))
            continue
        m = re.match(r"after round (\d+):$", line)
        if m:
            after = int(m.group(1))
            contents[after] = []
            continue
        m = re.match(r"  r(\d+) \[(.*)\]$", line)
        if m and after is not None:
            contents[after].append(m.group(2))
            continue
        m = re.match(r"  r(\d+)\s", line)
        if m and after is None and round_:
            rank = int(m.group(1))
            for phrase, to in re.findall(r"sends (.+?) to r(\d+)", line):
                sent.setdefault((rank, int(to)), []).append(phrase)
            for _, source, adds in re.findall(r"receives (.+?) from r(\d+)(, adds it to its own)?", line):
                receives.append((round_, rank, int(source), bool(adds)))
    arrows = {}
    for round_, to, source, added in receives:
        label = sent[(source, to)].pop(0)
        arrows.setdefault(round_, []).append((source, to, label, added))
    return {k: (sorted(arrows.get(k, [])), contents[k]) for k in contents}


def compare(where, panel, want):
    got = drawn(panel)
    if got != want:
        raise AssertionError(f"{where}, round {panel['round']}:\n  drawn:    {got}\n  the text: {want}")


def browser():
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def main():
    mpirun, coll_teach, work = sys.argv[1:4]
    chromium = browser()
    if chromium is None:
        print(f"SKIP: no headless Chromium ({' or '.join(BROWSERS)}); scripts/setup.sh installs it")
        return 77
    os.makedirs(work, exist_ok=True)
    cases = [
        ("all_reduce", "ring", 4, ["--count", "8"]),  # the course's example
        ("all_reduce", "rhd", 5, ["--count", "11"]),  # halves by offset; the fold
        ("all_reduce", "tree", 5, ["--count", "4"]),
        ("all_reduce", "dbtree", 6, ["--count", "8"]),  # two trees in the same steps, full duplex
        ("broadcast", "tree", 5, ["--count", "4", "--root", "3"]),
        ("all_to_all", "pairwise", 3, ["--count", "2"]),  # the label is the sender's block, not the receiver's
    ]
    extra = os.environ.get("EMU_TEACH_PICTURE_CASES")
    for case in cases:
        kind, algorithm, ranks, args = case
        if extra and f"{kind}:{algorithm}" not in extra.split(","):
            continue
        name = f"{kind}_{algorithm}_{ranks}"
        svg, page = os.path.join(work, name + ".svg"), os.path.join(work, name + ".html")
        run = subprocess.run([mpirun, "-np", str(ranks), coll_teach, "--kind", kind, "--algorithm", algorithm,
                              *args, "--svg", svg, "--html", page], capture_output=True, text=True, timeout=120)
        if run.returncode != 0:
            raise AssertionError(f"{name}: coll-teach exit {run.returncode}\n{run.stdout}{run.stderr}")
        want = expected(run.stdout)
        rounds = max(want)
        if rounds < 2:
            raise AssertionError(f"{name}: the text shows {rounds} rounds")

        with open(svg, encoding="utf-8") as f:
            panels = Panels()
            panels.feed(f.read())
        if [p["round"] for p in panels.panels] != list(range(rounds + 1)):
            raise AssertionError(f"{name}.svg: panels {[p['round'] for p in panels.panels]}, rounds 0..{rounds}")
        for panel in panels.panels[1:]:
            compare(name + ".svg", panel, want[panel["round"]])

        with open(page, encoding="utf-8") as f:
            source = f.read()
        external = [u for u in re.findall(r"https?://[^\s\"'<>)]+", source) if u != "http://www.w3.org/2000/svg"]
        if external or re.search(r"<(link|img|iframe)\b|\bsrc\s*=", source):
            raise AssertionError(f"{name}.html is not self-contained: {external}")
        # Every round up to 4, then the middle and the last.
        for step in sorted({*range(1, min(rounds, 4) + 1), (rounds + 1) // 2, rounds}):
            dom = subprocess.run([chromium, "--no-sandbox", "--disable-gpu", "--headless", "--dump-dom",
                                  f"file://{os.path.abspath(page)}#step={step}"], capture_output=True, text=True,
                                 timeout=120)
            shown = Panels()
            shown.feed(dom.stdout)
            visible = [p for p in shown.panels if not p["hidden"]]
            if len(shown.panels) != rounds + 1 or [p["round"] for p in visible] != [step]:
                raise AssertionError(f"{name}.html#step={step}: shows rounds {[p['round'] for p in visible]} "
                                     f"of {len(shown.panels)} panels\n{dom.stderr[-2000:]}")
            if shown.title != visible[0]["title"]:
                raise AssertionError(f"{name}.html#step={step}: the slider says '{shown.title}'")
            compare(name + ".html in Chromium", visible[0], want[step])
        print(f"ok   {name}: {rounds} rounds; SVG and HTML (in {os.path.basename(chromium)}) agree with the text")
    return 0


if __name__ == "__main__":
    sys.exit(main())
