#!/usr/bin/env python3
"""Records what Hugging Face's Llama, Qwen2, Phi-3, Gemma, Gemma 2 and GPT-2 modelling code keeps for backward, for emu's
tests.

Builds tiny LlamaForCausalLM and GPT2LMHeadModel models (transformers, PyTorch, on the CPU) and measures, per
precision (fp32; bf16 = the model's parameters in bf16, as FSDP's param_dtype and DeepSpeed's bf16 run it;
autocast = fp32 parameters under torch.autocast(bfloat16), as PyTorch DDP's mixed recipe and the Trainer's
bf16=True without DeepSpeed run it) and attention implementation (sdpa, eager), with and without gradient
checkpointing, with use_cache=False as the Trainer trains (TrainingArguments.use_cache defaults to False and
Trainer.__init__ writes it into model.config):

  - per decoder block, the bytes its forward saves for backward: every tensor handed to autograd's
    saved_tensors_hooks while the block runs, deduplicated by storage, parameters left out, and apart from them
    the storages several blocks save (Llama's rotary cos and sin);
  - for the loss as the Trainer computes it (lm_head, then the model's loss_function, ForCausalLMLoss), the bytes
    live above the start at the forward's peak, after the forward, and at the peak of its backward down to the
    gradient of the head's input, through a dispatch mode that follows every storage an op creates until it is
    freed.

Writes tests/data/oracle/hf_saved_activations.json with the versions used. Not part of emu's build or CI: run it
by hand with a Python that has torch and transformers (e.g. /work/oracle-venv/bin/python).
"""

import argparse
import contextlib
import json
import platform
import weakref
from pathlib import Path

import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import (Gemma2Config, Gemma2ForCausalLM, GemmaConfig, GemmaForCausalLM, GPT2Config, GPT2LMHeadModel,
                          LlamaConfig, LlamaForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM)

BATCH, SEQ = 2, 32

# Shapes chosen so that every term of emu's closed form is distinguishable: h ≠ F ≠ V ≠ s, GQA in one Llama.
LLAMA = dict(hidden_size=64, intermediate_size=176, num_attention_heads=4, vocab_size=384, num_hidden_layers=2,
             max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False, attention_dropout=0.0)
# Gemma 2 at Llama's shapes: a head_dim of its own (4 heads of 24 for h = 64), query_pre_attn_scalar, both soft-caps,
# the sliding window (every other layer) no shorter than the sequence. transformers runs it with eager attention
# only (Gemma2PreTrainedModel._supports_sdpa is False).
GEMMA2 = dict(head_dim=24, query_pre_attn_scalar=20, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
              sliding_window=64)
# The styles recorded under autocast too (fp32 parameters under torch.autocast(bfloat16)).
AUTOCAST_STYLES = ("llama", "gpt2", "gemma2")
GPT2 = dict(n_embd=64, n_inner=256, n_head=4, vocab_size=384, n_layer=2, n_positions=64,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


def build(style, kv_heads, dtype, attention):
    torch.manual_seed(0)
    if style == "llama":
        config = LlamaConfig(num_key_value_heads=kv_heads, **LLAMA)
        model = LlamaForCausalLM(config)
    elif style == "qwen2":  # Llama's shapes; q/k/v biases
        model = Qwen2ForCausalLM(Qwen2Config(num_key_value_heads=kv_heads, **LLAMA))
    elif style == "gemma":  # Llama's shapes; (1 + w) RMSNorm, √h embedding scale, GeGLU, tied head
        model = GemmaForCausalLM(GemmaConfig(num_key_value_heads=kv_heads, head_dim=16, pad_token_id=None,
                                             hidden_act="gelu_pytorch_tanh", **LLAMA))
    elif style == "gemma2":
        model = Gemma2ForCausalLM(Gemma2Config(num_key_value_heads=kv_heads, pad_token_id=None,
                                               hidden_activation="gelu_pytorch_tanh", **GEMMA2, **LLAMA))
    elif style == "phi3":  # Llama's shapes; fused qkv_proj and gate_up_proj, no sliding window
        model = Phi3ForCausalLM(Phi3Config(num_key_value_heads=kv_heads, pad_token_id=None, **LLAMA))
    else:
        config = GPT2Config(**GPT2)
        model = GPT2LMHeadModel(config)
    model.config._attn_implementation = attention
    model.set_attn_implementation(attention) if hasattr(model, "set_attn_implementation") else None
    model.config.use_cache = False  # as the Trainer sets it (trainer.py: model.config.use_cache = args.use_cache)
    return model.to(torch.float32 if dtype == "autocast" else dtype).train()


def autocast(dtype):
    """torch.autocast(bfloat16) on the CPU for the autocast recipe, else nothing. CPU autocast casts fewer ops to
    fp32 than CUDA's (pow, softmax, layer_norm stay at the input's dtype); emu follows CUDA's lists and its test
    names each difference."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "autocast" else contextlib.nullcontext()


def dtype_name(dtype):
    return dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")


class SavedBytes:
    """Bytes autograd saves while a scope is open, deduplicated by storage, parameters excluded."""

    def __init__(self, params):
        self.params = {p.untyped_storage().data_ptr() for p in params}
        self.scope = None
        self.seen = {}  # scope -> {storage ptr: bytes}

    def pack(self, t):
        if self.scope is not None and isinstance(t, torch.Tensor):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in self.params:
                self.seen.setdefault(self.scope, {})[ptr] = t.untyped_storage().nbytes()
        return t

    def shared(self):
        """Storages more than one block saved (Llama's rotary cos and sin): counted once, apart from the blocks."""
        scopes = list(self.seen.values())
        return {p: b for i, a in enumerate(scopes) for p, b in a.items() if any(p in o for o in scopes[i + 1:])}

    def total(self, scope):
        shared = self.shared()
        return sum(b for p, b in self.seen.get(scope, {}).items() if p not in shared)


class Live(TorchDispatchMode):
    """Follows every storage an op creates until it is freed: bytes live now and the peak since reset()."""

    def __init__(self, existing):
        super().__init__()
        self.live = 0
        self.peak = 0
        self.known = {t.untyped_storage().data_ptr() for t in existing}  # not created here: never counted

    def reset(self):
        self.peak = self.live

    def _free(self, ptr, nbytes):
        self.known.discard(ptr)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                s = t.untyped_storage()
                ptr = s.data_ptr()
                if ptr not in self.known and s.nbytes() > 0:
                    self.known.add(ptr)
                    self.live += s.nbytes()
                    weakref.finalize(s, self._free, ptr, s.nbytes())
        self.peak = max(self.peak, self.live)
        return out


def block_bytes(style, kv_heads, dtype, attention, checkpoint):
    model = build(style, kv_heads, dtype, attention)
    if checkpoint:
        model.gradient_checkpointing_enable()
    blocks = model.transformer.h if style == "gpt2" else model.model.layers
    saved = SavedBytes(model.parameters())
    for i, block in enumerate(blocks):
        block.register_forward_pre_hook(lambda m, a, i=i: setattr(saved, "scope", i))
        block.register_forward_hook(lambda m, a, o: setattr(saved, "scope", None))
    ids = torch.randint(0, 384, (BATCH, SEQ))
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t), autocast(dtype):
        out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return [saved.total(i) for i in range(len(blocks))], sum(saved.shared().values())


def loss_bytes(style, dtype):
    """The loss from the final hidden states on: lm_head (weight frozen, so its gradient is not counted) and the
    model's own loss_function, as the Trainer's compute_loss calls it."""
    model = build(style, 4, dtype, "sdpa")
    head = model.lm_head
    head.weight.requires_grad_(False)
    hidden = torch.randn(BATCH, SEQ, model.config.hidden_size, dtype=torch.float32 if dtype == "autocast" else dtype,
                         requires_grad=True)
    labels = torch.randint(0, model.config.vocab_size, (BATCH, SEQ))
    live = Live([hidden, labels, *model.parameters()])
    with live:
        start = live.live
        live.reset()
        with autocast(dtype):
            logits = head(hidden)
            cap = getattr(model.config, "final_logit_softcapping", None)
            if cap is not None:  # Gemma2ForCausalLM.forward soft-caps the logits before its loss
                logits = logits / cap
                logits = torch.tanh(logits)
                logits = logits * cap
            loss = model.loss_function(logits=logits, labels=labels, vocab_size=model.config.vocab_size)
        del logits  # the Trainer drops the model's outputs once compute_loss returns the loss
        forward_peak = live.peak - start
        after_forward = live.live - start
        live.reset()
        loss.backward()
        backward_peak = live.peak - start
    return {"forward_peak": forward_peak, "after_forward": after_forward, "backward_peak": backward_peak}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[2] /
                                             "tests/data/oracle/hf_saved_activations.json"))
    parser.add_argument("--only", help="re-record only this style, keeping the others as --out holds them")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cases = []
    for style, kv in (("llama", 4), ("llama", 2), ("gpt2", 4), ("qwen2", 4), ("qwen2", 2), ("phi3", 4), ("phi3", 2),
                     ("gemma", 4), ("gemma", 2), ("gemma2", 4), ("gemma2", 2)):
        if args.only and style != args.only:
            continue
        # autocast: the recipe of PyTorch DDP (emu's ddp and ddp-zero in mixed precision), recorded for the two
        # families the PyTorch oracles train and for Gemma 2, whose sandwich norms cast back to a bf16 input.
        dtypes = (torch.float32, torch.bfloat16) + (("autocast",) if style in AUTOCAST_STYLES else ())
        for dtype in dtypes:
            for attention in (("eager",) if style == "gemma2" else ("sdpa", "eager")):
                for checkpoint in (False, True):
                    per_block, shared = block_bytes(style, kv, dtype, attention, checkpoint)
                    cases.append({"style": style, "kv_heads": kv,
                                  "dtype": dtype_name(dtype), "attention": attention,
                                  "checkpoint": checkpoint, "saved_per_block": per_block,
                                  "shared_by_blocks": shared})
    losses = []
    for style in ("llama", "gpt2", "gemma2"):
        if args.only and style != args.only:
            continue
        for dtype in (torch.float32, torch.bfloat16) + (("autocast",) if style in AUTOCAST_STYLES else ()):
            losses.append({"style": style, "dtype": dtype_name(dtype), **loss_bytes(style, dtype)})
    shapes = {"batch": BATCH, "seq": SEQ, "llama": LLAMA, "gemma2": GEMMA2, "gpt2": GPT2}
    if args.only:  # the other styles' cases as recorded before
        kept = json.loads(Path(args.out).read_text())
        cases = [c for c in kept["blocks"] if c["style"] != args.only] + cases
        losses = [c for c in kept["loss"] if c["style"] != args.only] + losses
    doc = {
        "what": "bytes Hugging Face modelling code saves for backward per decoder block, and the Trainer loss's "
                "live bytes; recorded by scripts/oracle/saved_activations.py on the CPU",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "use_cache": False,
        "shapes": shapes, "blocks": cases, "loss": losses,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
