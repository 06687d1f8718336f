#!/usr/bin/env python3
"""Logs DeepSpeed ZeRO-3's parameter coordinator over the second (tracked) step on rank 0, as deepspeed_run.py
runs it (tiny Llama, bf16, 2 ranks, CPU with gloo): every fetch, all-gather (demand or prefetch, with the coalesced
handle's flat buffer), release, the coordinator's count of available elements, the gathered parameters, the flat
all-gather buffers still held by in-flight handles, and MemTracker's running total at each event. For comparing
emu's replay (strategies/zero3_modules.cpp) with DeepSpeed step by step; not checked in as a fixture.

    DS_ACCELERATOR=cpu python deepspeed_zero3_trace.py --zero JSON --out FILE
"""
import argparse
import json
import os
import sys
import weakref

os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def instrument(names, params, log, tracker_box):
    """Wraps the coordinator's fetch, release and all-gather and the coalesced handle's constructor to append to
    `log`; `params`: the module's parameters, `tracker_box` [the MemTracker] once made."""
    from deepspeed.runtime.zero import partition_parameters as pp
    from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator as C
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    buffers = []  # weak references to the flat all-gather buffers of coalesced handles

    def state(coord):
        gathered = sorted(names.get(id(p), "?") for p in params if p.ds_status == ZeroParamStatus.AVAILABLE)
        live = [b() for b in buffers]
        flat = sum(b.numel() for b in live if b is not None)
        total = None
        if tracker_box:
            for snap in tracker_box[0]._curr_mem_snap.values():
                total = int(sum(int(v) for k, v in snap.items() if "Total" not in str(k)))
        return {"avail": coord._PartitionedParameterCoordinator__n_available_params, "gathered": gathered,
                "flat_buffer_elements": flat, "tracker_total": total,
                "step_id": coord._PartitionedParameterCoordinator__step_id}

    init = pp.AllGatherCoalescedHandle.__init__

    def handle_init(self, allgather_handle, params, partitions, world_size, *a, **k):
        init(self, allgather_handle, params, partitions, world_size, *a, **k)
        if partitions:
            flat = partitions[0]._base if partitions[0]._base is not None else partitions[0]
            buffers.append(weakref.ref(flat))
            log.append({"event": "coalesced_handle", "params": [names.get(id(p), "?") for p in params],
                        "flat_elements": flat.numel()})

    pp.AllGatherCoalescedHandle.__init__ = handle_init

    fetch = C.fetch_sub_module

    def fetch_sub_module(self, module, forward):
        entry = {"event": "fetch", "module": getattr(module, "ds_name", type(module).__name__), "forward": forward,
                 "before": state(self)}
        log.append(entry)
        fetch(self, module, forward)
        entry["after"] = state(self)

    C.fetch_sub_module = fetch_sub_module
    release = C.release_sub_module

    def release_sub_module(self, module, forward=False):
        release(self, module, forward)
        log.append({"event": "release", "module": getattr(module, "ds_name", type(module).__name__),
                    "forward": forward, "after": state(self)})

    C.release_sub_module = release_sub_module
    gather = C._PartitionedParameterCoordinator__all_gather_params_

    def all_gather(self, params, forward, quantize=False):
        todo = [names.get(id(p), "?") for p in params if p.ds_status == ZeroParamStatus.NOT_AVAILABLE]
        log.append({"event": "all_gather", "params": sorted(todo)})
        gather(self, params, forward, quantize)

    C._PartitionedParameterCoordinator__all_gather_params_ = all_gather


def trace(rank, args, engine, tracker):
    """deepspeed_run.worker's hook: instruments rank 0 before the tracked step, writes the log after it."""
    import record

    if rank != 0:
        return None
    for name, module in engine.module.named_modules():
        module.ds_name = name or "<root>"
    names = {id(p): n for n, p in engine.module.named_parameters()}
    log = [{"event": "numel", "params": {n: p.ds_numel for n, p in engine.module.named_parameters()}}]
    instrument(names, list(engine.module.parameters()), log, [tracker])
    timeline = record.watch_timeline(tracker)

    def write():
        (peak,) = tracker.get_tracker_snapshot("peak").values()
        with open(args.out, "w") as f:
            json.dump({"log": log, "peak": {record.category_name(k): int(v) for k, v in peak.items()},
                       "timeline": timeline}, f)

    return write


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--zero", default="{}", help="extra zero_optimization keys, as JSON")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--port", type=int, default=29791)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    args.stage, args.precision, args.accumulation, args.data_types = 3, "bf16", 1, None
    import deepspeed_run
    import record

    args.seq_len, args.micro_batch = record.SEQ_LEN, record.MICRO_BATCH

    errors = [r["error"] for r in deepspeed_run.run_ranks(args, trace) if "error" in r]
    for e in errors:
        sys.stderr.write(e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
