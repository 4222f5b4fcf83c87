// "Did you mean": the closest candidate by edit distance, when it is close enough to be a typo.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace piper {

size_t edit_distance(std::string_view a, std::string_view b);
std::optional<std::string> closest_match(std::string_view word, const std::vector<std::string>& candidates);
// ", did you mean 'x'?" or "".
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace piper
