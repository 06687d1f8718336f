// Descriptions of the GPUs and links people train on: what a step-time or collective-cost estimate needs to know
// about the hardware, each figure with its published source.
//
// The built-in descriptions are the JSON files in hardware/ (compiled in), one per GPU and node design:
// a100-40gb-sxm, a100-80gb-sxm, a100-80gb-pcie, h100-80gb-sxm, h100-80gb-pcie, h200-141gb-sxm. A user copies one,
// edits it for their cluster and passes the file's path where a name is accepted.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace emu {

// One kind of link as a GPU sees it: its bandwidth each way and the latency of one step of a collective over it.
struct LinkSpec {
  std::string link;                   // "NVLink 4 through NVSwitch"
  double gb_per_s_per_direction = 0;  // per GPU, 10^9 bytes per second
  double step_latency_us = 0;         // 0 for the host link, where none is stated
};

struct Hardware {
  std::string name;
  std::string description;
  std::string cap;        // the named cap (cap_spec.h) of the same memory, or empty
  double memory_gib = 0;  // nominal: the datasheets' "40GB" of HBM are 2^30-byte gigabytes
  double bf16_dense_tflops = 0;
  double fp32_tflops = 0;
  double hbm_gb_per_s = 0;
  int gpus_per_node = 0;
  LinkSpec intra_node;                         // between the GPUs of a node
  LinkSpec inter_node;                         // between nodes, per GPU
  LinkSpec host;                               // GPU to host memory (offload)
  double call_latency_us = 0;                  // per collective call, besides its steps
  std::map<std::string, std::string> sources;  // what each group of figures is taken from
  std::string origin;                          // "built-in" or the file's path
};

const std::vector<Hardware>& builtin_hardware();
// A built-in name or the path of a JSON file in the same form. Throws InputError naming the bad value and the
// accepted names, or the file's missing or out-of-range field.
Hardware find_hardware(std::string_view name_or_path);
// Parses one description; `origin` names it in errors. Throws InputError.
Hardware parse_hardware(std::string_view json_text, std::string_view origin);
std::string hardware_names();  // "a100-40gb-sxm, a100-80gb-sxm, ..."

}  // namespace emu
