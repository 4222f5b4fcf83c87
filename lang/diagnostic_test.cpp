#include "lang/diagnostic.h"

#include <doctest/doctest.h>

#include "lang/suggest.h"

using namespace piper;

TEST_CASE("an error prints file:line:col, the source line and a caret under the range") {
  SourceManager sm;
  FileId f = sm.add("s.piper", "mesh pp = 4;\nplace layrs[*] over pp;\n");
  DiagnosticEngine diags(sm);
  diags.error(SourceLoc{f, 2, 7, 5}, "unknown region 'layrs'").note(SourceLoc{f, 1, 1, 4}, "mesh here");
  CHECK(diags.render(diags.all().front()) ==
        "s.piper:2:7: error: unknown region 'layrs'\n"
        "place layrs[*] over pp;\n"
        "      ^~~~~\n"
        "s.piper:1:1: note: mesh here\n"
        "mesh pp = 4;\n"
        "^~~~\n");
  CHECK(diags.error_count() == 1);
}

TEST_CASE("notes without a location print without a file, context notes follow every error") {
  SourceManager sm;
  FileId f = sm.add("a.piper", "use \"b.piper\";\n");
  DiagnosticEngine diags(sm);
  diags.push_context(SourceLoc{f, 1, 1, 3}, "in strategy \"b.piper\" used here");
  diags.error(SourceLoc{}, "something").note(SourceLoc{}, "a hint");
  diags.pop_context();
  std::string text = diags.render(diags.all().front());
  CHECK(text.find("error: something\n") == 0);
  CHECK(text.find("a.piper:1:1: note: in strategy \"b.piper\" used here") != std::string::npos);
  CHECK(text.find("note: a hint\n") != std::string::npos);
}

TEST_CASE("source locations from byte offsets") {
  SourceManager sm;
  FileId f = sm.add("x", "ab\ncde\n");
  CHECK(sm.loc_at(f, 0) == SourceLoc{f, 1, 1, 1});
  CHECK(sm.loc_at(f, 4) == SourceLoc{f, 2, 2, 1});
  CHECK(sm.line(f, 2) == "cde");
  CHECK(sm.line(f, 9).empty());
}

TEST_CASE("did-you-mean suggests only close names") {
  CHECK(edit_distance("layrs", "layers") == 1);
  CHECK(closest_match("layrs", {"embed", "layers", "head"}) == "layers");
  CHECK(!closest_match("zzz", {"embed", "layers", "head"}));
  CHECK(did_you_mean("compte", {"compute", "comm"}) == "; did you mean 'compute'?");
}
