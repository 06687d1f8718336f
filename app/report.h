// What rank 0 prints at the end of a run: a memory table and a traffic table, one row per strategy, shrunk and
// full-scale figures side by side with the analytic prediction, then a few sentences that answer the question.
#pragma once

#include <string>

#include "app/run.h"

namespace emu::app {

std::string format_report(const RunReport& report);
// pp's schedule, bubble fraction, every stage's peak and its point-to-point bytes; empty without pp.
std::string format_pipeline(const RunReport& report);
// tp's split, vocabulary padding (and its bytes), recipe and all-reduces (tp_report.cpp); empty without tp.
std::string format_tensor(const RunReport& report);
// "ranks 1, 3 of 4 run out of memory; rank 1 first in backward, block 3 (tried to allocate 8.00 GiB [2.00 MiB] ...":
// full-scale bytes first, a shrunk run's own in brackets; a plan names its roles ("any of the 64 ranks").
std::string oom_summary(const RunReport& report, const StrategyOutcome& outcome);
// "On 8 × A100-40GB a llama2-13b full fine-tune with mixed-precision AdamW fits only with zero3, fsdp; ..."
std::string format_conclusion(const RunReport& report);

}  // namespace emu::app
