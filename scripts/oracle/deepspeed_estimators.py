#!/usr/bin/env python3
"""Records DeepSpeed's own model-state memory estimators for emu's presets at 1, 2, 4, 8, 16 and 64 GPUs.

The parameter counts come from transformers (the presets' configs built on the meta device), the largest layer
as DeepSpeed's `model_to_params` (stage3.py) counts it: the most parameters any single module owns directly.
Each figure is what `estimate_zero2_model_states_mem_needs` (runtime/zero/stage_1_and_2.py) and
`estimate_zero3_model_states_mem_needs` (runtime/zero/stage3.py) return for each option row their `*_all_cold`
functions print, in bytes.

    DS_ACCELERATOR=cpu python deepspeed_estimators.py     # writes tests/data/oracle/deepspeed_estimators.json
"""
import contextlib
import datetime
import io
import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(REPO, "tests", "data", "oracle", "deepspeed_estimators.json")
GPUS = (1, 2, 4, 8, 16, 64)

# emu's presets (workloads/model/config.cpp), as Hugging Face configs.
PRESETS = {
    "llama2-7b": dict(model_type="llama", hidden_size=4096, intermediate_size=11008, vocab_size=32000,
                      max_position_embeddings=4096, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, tie_word_embeddings=False),
    "llama2-13b": dict(model_type="llama", hidden_size=5120, intermediate_size=13824, vocab_size=32000,
                       max_position_embeddings=4096, num_hidden_layers=40, num_attention_heads=40,
                       num_key_value_heads=40, tie_word_embeddings=False),
    "llama2-70b": dict(model_type="llama", hidden_size=8192, intermediate_size=28672, vocab_size=32000,
                       max_position_embeddings=4096, num_hidden_layers=80, num_attention_heads=64,
                       num_key_value_heads=8, tie_word_embeddings=False),
    "llama3-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, vocab_size=128256,
                      max_position_embeddings=8192, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, tie_word_embeddings=False),
    "llama3-70b": dict(model_type="llama", hidden_size=8192, intermediate_size=28672, vocab_size=128256,
                       max_position_embeddings=8192, num_hidden_layers=80, num_attention_heads=64,
                       num_key_value_heads=8, tie_word_embeddings=False),
    "gpt2": dict(model_type="gpt2", n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=1024),
    "gpt2-xl": dict(model_type="gpt2", n_embd=1600, n_layer=48, n_head=25, vocab_size=50257, n_positions=1024),
}


def counts(config):
    """DeepSpeed's model_to_params (stage3.py) on a meta-device model. Its own function deduplicates shared
    parameters by data_ptr(), which is 0 for every meta tensor, so the same counts are taken here the same way:
    parameters() (shared ones once) and the most parameters one module owns directly."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    total = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return int(total), int(largest)


def layout(gpus):
    per_node = min(gpus, 8)
    return per_node, gpus // per_node


def main():
    import importlib.metadata
    import platform

    from deepspeed.runtime.zero.stage3 import (estimate_zero3_model_states_mem_needs,
                                               estimate_zero3_model_states_mem_needs_all_cold)
    from deepspeed.runtime.zero.stage_1_and_2 import (estimate_zero2_model_states_mem_needs,
                                                      estimate_zero2_model_states_mem_needs_all_cold)

    models = {}
    rows = []
    for name, config in PRESETS.items():
        total, largest = counts(config)
        models[name] = {"parameters": total, "largest_layer_parameters": largest}
        for gpus in GPUS:
            per_node, nodes = layout(gpus)
            # The printing functions run too, so that a change in their signature shows here.
            with contextlib.redirect_stdout(io.StringIO()):
                estimate_zero2_model_states_mem_needs_all_cold(total, per_node, nodes)
                estimate_zero3_model_states_mem_needs_all_cold(total, largest, per_node, nodes)
            for offload in (True, False):
                cpu, gpu = estimate_zero2_model_states_mem_needs(total, per_node, nodes, cpu_offload=offload)
                rows.append([name, gpus, 2, offload, False, int(gpu), int(cpu)])
            # zero_init changes only the CPU figure; the rows keep zero_init=True (HF from_pretrained under a
            # ZeRO-3 config).
            for offload, offload_param in ((True, True), (True, False), (False, False)):
                cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
                    total, largest, per_node, nodes, cpu_offload=offload, cpu_offload_params=offload_param,
                    zero_init=True)
                rows.append([name, gpus, 3, offload, offload_param, int(gpu), int(cpu)])
    import torch
    import transformers

    out = {
        "what": "DeepSpeed's model-state estimators (estimate_zero2/zero3_model_states_mem_needs, the rows their "
                "*_all_cold functions print), per GPU and per CPU node, bytes",
        "assumptions": {
            "zero2_gpu": "2*P + int(18*P/N) (bf16 params + (2 bf16 grads + 4 fp32 grads + 4 fp32 params + 8 Adam)/N); "
                         "offload: 2*P",
            "zero3_gpu": "4*largest_layer + int(18*P/N); offload_optimizer: 4*largest_layer + int(2*P/N); "
                         "offload both: 4*largest_layer",
            "additional_buffer_factor": 1.5,
            "buffer_factor_applies_to": "the CPU figures only",
            "gpus_per_node": "min(N, 8), nodes N / gpus_per_node",
        },
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "deepspeed": importlib.metadata.version("deepspeed")},
        "command": "DS_ACCELERATOR=cpu python scripts/oracle/deepspeed_estimators.py",
        "date": datetime.date.today().isoformat(),
        "models": models,
        "columns": ["model", "gpus", "stage", "offload_optimizer", "offload_param", "gpu_bytes", "cpu_bytes"],
        "rows": rows,
    }
    with open(OUT, "w") as f:
        text = json.dumps(out, indent=1, sort_keys=True)
        for row in rows:  # one line per row
            text = text.replace(json.dumps(row, indent=1).replace("\n", "\n  "), json.dumps(row))
        f.write(text + "\n")
    print(f"{len(rows)} rows -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
