#!/usr/bin/env python3
"""Records what real PyTorch allocates for small Hugging Face models, with PyTorch's own memory trackers.

One case: a model config (tests/data/oracle/*-tiny.json), a framework (ddp, ddp-zero, fsdp1, fsdp2), a dtype
recipe (fp32, mixed), attention (sdpa, eager), gradient checkpointing on or off, N ranks on CPU with gloo. Every
rank trains two AdamW (foreach) steps on the same synthetic tokens and tracks the second step with
torch.distributed._tools.MemTracker (FSDPMemTracker for fully_shard). Written per rank: the peak total, the
breakdown at that peak, each category's own peak, and the per-module peaks.

    python record.py case --model llama --framework ddp --recipe mixed --ranks 2 --out FILE
    python record.py all            # the grid checked in under tests/data/oracle/

Never a dependency of emu or of its CI: the fixtures it writes are what the C++ tests read.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import traceback

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DATA = os.path.join(REPO, "tests", "data", "oracle")
SEQ_LEN = 64
MICRO_BATCH = 2


def versions():
    import torch
    import transformers

    out = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}
    try:
        import importlib.metadata

        out["deepspeed"] = importlib.metadata.version("deepspeed")
    except Exception:  # noqa: BLE001 - deepspeed is optional for the PyTorch cases
        out["deepspeed"] = None
    return out


def category_name(key):
    return key.value if hasattr(key, "value") else str(key)


def watch_category_peaks(tracker):
    """Adds each category's own peak to a tracker, from the same snapshots its total peak is taken from."""
    tracker.category_peaks = {}
    original = tracker._update_peak_stats

    def update(state):
        original(state)
        for snap in tracker._curr_mem_snap.values():
            for key, value in snap.items():
                name = category_name(key)
                tracker.category_peaks[name] = max(tracker.category_peaks.get(name, 0), int(value))

    tracker._update_peak_stats = update
    for snap in tracker.get_tracker_snapshot("current").values():
        for key, value in snap.items():
            tracker.category_peaks[category_name(key)] = int(value)


def build_model(args):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with open(os.path.join(DATA, f"{args.model}-tiny.json")) as f:
        raw = json.load(f)
    config = AutoConfig.for_model(**raw)
    config._attn_implementation = args.attention
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=args.attention, dtype=torch.float32)
    if args.checkpoint:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # As the Trainer trains: TrainingArguments.use_cache defaults to False and Trainer.__init__ writes it into
    # model.config (transformers trainer.py); with the cache, k and v would be the cache's copies, held to the end.
    model.config.use_cache = False
    return model, raw


def block_class(model):
    return type(model.model.layers[0]) if hasattr(model, "model") else type(model.transformer.h[0])


def blocks(model):
    return model.model.layers if hasattr(model, "model") else model.transformer.h


def wrap(model, args, rank):
    import torch
    import torch.distributed as dist

    bf16 = torch.bfloat16
    adam = dict(lr=1e-3, foreach=True)
    if args.framework == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model)
        return model, torch.optim.AdamW(model.parameters(), **adam)
    if args.framework == "ddp-zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model)
        return model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, **adam)
    if args.framework == "fsdp1":
        import functools

        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

        mp = MixedPrecision(param_dtype=bf16, reduce_dtype=bf16, buffer_dtype=bf16) if args.recipe == "mixed" else None
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={block_class(model)})
        model = FSDP(model, auto_wrap_policy=policy, sharding_strategy=ShardingStrategy.FULL_SHARD,
                     mixed_precision=mp, device_id=torch.device("cpu"))
        return model, torch.optim.AdamW(model.parameters(), **adam)
    if args.framework == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        mp = MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=torch.float32) if args.recipe == "mixed" else (
            MixedPrecisionPolicy())
        for block in blocks(model):
            fully_shard(block, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        return model, torch.optim.AdamW(model.parameters(), **adam)
    raise ValueError(args.framework)


def train_step(model, optimizer, tokens, args):
    import contextlib

    import torch

    autocast = (torch.autocast("cpu", dtype=torch.bfloat16)
                if args.recipe == "mixed" and args.framework.startswith("ddp") else contextlib.nullcontext())
    with autocast:
        loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss)


def watch_timeline(tracker):
    """Records, after every op MemTracker sees, the op and the bytes per category then (for --timeline): where in the
    step a peak is, and what is alive there. Wraps the tracker's dispatch and peak update, as watch_category_peaks."""
    timeline = []
    current = {"op": None}
    update = tracker._update_peak_stats

    def record(state):
        update(state)
        for snap in tracker._curr_mem_snap.values():
            timeline.append([str(current["op"]), {category_name(k): int(v) for k, v in snap.items() if int(v)}])

    tracker._update_peak_stats = record
    dispatch = type(tracker).__torch_dispatch__

    def named(self, func, types, args=(), kwargs=None):
        current["op"] = func
        return dispatch(self, func, types, args, kwargs)

    tracker.__torch_dispatch__ = named.__get__(tracker)
    return timeline


def module_peaks(tracker):
    """The peak while each top-level module and each transformer block ran (MemTracker's local_peak)."""
    out = {}
    for stats in tracker.memory_tracking.values():
        fqn = stats.mod_fqn
        if fqn.count(".") >= 3 and not fqn.split(".")[-1].isdigit():
            continue
        peak = max((int(v) for v in stats.local_peak.values()), default=0)
        out[fqn] = peak
    return dict(sorted(out.items()))


def worker(rank, args, queue):
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    try:
        model, raw = build_model(args)
        model, optimizer = wrap(model, args, rank)
        g = torch.Generator().manual_seed(1234 + rank)
        tokens = torch.randint(0, raw["vocab_size"], (args.micro_batch, args.seq_len), generator=g)
        losses = [train_step(model, optimizer, tokens, args)]
        if args.framework == "fsdp2":
            from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

            tracker = FSDPMemTracker(model, optimizer)
        else:
            from torch.distributed._tools.mem_tracker import MemTracker

            tracker = MemTracker()
            tracker.track_external(model, optimizer)
        watch_category_peaks(tracker)
        timeline = watch_timeline(tracker) if args.timeline and rank == 0 else None
        with tracker:
            losses.append(train_step(model, optimizer, tokens, args))
        (peak,) = tracker.get_tracker_snapshot("peak").values()
        result = {
            "rank": rank,
            "peak_bytes": int(peak["Total"]),
            "at_peak": {category_name(k): int(v) for k, v in peak.items() if category_name(k) != "Total"},
            "category_peaks": {k: v for k, v in sorted(tracker.category_peaks.items()) if k != "Total"},
            "module_peaks": module_peaks(tracker),
            "losses": losses,
        }
        if timeline is not None:
            with open(args.timeline, "w") as f:
                json.dump(timeline, f)
        queue.put(result)
    except Exception:  # noqa: BLE001 - reported to the parent, which records the failure
        queue.put({"rank": rank, "error": traceback.format_exc()[-3000:]})
    finally:
        dist.destroy_process_group()


def parameter_count(model_name):
    from transformers import AutoConfig, AutoModelForCausalLM

    with open(os.path.join(DATA, f"{model_name}-tiny.json")) as f:
        raw = json.load(f)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**raw))
    return sum(p.numel() for p in model.parameters()), raw


def run_case(args):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args, queue)) for r in range(args.ranks)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    results.sort(key=lambda r: r["rank"])
    params, raw = parameter_count(args.model)
    case = {
        "case": case_name(args),
        "model": args.model,
        "model_config": raw,
        "parameters": params,
        "framework": args.framework,
        "recipe": args.recipe,
        "recipe_detail": recipe_detail(args),
        "attention": args.attention,
        "gradient_checkpointing": bool(args.checkpoint),
        "ranks": args.ranks,
        "seq_len": args.seq_len,
        "micro_batch": args.micro_batch,
        "optimizer": "torch.optim.AdamW(lr=1e-3, foreach=True), zero_grad(set_to_none=True)",
        "tracked": "the second optimizer step (forward, backward, step, zero_grad), CPU + gloo",
        "tracker": "FSDPMemTracker" if args.framework == "fsdp2" else "MemTracker",
        "versions": versions(),
        "command": "python scripts/oracle/record.py case " + " ".join(case_flags(args)),
        "date": datetime.date.today().isoformat(),
    }
    errors = [r for r in results if "error" in r]
    if errors:
        case["error"] = errors[0]["error"]
    else:
        case["per_rank"] = results
    return case


def recipe_detail(args):
    if args.recipe == "fp32":
        return "fp32 parameters, gradients and Adam states"
    return {
        "ddp": "fp32 model under torch.autocast(cpu, bfloat16); fp32 gradients and all-reduce",
        "ddp-zero": "fp32 model under torch.autocast(cpu, bfloat16); ZeroRedundancyOptimizer shards Adam",
        "fsdp1": "MixedPrecision(param_dtype=bf16, reduce_dtype=bf16, buffer_dtype=bf16), fp32 flat shards",
        "fsdp2": "MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), fp32 sharded parameters",
    }[args.framework]


def case_name(args):
    tokens = "" if (args.seq_len, args.micro_batch) == (SEQ_LEN, MICRO_BATCH) else f"-s{args.seq_len}b{args.micro_batch}"
    return (f"{args.model}-{args.framework}-{args.recipe}-{args.attention}-"
            f"{'ckpt' if args.checkpoint else 'nockpt'}{tokens}-n{args.ranks}")


def case_flags(args):
    tokens = [] if (args.seq_len, args.micro_batch) == (SEQ_LEN, MICRO_BATCH) else [
        f"--seq-len {args.seq_len}", f"--micro-batch {args.micro_batch}"]
    return [f"--model {args.model}", f"--framework {args.framework}", f"--recipe {args.recipe}",
            f"--attention {args.attention}", f"--checkpoint {int(args.checkpoint)}", f"--ranks {args.ranks}", *tokens]


def grid():
    """The checked-in grid: every framework × recipe × model at 2 and 4 ranks (SDPA, no checkpointing), the
    attention axis on Llama and the checkpointing axis on Llama and GPT-2 at 2 ranks for DDP and FSDP2, and on GPT-2
    for DDP + ZeroRedundancyOptimizer and FSDP1."""
    out = []
    for model in ("llama", "gpt2"):
        for framework in ("ddp", "ddp-zero", "fsdp1", "fsdp2"):
            for recipe in ("fp32", "mixed"):
                for ranks in (2, 4):
                    out.append((model, framework, recipe, "sdpa", 0, ranks))
    for framework in ("ddp", "fsdp2"):
        for recipe in ("fp32", "mixed"):
            out.append(("llama", framework, recipe, "eager", 0, 2))
            out.append(("llama", framework, recipe, "sdpa", 1, 2))
            out.append(("gpt2", framework, recipe, "sdpa", 1, 2))
    for framework in ("ddp-zero", "fsdp1"):
        for recipe in ("fp32", "mixed"):
            out.append(("gpt2", framework, recipe, "sdpa", 1, 2))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    case = sub.add_parser("case")
    case.add_argument("--model", choices=["llama", "gpt2"], required=True)
    case.add_argument("--framework", choices=["ddp", "ddp-zero", "fsdp1", "fsdp2"], required=True)
    case.add_argument("--recipe", choices=["fp32", "mixed"], required=True)
    case.add_argument("--attention", choices=["sdpa", "eager"], default="sdpa")
    case.add_argument("--checkpoint", type=int, choices=[0, 1], default=0)
    case.add_argument("--ranks", type=int, default=2)
    case.add_argument("--port", type=int, default=29517)
    case.add_argument("--seq-len", type=int, default=SEQ_LEN,
                      help="tokens per sequence; shorter ones put the activations below the model states, so that "
                           "the peak lands in the optimizer step")
    case.add_argument("--micro-batch", type=int, default=MICRO_BATCH, help="sequences per micro-batch")
    case.add_argument("--out")
    case.add_argument("--timeline", help="also write rank 0's per-op bytes by category over the tracked step (JSON)")
    sub.add_parser("all")
    args = parser.parse_args()
    if args.cmd == "case":
        result = run_case(args)
        text = json.dumps(result, indent=1, sort_keys=True) + "\n"
        if args.out:
            with open(args.out, "w") as f:
                f.write(text)
        else:
            sys.stdout.write(text)
        return 0 if "error" not in result else 1
    failed = 0
    for i, (model, framework, recipe, attention, checkpoint, ranks) in enumerate(grid()):
        name = f"{model}-{framework}-{recipe}-{attention}-{'ckpt' if checkpoint else 'nockpt'}-n{ranks}"
        out = os.path.join(DATA, "pytorch", name + ".json")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        cmd = [sys.executable, __file__, "case", "--model", model, "--framework", framework, "--recipe", recipe,
               "--attention", attention, "--checkpoint", str(checkpoint), "--ranks", str(ranks),
               "--port", str(29600 + i), "--out", out]
        rc = subprocess.call(cmd)
        print(f"{name}: {'ok' if rc == 0 else 'FAILED'}", flush=True)
        failed += rc != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
