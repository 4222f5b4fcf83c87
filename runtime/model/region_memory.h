// Measures each region's activation memory (saved between forward and backward, forward and backward
// peaks) with the counting allocator, at 1, 2 and 4 samples: the manifest's `memory` facts, which the
// memory model reads. Deterministic (one intra-op thread, allocation sizes only).
#pragma once
#include <string>

namespace piper::runtime {

// The manifest JSON (text) of the model at `path` with `memory` (fp32) and `memory_bf16` (bf16
// parameters and activations) filled in for every region that has a module and an input shape;
// the last pipeline region is measured with the loss (cross-entropy), as the executor runs it.
// Regions with identical parameter shapes and activation specs are measured once.
std::string measure_manifest(const std::string& path);

// `manifest` (the JSON text of a model too large to build) with the memory facts taken from
// measuring the model at `probe`, a smaller one of the same shapes (one block): regions match by
// kind, activation specs and parameter shapes; a region with no match is left without facts.
std::string measure_manifest_like(const std::string& probe, const std::string& manifest);

}  // namespace piper::runtime
