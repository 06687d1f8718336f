#!/usr/bin/env python3
"""Record transformers' loss on a tiny model of each family emu accepts, for tests/unit/hf_loss_test.cpp.

Each case is a tiny config.json (the family's own keys), weights given by a closed formula of the parameter's
Hugging Face name and element index (so no weights file is checked in: the test fills emu's units by the same
formula), and tokens and targets by another. The model runs in fp32 on the CPU with transformers' own modelling
code; the loss is the mean cross-entropy of its logits over every position (targets are the next token of the same
formula, so every position has one). Usage:

    /work/oracle-venv/bin/python scripts/oracle/hf_loss.py > tests/data/oracle/hf_loss.json

or, to re-record only some cases and keep the others as the fixture holds them (run from the repository root):

    /work/oracle-venv/bin/python scripts/oracle/hf_loss.py CASE... > /tmp/hf_loss.json && mv /tmp/hf_loss.json \
        tests/data/oracle/hf_loss.json
"""
import json
import math
import platform
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

BATCH, SEQ = 2, 32
FIXTURE = "tests/data/oracle/hf_loss.json"

LLAMA_SHAPE = {
    "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 384, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "hidden_act": "silu",
}
CASES = {
    "llama": dict(LLAMA_SHAPE, model_type="llama", tie_word_embeddings=False),
    "qwen2": dict(LLAMA_SHAPE, model_type="qwen2", tie_word_embeddings=True, use_sliding_window=False),
    "phi3": dict(LLAMA_SHAPE, model_type="phi3", tie_word_embeddings=False, resid_pdrop=0.0, embd_pdrop=0.0,
                 attention_dropout=0.0, sliding_window=None, pad_token_id=None),
    "gemma": dict(LLAMA_SHAPE, model_type="gemma", num_key_value_heads=1, head_dim=16, hidden_act="gelu_pytorch_tanh",
                  tie_word_embeddings=True, pad_token_id=None),
    # Phi-3.5-mini's longrope (head_dim 16: 8 factors each): s = 32 past original_max_position_embeddings = 16 picks
    # long_factor; 64 keeps short_factor. Both scale cos and sin by √(1 + ln(128 / 16) / ln 16) (factor from
    # max_position_embeddings / original).
    "phi3-longrope-long": dict(LLAMA_SHAPE, model_type="phi3", tie_word_embeddings=False, resid_pdrop=0.0,
                               embd_pdrop=0.0, attention_dropout=0.0, sliding_window=None, pad_token_id=None,
                               max_position_embeddings=128, original_max_position_embeddings=16,
                               rope_scaling={"type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
                                             "long_factor": [1.5, 2.5, 4.0, 6.0, 9.0, 13.0, 18.0, 24.0]}),
    "phi3-longrope-short": dict(LLAMA_SHAPE, model_type="phi3", tie_word_embeddings=False, resid_pdrop=0.0,
                                embd_pdrop=0.0, attention_dropout=0.0, sliding_window=None, pad_token_id=None,
                                max_position_embeddings=128, original_max_position_embeddings=64,
                                rope_scaling={"type": "longrope",
                                              "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
                                              "long_factor": [1.5, 2.5, 4.0, 6.0, 9.0, 13.0, 18.0, 24.0]}),
    # Phi-4-mini's partial rotary embedding (partial_rotary_factor 0.75: 12 of each head's 16 dimensions turn, 6
    # longrope factors each) with its tied head, s = 32 past original_max_position_embeddings = 16 (long factors).
    "phi3-partial-rotary": dict(LLAMA_SHAPE, model_type="phi3", tie_word_embeddings=True, resid_pdrop=0.0,
                                embd_pdrop=0.0, attention_dropout=0.0, sliding_window=None, pad_token_id=None,
                                partial_rotary_factor=0.75, max_position_embeddings=128,
                                original_max_position_embeddings=16,
                                rope_scaling={"type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
                                              "long_factor": [1.5, 2.5, 4.0, 6.0, 9.0, 13.0]}),
    # Gemma 2: a head_dim of its own (4 heads of 24 for h = 64), scores scaled by query_pre_attn_scalar^-1/2 with
    # 20 != 24, small caps so that both tanh soft-caps bend the values, four norms per block, the sliding window (64)
    # on every other layer no shorter than the sequence.
    "gemma2": dict(LLAMA_SHAPE, model_type="gemma2", num_key_value_heads=2, head_dim=24, query_pre_attn_scalar=20,
                   attn_logit_softcapping=2.0, final_logit_softcapping=3.0, sliding_window=64,
                   hidden_activation="gelu_pytorch_tanh", hidden_act="gelu_pytorch_tanh", tie_word_embeddings=True,
                   pad_token_id=None),
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_inner": 256, "n_head": 4, "n_layer": 2, "vocab_size": 384,
             "n_positions": 64, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
             "activation_function": "gelu_new"},
}


def value(name, index, ndim):
    """The formula the C++ test repeats: a phase from the name's bytes, a sine over the element index."""
    phase = (sum(name.encode()) % 1000) / 100.0
    x = math.sin(0.731 * index + phase)
    if ndim >= 2:
        return 0.2 * x
    if name.endswith("bias"):
        return 0.02 * x
    return 1.0 + 0.1 * x  # norm weights


def token(i, vocab):
    return (37 * i + 11) % vocab


def run(family, keys):
    config = AutoConfig.for_model(**keys)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    model.eval()  # no dropout; every probability is 0 anyway
    with torch.no_grad():
        # named_parameters lists a tied head once, under the embedding's name, as emu's layout does.
        for name, p in model.named_parameters():
            flat = torch.tensor([value(name, i, p.dim()) for i in range(p.numel())], dtype=torch.float64)
            p.copy_(flat.view(p.shape).to(p.dtype))
    vocab = keys["vocab_size"]
    tokens = torch.tensor([[token(b * SEQ + t, vocab) for t in range(SEQ)] for b in range(BATCH)])
    targets = torch.tensor([[token(b * SEQ + t + 1, vocab) for t in range(SEQ)] for b in range(BATCH)])
    logits = model(input_ids=tokens).logits
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1))
    params = sum(p.numel() for p in model.parameters())
    return {"family": family, "config": keys, "parameters": params, "loss": loss.item()}


def main():
    only = set(sys.argv[1:])
    unknown = only - set(CASES)
    if unknown:
        sys.exit(f"unknown case(s) {sorted(unknown)}; known: {list(CASES)}")
    out = {
        "what": "transformers' fp32 loss on tiny models with weights and tokens from closed formulas; recorded by "
                "scripts/oracle/hf_loss.py on the CPU",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "batch": BATCH, "seq": SEQ,
        "weights": "name phase p = (sum of the name's bytes mod 1000) / 100, x = sin(0.731 i + p) for element i of "
                   "the tensor as Hugging Face stores it: matrices 0.2 x, biases 0.02 x, norm weights 1 + 0.1 x",
        "tokens": "token i of the flattened [batch, seq] = (37 i + 11) mod V; target i = token i + 1",
        "cases": [run(f, k) for f, k in CASES.items() if not only or f in only],
    }
    if only:  # keep every other case as the fixture recorded it
        with open(FIXTURE) as f:
            kept = json.load(f)
        recorded = {c["family"]: c for c in out["cases"]}
        cases = [recorded.pop(c["family"], c) for c in kept["cases"]]
        kept["cases"] = cases + list(recorded.values())
        out = kept
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
