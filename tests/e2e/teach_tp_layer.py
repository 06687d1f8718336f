#!/usr/bin/env python3
"""coll-teach --tp-layer against the closed forms of one tensor-parallel transformer layer, written here.

Megatron-LM's layer over a TP group of t ranks (Shoeybi et al. 2019, §3; Korthikanti et al. 2022, §4.2), S = b·s·h·e
bytes the [b·s, h] tensor:
  without sequence parallelism  4 all-reduces: forward after o_proj and after down_proj, backward of the gate/up and
                                of the q/k/v input gradients; a ring sends 2(t − 1)/t · S from every rank, each
  with sequence parallelism     4 reduce-scatters and 6 all-gathers (each all-reduce's pair, plus the saved inputs of
                                gate/up and q/k/v gathered again in backward), (t − 1)/t · S each: in all
                                4 · 2(t − 1)/t · S + 2 · (t − 1)/t · S
The activations between the layers are S per rank, S/t with sequence parallelism.

Every row's measured bytes (what the ledger counted on every rank) and the tool's closed-form column must equal the
numbers computed here; a shape that does not split is refused with exit 2 on every rank.

  teach_tp_layer.py MPIRUN COLL_TEACH
"""
import re
import subprocess
import sys

ROW = re.compile(r"^\s*(\d+) (forward|backward)\s+(all_reduce|reduce_scatter|all_gather)\s+(\d+)\s+(\S+)\s+(\d+)\s+(.*)$")

# The calls of one layer, in order: (pass, collective, what the row must name).
PLAIN = [("forward", "all_reduce", "o_proj output"), ("forward", "all_reduce", "down_proj output"),
         ("backward", "all_reduce", "gate_proj/up_proj input gradient"),
         ("backward", "all_reduce", "q/k/v_proj input gradient")]
SEQUENCE = [("forward", "all_gather", "input_layernorm output"), ("forward", "reduce_scatter", "o_proj output"),
            ("forward", "all_gather", "post_attention_layernorm output"),
            ("forward", "reduce_scatter", "down_proj output"), ("backward", "all_gather", "d layer output"),
            ("backward", "all_gather", "post_attention_layernorm output again"),
            ("backward", "reduce_scatter", "gate_proj/up_proj input gradient"),
            ("backward", "all_gather", "d residual after attention"),
            ("backward", "all_gather", "input_layernorm output again"),
            ("backward", "reduce_scatter", "q/k/v_proj input gradient")]


def check(mpirun, coll_teach, t, b, s, h, dtype, sp):
    """Problems of one run, [] when it teaches the closed forms."""
    e = {"float32": 4, "bfloat16": 2}[dtype]
    S = b * s * h * e
    args = [mpirun, "-np", str(t), coll_teach, "--tp-layer", "--batch", str(b), "--seq", str(s), "--hidden", str(h),
            "--dtype", dtype] + (["--sequence-parallel"] if sp else [])
    run = subprocess.run(args, capture_output=True, text=True, timeout=120)
    name = f"t={t} b={b} s={s} h={h} {dtype}{' sp' if sp else ''}"
    if run.returncode != 0:
        return [f"{name}: exit {run.returncode}\n{run.stdout}{run.stderr}"]
    rows = [ROW.match(line) for line in run.stdout.splitlines()]
    rows = [r for r in rows if r]
    expected = SEQUENCE if sp else PLAIN
    problems = []
    if len(rows) != len(expected):
        return [f"{name}: {len(rows)} calls, expected {len(expected)}\n{run.stdout}"]
    total = 0
    for row, (phase, kind, what) in zip(rows, expected):
        factor = 2 * (t - 1) if kind == "all_reduce" else t - 1  # × S / t
        want = factor * S // t
        got = row.group(5)
        if (row.group(2), row.group(3)) != (phase, kind) or not row.group(7).startswith(what):
            problems.append(f"{name}: call {row.group(1)} is {row.group(2)} {row.group(3)} '{row.group(7)}', "
                            f"expected {phase} {kind} '{what}'")
        if int(row.group(4)) != S:
            problems.append(f"{name}: call {row.group(1)} carries {row.group(4)} B, expected S = b·s·h·e = {S}")
        if got != str(want):
            problems.append(f"{name}: call {row.group(1)} sent {got} B per rank, expected {want}")
        if int(row.group(6)) != want:
            problems.append(f"{name}: call {row.group(1)}'s closed form says {row.group(6)} B, expected {want}")
        total += want
    # The totals: the all-reduces' 4 · 2(t − 1)/t · S, with sequence parallelism 2 · (t − 1)/t · S more.
    per_layer = 4 * 2 * (t - 1) * S // t + (2 * (t - 1) * S // t if sp else 0)
    if total != per_layer or f"measured (rank 0) {per_layer} B" not in run.stdout:
        problems.append(f"{name}: per layer {per_layer} B expected\n{run.stdout}")
    activation = S // t if sp else S
    if f"per rank, {activation} B each" not in run.stdout:
        problems.append(f"{name}: activations of {activation} B per rank expected\n{run.stdout}")
    if "result: correct on every rank" not in run.stdout:
        problems.append(f"{name}: wrong results\n{run.stdout}")
    return problems


def main():
    mpirun, coll_teach = sys.argv[1:3]
    problems = []
    for t, b, s, h, dtype, sp in [(2, 1, 8, 16, "float32", False), (4, 2, 8, 16, "bfloat16", False),
                                  (4, 2, 8, 16, "bfloat16", True), (3, 1, 6, 12, "float32", True),
                                  (8, 1, 16, 32, "bfloat16", True)]:
        problems += check(mpirun, coll_teach, t, b, s, h, dtype, sp)
    # h = 16 does not split over 3 ranks, s = 8 not along 3 ranks: exit 2 on every rank, naming the value.
    for extra, message in [(["--hidden", "16"], "--hidden 16 over 3 ranks"),
                           (["--hidden", "12", "--seq", "8", "--sequence-parallel"], "--seq 8 with --sequence-parallel")]:
        run = subprocess.run([mpirun, "-np", "3", "sh", "-c", " ".join([coll_teach, "--tp-layer"] + extra) +
                              " >/dev/null 2>/tmp/coll_teach_tp_layer_err_$$; echo \"exit $?\"; "
                              "cat /tmp/coll_teach_tp_layer_err_$$; rm -f /tmp/coll_teach_tp_layer_err_$$"],
                             capture_output=True, text=True, timeout=120)
        if run.stdout.count("exit 2") != 3 or message not in run.stdout:
            problems.append(f"{' '.join(extra)} over 3 ranks: expected exit 2 on every rank naming '{message}'\n"
                            f"{run.stdout}{run.stderr}")
    for problem in problems:
        print(problem)
    print(f"coll-teach --tp-layer: {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
