// Checkpoints by the model's names, not by ranks: each rank writes the parameter and optimizer
// pieces it owns (a stage, a ZeRO shard, its experts) as element ranges of named parameters, and a
// manifest lists them, so any plan of the same model loads any checkpoint (each rank reads what
// covers what it holds). Atomic: written under a temporary name, fsynced, then renamed; the
// previous checkpoint is removed only once the new one is complete. Runtime-internal (LibTorch).
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "runtime/exec/stage_params.h"

namespace piper::runtime {

// DIR/step-NNNNNNNN: `meta` (step, optimizer steps, run settings) goes into its manifest.json.
// Every rank calls it with its own pieces; `barrier` synchronises all ranks. Returns the path.
std::string write_checkpoint(const std::string& dir, int64_t step, const std::vector<StatePiece>& mine,
                             nlohmann::json meta, int rank, int world, const std::function<void()>& barrier);

// The newest complete checkpoint under DIR (or DIR itself when it is one); throws when none.
std::string latest_checkpoint(const std::string& dir);

// Reads checkpoint `path`, fills every piece of `want` (values and, where defined, moments) from
// the entries that cover it, checking sizes and checksums; returns the manifest. `model_params`
// ({region, parameter}: every parameter of the model) must be exactly the checkpoint's. Throws
// with a clear message on anything missing, corrupt or mismatched.
nlohmann::json read_checkpoint(const std::string& path, std::vector<StatePiece>& want,
                               const std::set<std::pair<std::string, std::string>>& model_params);

}  // namespace piper::runtime
