#!/usr/bin/env python3
"""emu's training speed against PyTorch DDP on the same CPU, as a Markdown table for the README.

The model: GPT-2 style, 4 layers, hidden 256, 8 heads, sequence 128, vocabulary 1024, tied head, micro-batch 4 per
rank, AdamW (lr 1e-3, clip 1.0), DDP, no activation checkpointing, SDPA attention. emu runs it at k = 1 (no
shrinking) from a Hugging Face config.json written here; PyTorch runs the same shapes as a plain torch.nn module
under DistributedDataParallel with the gloo backend, one thread per rank (torch.set_num_threads(1),
OMP_NUM_THREADS=1), as emu's ranks run OpenBLAS on one thread each when they share a host.

Each repetition runs, interleaved, emu fp32, PyTorch fp32 (when a Python with torch is given), emu mixed and emu
bf16 at each rank count; a run's figure is its median step (the first WARMUP steps dropped), and the table gives
the median over the repetitions of tokens/s = ranks · 4 · 128 / step. The machine's bound is OpenBLAS sgemm on
1024 × 1024 × 1024 with every core (emu_model_bench --sgemm), measured in every repetition, over the model's FLOPs
per token: 6 · Ψ_mm + 12 · L · s · h (workloads/model/shrink.cpp step_flops: the matrix weights and the head,
forward and both backward products, plus the attention scores and their product with V).

    scripts/bench-speed.py                                      # emu against the sgemm bound
    EMU_BENCH_PYTHON=/work/oracle-venv/bin/python scripts/bench-speed.py   # and against PyTorch DDP
    scripts/bench-speed.py --ranks 2 4 --repeat 5 --steps 12 --warmup 2

PyTorch is only ever run from EMU_BENCH_PYTHON (or --python); it is never a dependency of emu or of its tests.
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

LAYERS, HIDDEN, HEADS, SEQ, VOCAB, BATCH = 4, 256, 8, 128, 1024, 4
FFN = 4 * HIDDEN
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def flops_per_token():
    """6 · Ψ_mm + 12 · L · s · h: the matrices of each block (qkv, out, fc, proj) and the tied head."""
    block_matrices = LAYERS * (3 * HIDDEN * HIDDEN + HIDDEN * HIDDEN + 2 * HIDDEN * FFN)
    return 6 * (block_matrices + VOCAB * HIDDEN) + 12 * LAYERS * SEQ * HIDDEN


def hf_config():
    return {"model_type": "gpt2", "activation_function": "gelu_new", "n_embd": HIDDEN, "n_layer": LAYERS,
            "n_head": HEADS, "n_positions": SEQ, "vocab_size": VOCAB, "tie_word_embeddings": True,
            "layer_norm_epsilon": 1e-5}


def single_threaded_env():
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def emu_run(args, config_path, ranks, precision, work):
    """tokens/s of one emu run: the median step of steps after the warm-up."""
    out = os.path.join(work, "emu.json")
    cmd = [os.path.join(ROOT, "scripts", "mpirun"), "-np", str(ranks), args.emu, "--model", config_path, "--shrink",
           "1", "--micro-batch", str(BATCH), "--seq-len", str(SEQ), "--precision", precision, "--strategies", "ddp",
           "--no-checkpoint", "--steps", str(args.steps), "--no-advise", "--json", out]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=single_threaded_env())
    with open(out, encoding="utf-8") as f:
        report = json.load(f)
    steps = report["strategies"][0]["step_seconds"][args.warmup:]
    return ranks * BATCH * SEQ / statistics.median(steps)


def torch_run(args, ranks):
    """tokens/s of one PyTorch DDP run, measured by this script's worker under args.python."""
    cmd = [args.python, os.path.abspath(__file__), "--torch-worker", "--ranks", str(ranks), "--steps",
           str(args.steps), "--warmup", str(args.warmup)]
    result = subprocess.run(cmd, check=True, capture_output=True, text=True, env=single_threaded_env())
    return float(result.stdout.strip().splitlines()[-1])


def sgemm_gflops(args):
    result = subprocess.run([args.bench, "--sgemm"], check=True, capture_output=True, text=True)
    return float(result.stdout.strip().splitlines()[-1])


# ---- the PyTorch side (runs under EMU_BENCH_PYTHON) ----

def torch_worker(args):
    import torch
    import torch.multiprocessing as mp

    port = 29500 + os.getpid() % 1000
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(torch_rank, args=(args.ranks[0], args.steps, args.warmup, port, queue), nprocs=args.ranks[0], join=True)
    print(queue.get())


def torch_rank(rank, world, steps, warmup, port, queue):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(1234)

    class Block(nn.Module):
        # transformers models/gpt2/modeling_gpt2.py GPT2Block, dropout off, nn.Linear in place of Conv1D.
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
            self.c_attn, self.c_proj = nn.Linear(HIDDEN, 3 * HIDDEN), nn.Linear(HIDDEN, HIDDEN)
            self.c_fc, self.mlp_proj = nn.Linear(HIDDEN, FFN), nn.Linear(FFN, HIDDEN)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(HIDDEN, dim=2)
            q, k, v = (t.view(b, s, HEADS, HIDDEN // HEADS).transpose(1, 2) for t in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, HIDDEN)
            x = x + self.c_proj(a)
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class Gpt2(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB, HIDDEN), nn.Embedding(SEQ, HIDDEN)
            self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
            self.ln_f = nn.LayerNorm(HIDDEN)

        def forward(self, tokens, targets):
            x = self.wte(tokens) + self.wpe(torch.arange(SEQ))
            for block in self.blocks:
                x = block(x)
            logits = self.ln_f(x) @ self.wte.weight.t()  # the tied head
            return F.cross_entropy(logits.view(-1, VOCAB).float(), targets.view(-1))

    model = DistributedDataParallel(Gpt2())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(7 + rank)
    times = []
    for _ in range(steps):
        tokens = torch.randint(VOCAB, (BATCH, SEQ), generator=generator)
        targets = torch.randint(VOCAB, (BATCH, SEQ), generator=generator)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        model(tokens, targets).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        dist.barrier()
        times.append(time.perf_counter() - start)
    if rank == 0:
        queue.put(world * BATCH * SEQ / statistics.median(times[warmup:]))
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeat", type=int, default=3, help="interleaved repetitions (default 3)")
    parser.add_argument("--steps", type=int, default=12, help="steps per run (default 12)")
    parser.add_argument("--warmup", type=int, default=2, help="first steps of each run not counted (default 2)")
    parser.add_argument("--emu", default=os.environ.get("EMU", os.path.join(ROOT, "build/release/bin/emu")))
    parser.add_argument("--bench", default=os.environ.get("EMU_MODEL_BENCH",
                                                          os.path.join(ROOT, "build/release/bin/emu_model_bench")))
    parser.add_argument("--python", default=os.environ.get("EMU_BENCH_PYTHON", ""),
                        help="a Python with torch for the PyTorch side (default: $EMU_BENCH_PYTHON; none: emu alone)")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "mixed", "bf16"])
    parser.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.torch_worker:
        torch_worker(args)
        return
    if args.warmup >= args.steps:
        parser.error(f"--warmup {args.warmup} leaves no step of --steps {args.steps}; accepted: 0 to {args.steps - 1}")
    for path, target in ((args.emu, "emu"), (args.bench, "emu_model_bench")):
        if not os.access(path, os.X_OK):
            sys.exit(f"bench-speed: {path} not built (cmake --build build/release --target {target})")

    emu = {(n, p): [] for n in args.ranks for p in args.precisions}
    torch = {n: [] for n in args.ranks}
    sgemm = []
    with tempfile.TemporaryDirectory() as work:
        config_path = os.path.join(work, "config.json")
        with open(config_path, "w", encoding="utf-8") as f:
            json.dump(hf_config(), f)
        for rep in range(args.repeat):
            sgemm.append(sgemm_gflops(args))
            for n in args.ranks:
                for p in args.precisions:
                    emu[(n, p)].append(emu_run(args, config_path, n, p, work))
                    if p == "fp32" and args.python:
                        torch[n].append(torch_run(args, n))
            print(f"bench-speed: repetition {rep + 1}/{args.repeat} done", file=sys.stderr)

    per_token = flops_per_token()
    rate = statistics.median(sgemm)
    bound = rate * 1e9 / per_token
    cpu = "unknown CPU"
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    print(f"emu speed benchmark: {datetime.date.today()}, {os.cpu_count()} cores ({cpu}), "
          f"median of {args.repeat} interleaved repetitions, {args.steps - args.warmup} steps each")
    print(f"model: GPT-2 style, L {LAYERS}, h {HIDDEN}, a {HEADS}, s {SEQ}, V {VOCAB}, micro-batch {BATCH} per rank, "
          f"AdamW, DDP; {per_token / 1e6:.1f} MFLOP per token; sgemm {rate:.1f} GFLOP/s on every core: "
          f"bound {bound:,.0f} tokens/s")
    print()
    print("| ranks | precision | emu tokens/s | PyTorch DDP tokens/s | emu / PyTorch | of sgemm bound | of emu fp32 |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for n in args.ranks:
        fp32 = statistics.median(emu[(n, "fp32")]) if (n, "fp32") in emu else None
        for p in args.precisions:
            mine = statistics.median(emu[(n, p)])
            theirs = statistics.median(torch[n]) if p == "fp32" and torch[n] else None
            cells = [str(n), p, f"{mine:,.0f}", f"{theirs:,.0f}" if theirs else "",
                     f"{mine / theirs:.2f}" if theirs else "", f"{mine / bound:.2f}",
                     f"{mine / fp32:.2f}" if fp32 else ""]
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
