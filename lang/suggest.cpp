#include "lang/suggest.h"

#include <algorithm>
#include <numeric>

namespace piper {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), 0);
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::optional<std::string> closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  std::optional<std::string> best;
  // About one typo per three letters (at least two), but never a rewrite of the whole word.
  size_t limit = std::min(std::max<size_t>(2, word.size() / 3), word.size() > 0 ? word.size() - 1 : 0);
  size_t best_d = limit + 1;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  if (best) return best;
  // `maximum` for `max`: a candidate that the word starts with (or that starts with the word).
  for (const auto& c : candidates)
    if (c.size() >= 3 && word.size() >= 3 && (word.rfind(c, 0) == 0 || c.rfind(word, 0) == 0)) return c;
  return std::nullopt;
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  auto m = closest_match(word, candidates);
  return m ? "; did you mean '" + *m + "'?" : "";
}

}  // namespace piper
