#!/usr/bin/env python3
"""Records the learning rate DeepSpeed's WarmupLR and WarmupDecayLR give each optimizer step, for
tests/unit/optim_adamw_test.cpp.

Reference only (never a dependency of emu or of its CI): run with the oracle environment of scripts/oracle/README.md,
    /work/oracle-venv/bin/python scripts/oracle/deepspeed_warmup_lr.py
and compare with the values the test states. The engine steps the scheduler after the optimizer
(deepspeed/runtime/engine.py, _take_model_step), as this loop does.
"""
import warnings

import deepspeed
import torch
from deepspeed.runtime.lr_schedules import WarmupDecayLR, WarmupLR

warnings.filterwarnings("ignore")
print(f"deepspeed {deepspeed.__version__}, torch {torch.__version__}")
for warmup_type in ("log", "linear"):
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.5)
    scheduler = WarmupLR(optimizer, warmup_min_lr=1e-5, warmup_max_lr=1e-3, warmup_num_steps=10,
                         warmup_type=warmup_type)
    rates = []
    for _ in range(13):
        rates.append(optimizer.param_groups[0]["lr"])  # what optimizer step t uses
        optimizer.step()
        scheduler.step()
    print(warmup_type, ", ".join(repr(r) for r in rates))

# WarmupDecayLR as the Accelerate templates leave it to the Trainer ("auto": warm-up max(1, 0), min 0, total = max_steps 8),
# and with its own warm-up (4 steps, log, from 1e-5, total 12).
for name, make, steps in (
        ("decay auto", lambda o: WarmupDecayLR(o, total_num_steps=8, warmup_min_lr=0, warmup_max_lr=1e-3,
                                               warmup_num_steps=1), 10),
        ("decay given", lambda o: WarmupDecayLR(o, total_num_steps=12, warmup_min_lr=1e-5, warmup_max_lr=1e-3,
                                                warmup_num_steps=4), 15)):
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.5)
    scheduler = make(optimizer)
    rates = []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    print(name, ", ".join(repr(r) for r in rates))
