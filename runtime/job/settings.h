// A run's resolved settings, recorded in its checkpoints, and what --resume may change of them.
#pragma once
#include <string>
#include <vector>

#include "runtime/job/train.h"

namespace piper::runtime {

// The settings that make a run the run it is, as JSON text: the optimizer's recipe (refused to
// change silently on --resume) and the data (changing them only changes which samples come next).
std::string run_settings(const TrainOptions& o);

struct SettingsChanges {
  std::vector<std::string> recipe;  // "lr 0.001 -> 0.002": the run would no longer be the one checkpointed
  std::vector<std::string> data;    // said, and accepted
};
// What differs between a checkpoint's settings and this run's (both from run_settings; a checkpoint
// written before settings were recorded has none, and nothing differs).
SettingsChanges compare_settings(const std::string& saved, const std::string& now);

}  // namespace piper::runtime
