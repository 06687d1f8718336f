#!/usr/bin/env python3
"""The planning questions emu was built to settle, as a Markdown table: for each scenario every strategy's verdict
and per-GPU peak, from shapes-only plans at full scale (`emu --plan N`, no data, about a second each).

The scenarios: Llama 2 13B on 4 and on 8 x A100-40GB, Llama 2 70B on 8 x H100-80GB; each with and without activation
checkpointing, with and without optimizer offload, at sequence 4096 and 8192; micro-batch 1, emu's default mixed
precision (bf16 weights and gradients, fp32 master weights and AdamW moments) and every other option at emu's default.
The peak is the reserved one where the build models PyTorch's caching allocator (a GPU runs out of memory on what
its allocator holds), else the allocated one.

Given a second build (--before), the table has its verdicts beside, and a change of verdict is marked: the way to
show what a change of emu's recipes did to the answers a user gets.

    scripts/seed-scenarios.py                                        # build/release/bin/emu
    scripts/seed-scenarios.py --before /tmp/emu-old/build/release/bin/emu
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

GIB = 1 << 30
SCENARIOS = [("llama2-13b", 4, "40GB"), ("llama2-13b", 8, "40GB"), ("llama2-70b", 8, "80GB")]
GPU_NAME = {"40GB": "A100-40GB", "80GB": "H100-80GB"}


def plan(emu, model, ranks, cap, seq, checkpoint, offload):
    """Every strategy's (verdict, peak GiB) of one plan, by name."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "plan.json")
        command = [emu, "--plan", str(ranks), "--model", model, "--cap", cap, "--seq-len", str(seq),
                   "--checkpoint" if checkpoint else "--no-checkpoint", "--json", out]
        if offload:
            command.append("--offload")
        run = subprocess.run(command, capture_output=True, text=True)
        if not os.path.exists(out):
            sys.exit(f"seed-scenarios: {' '.join(command)} wrote no JSON (exit {run.returncode}):\n{run.stderr}")
        with open(out) as f:
            report = json.load(f)
    result = {}
    for s in report["strategies"]:
        reserved = s.get("reserved")
        peak = reserved["peak_bytes"] if isinstance(reserved, dict) else s["peak"]["bytes"]
        result[s["name"]] = (s["verdict"], peak / GIB)
    return result


def cell(entry):
    if entry is None:
        return "–"
    verdict, peak = entry
    return f"{'fits' if verdict == 'fit' else 'OOM'} {peak:,.1f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--emu", default="build/release/bin/emu", help="the emu to plan with")
    parser.add_argument("--before", help="an older emu build to compare verdicts with")
    args = parser.parse_args()

    rows = []
    changed = 0
    strategies = None
    for model, ranks, cap in SCENARIOS:
        for seq in (4096, 8192):
            for checkpoint in (True, False):
                for offload in (False, True):
                    now = plan(args.emu, model, ranks, cap, seq, checkpoint, offload)
                    before = plan(args.before, model, ranks, cap, seq, checkpoint, offload) if args.before else {}
                    strategies = strategies or list(now)
                    cells = []
                    for name in strategies:
                        text = cell(now.get(name))
                        if args.before:
                            old = before.get(name)
                            mark = old is not None and name in now and old[0] != now[name][0]
                            changed += mark
                            text = f"{cell(old)} → {'**' if mark else ''}{text}{'**' if mark else ''}"
                        cells.append(text)
                    scenario = (f"{model} {ranks} x {GPU_NAME[cap]}, s {seq}, "
                                f"{'ckpt' if checkpoint else 'no ckpt'}{', offload' if offload else ''}")
                    rows.append(f"| {scenario} | " + " | ".join(cells) + " |")
    print("| scenario | " + " | ".join(strategies) + " |")
    print("|---|" + "---:|" * len(strategies))
    print("\n".join(rows))
    if args.before:
        print(f"\n{changed} verdicts changed (in bold); peaks in GiB per GPU, before → now.")
    else:
        print("\nPeaks in GiB per GPU.")


if __name__ == "__main__":
    main()
