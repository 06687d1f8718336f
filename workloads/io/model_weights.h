// Model weights as safetensors under their Hugging Face names, as Hugging Face's save_pretrained writes them and
// from_pretrained reads them.
//
// One tensor per parameter of layout.h, under its Hugging Face name and shape (GPT-2's Conv1D weights in their
// [in, out] layout), so a file written here loads into Hugging Face's LlamaForCausalLM or GPT2LMHeadModel and
// a Hugging Face checkpoint of the same shapes loads here, giving the same model. A tied head is the token
// embedding and is written once, under the embedding's name: there is no lm_head.weight, as in Hugging Face's
// own files.
//
// Loading finds every expected parameter by name, accepts it with or without the base model's prefix
// ("transformer." for GPT-2, "model." for Llama: Hugging Face's gpt2 checkpoint says "h.0.attn.c_attn.weight",
// "wte.weight"), checks its shape exactly and its dtype (F32, BF16 or F16), and widens it to fp32. Tensors a
// Hugging Face checkpoint may hold that are not parameters here are ignored: lm_head.weight when the head is tied,
// GPT-2's attention-mask buffers h.N.attn.bias and h.N.attn.masked_bias, and older Llama checkpoints'
// model.layers.N.self_attn.rotary_emb.inv_freq. Anything else is an error. Every error is an InputError naming
// the file and the tensor.
//
// Sharded checkpoints (model.safetensors.index.json with several files) are not read: pass one file.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "emu/dtype.h"
#include "workloads/model/config.h"

namespace emu::io {

using WeightsMetadata = std::map<std::string, std::string, std::less<>>;

// Writes every parameter of `config`'s model to `path` atomically (write_safetensors). `unit_values`:
// [units][layout(u).count] fp32, in layout.h's order (unit 0 the root, unit l block l). `dtype`: kF32 stores the
// values exactly, kBF16 rounds them to nearest even. "format": "pt" is added to `metadata` unless it names a
// format, as Hugging Face's loader expects it. InputError if the file cannot be written; a check fails if
// unit_values does not match the layouts.
void save_model_weights(const std::filesystem::path& path, const model::ModelConfig& config,
                        const std::vector<std::vector<float>>& unit_values, DType dtype,
                        const WeightsMetadata& metadata = {});

// Reads `path` and returns the fp32 values of every unit of `config`'s model, [units][layout(u).count], ready to
// narrow to the compute dtype and bind. InputError naming the file for a missing tensor (up to 5 listed), a shape
// that differs from the expected one (both printed), a dtype other than F32, BF16 or F16, a parameter present
// both with and without the base prefix, or tensors that are not parameters here (up to 5 listed).
std::vector<std::vector<float>> load_model_weights(const std::filesystem::path& path, const model::ModelConfig& config);

}  // namespace emu::io
