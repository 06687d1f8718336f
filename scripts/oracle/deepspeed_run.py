#!/usr/bin/env python3
"""Tries DeepSpeed ZeRO-1/2/3 itself on CPU with gloo (DS_ACCELERATOR=cpu) on the tiny Llama, 2 ranks, and
prints what happened per stage: the peak per MemTracker category over the second step, or the error.

    DS_ACCELERATOR=cpu python deepspeed_run.py [--stage 0|1|2|3] [--precision fp32|bf16] [--zero JSON]
        [--accumulation N] [--data-types JSON] [--seq-len S] [--micro-batch B]

--zero adds keys to zero_optimization (e.g. '{"reduce_bucket_size": 20000}'), so that buffers sized by
DeepSpeed's knobs show beside this tiny model's states. --accumulation sets gradient_accumulation_steps: each step
is then N micro-batches (the same tokens), each a forward, engine.backward and engine.step, as the Trainer runs them.
--data-types sets the config's data_types section (e.g. '{"grad_accum_dtype": "fp32"}', which with bf16 at stage 1
makes DeepSpeed run BF16_Optimizer). --seq-len and --micro-batch shrink the tokens (default record.py's) so that
the activations fall below the model states and the peak lands at the optimizer step, where DeepSpeed's step-time
buffers show. Each rank also records the collectives DeepSpeed called over the tracked step (kind and bytes).
"""
import argparse
import json
import os
import sys
import traceback

os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def worker(rank, args, queue, hook=None):
    """One rank's run; `hook(rank, args, engine, tracker)`, where given, is called before the tracked step and may
    return a function called after it (deepspeed_zero3_trace.py's instrumentation)."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(args.ranks), LOCAL_SIZE=str(args.ranks))
    try:
        import deepspeed

        import record

        deepspeed.init_distributed(dist_backend="gloo")
        model_args = argparse.Namespace(model="llama", attention="sdpa", checkpoint=0)
        model, raw = record.build_model(model_args)
        config = {
            "train_micro_batch_size_per_gpu": args.micro_batch,
            "gradient_accumulation_steps": args.accumulation,
            "zero_optimization": {"stage": args.stage, **json.loads(args.zero)},
            "bf16": {"enabled": args.precision == "bf16"},
            **({"data_types": json.loads(args.data_types)} if args.data_types else {}),
        }
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
        engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        g = torch.Generator().manual_seed(1234 + rank)
        tokens = torch.randint(0, raw["vocab_size"], (args.micro_batch, args.seq_len), generator=g)

        def step(tracker=None):
            for micro in range(args.accumulation):  # engine.step() steps the optimizer at the boundary only
                if tracker is not None and micro > 0:
                    tracker.reset_mod_stats()  # MemTracker tracks one call per module; its peaks stay
                loss = engine(input_ids=tokens, labels=tokens).loss
                engine.backward(loss)
                engine.step()
            return float(loss.detach())

        losses = [step()]
        from torch.distributed._tools.mem_tracker import MemTracker

        tracker = MemTracker()
        # The module (parameters, .grad) and the torch AdamW inside DeepSpeed's optimizer (its fp32 partition and
        # Adam states); DeepSpeed's own flat buffers (bit16 partitions, gradient partitions, the ipg bucket) are
        # seen only where they back a parameter or a .grad.
        inner = getattr(optimizer, "optimizer", None)
        tracker.track_external(engine.module, *([inner] if isinstance(inner, torch.optim.Optimizer) else []))
        record.watch_category_peaks(tracker)
        after = hook(rank, args, engine, tracker) if hook else None
        stop_watching = watch_collectives()
        with tracker:
            losses.append(step(tracker))
        collectives = stop_watching()
        if after:
            after()
        (peak,) = tracker.get_tracker_snapshot("peak").values()
        queue.put({"rank": rank, "peak_bytes": int(peak["Total"]),
                   "at_peak": {record.category_name(k): int(v) for k, v in sorted(peak.items(), key=str)},
                   "category_peaks": dict(sorted(tracker.category_peaks.items())),
                   "module_peaks": record.module_peaks(tracker), "collectives": collectives, "losses": losses,
                   "optimizer_class": type(optimizer).__name__})
    except Exception:  # noqa: BLE001 - reported to the parent
        queue.put({"rank": rank, "error": traceback.format_exc()[-4000:]})
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def watch_collectives():
    """Logs every collective DeepSpeed calls (deepspeed.comm, which its ZeRO code calls through) until the returned
    function is called, which restores them and returns, per call, the kind, the bytes of each tensor argument in
    order, whether the first is a tensor of its own (not a view: a flattened copy made for the call), and a reduce's
    or broadcast's root (its global rank)."""
    import deepspeed.comm as dist

    calls = []
    originals = {}
    for name in ("all_reduce", "reduce", "reduce_scatter_tensor", "reduce_scatter_fn", "all_gather_into_tensor",
                 "allgather_fn", "all_gather", "broadcast", "reduce_scatter"):
        if not hasattr(dist, name):
            continue
        originals[name] = getattr(dist, name)

        def logged(*a, _name=name, **k):
            tensors = [x for x in list(a) + list(k.values()) if hasattr(x, "numel") and hasattr(x, "element_size")]
            call = {"kind": _name, "bytes": [int(t.numel() * t.element_size()) for t in tensors],
                    "own_storage": bool(tensors) and tensors[0]._base is None}
            if _name in ("reduce", "broadcast"):  # the root: dist.reduce(tensor, dst), dist.broadcast(tensor, src)
                call["root"] = int(a[1] if len(a) > 1 else k.get("dst", k.get("src")))
            calls.append(call)
            return originals[_name](*a, **k)

        setattr(dist, name, logged)

    def stop():
        for name, original in originals.items():
            setattr(dist, name, original)
        return calls

    return stop


def run_ranks(args, hook=None):
    """Runs `worker` on args.ranks spawned processes; their reports, by rank."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args, queue, hook)) for r in range(args.ranks)]
    for p in procs:
        p.start()
    out = sorted((queue.get(timeout=600) for _ in procs), key=lambda r: r["rank"])
    for p in procs:
        p.join()
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--stage", type=int, choices=[0, 1, 2, 3], help="one stage (0: no ZeRO); default 1, 2, 3")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--port", type=int, default=29701)
    parser.add_argument("--zero", default="{}", help="extra zero_optimization keys, as JSON")
    parser.add_argument("--accumulation", type=int, default=1, help="gradient_accumulation_steps")
    parser.add_argument("--data-types", help="the config's data_types section, as JSON (e.g. grad_accum_dtype)")
    parser.add_argument("--seq-len", type=int, help="tokens per sequence (default record.py's)")
    parser.add_argument("--micro-batch", type=int, help="sequences per micro-batch (default record.py's)")
    parser.add_argument("--out")
    args = parser.parse_args()
    import record

    args.seq_len = args.seq_len or record.SEQ_LEN
    args.micro_batch = args.micro_batch or record.MICRO_BATCH
    command = "DS_ACCELERATOR=cpu python scripts/oracle/deepspeed_run.py " + " ".join(sys.argv[1:])
    results = {}
    for stage in ([args.stage] if args.stage is not None else [1, 2, 3]):
        args.stage = stage
        args.port += 1
        results[f"zero{stage}-{args.precision}"] = run_ranks(args)
    import datetime

    import record

    with open(os.path.join(record.DATA, "llama-tiny.json")) as f:
        raw = json.load(f)
    params, _ = record.parameter_count("llama")
    fixture = {
        "what": "DeepSpeed ZeRO run on CPU (DS_ACCELERATOR=cpu, gloo), tracked by PyTorch's MemTracker over the "
                "second step; zero_optimization has 'stage' and the keys of 'zero_optimization' below set, so every "
                "other knob is DeepSpeed's default",
        "zero_optimization": json.loads(args.zero),
        "model": "llama", "model_config": raw, "parameters": params, "ranks": args.ranks,
        "seq_len": args.seq_len, "micro_batch": args.micro_batch, "precision": args.precision,
        "gradient_accumulation_steps": args.accumulation,
        **({"data_types": json.loads(args.data_types)} if args.data_types else {}),
        "optimizer": "torch.optim.AdamW(lr=1e-3, foreach=True) handed to deepspeed.initialize",
        "versions": record.versions(), "command": command, "date": datetime.date.today().isoformat(),
        "stages": results,
    }
    text = json.dumps(fixture, indent=1, sort_keys=True) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0 if all("error" not in r for rs in results.values() for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())
