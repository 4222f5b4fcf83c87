#include "lang/diagnostic_verifier.h"

#include <doctest/doctest.h>

using namespace piper;

TEST_CASE("the verifier accepts exactly the expected diagnostics") {
  SourceManager sm;
  FileId f = sm.add("t.piper",
                    "mesh pp = 0;  # expected-error {{size 0}}\n"
                    "# expected-note@+1 {{here}}\n"
                    "split batch into 2;\n");
  FileId cmd = sm.add("<command line>", "--set x=1");
  DiagnosticEngine diags(sm);
  diags.error(SourceLoc{f, 1, 11, 1}, "mesh axis 'pp' has size 0").note(SourceLoc{f, 3, 1, 5}, "split here");
  CHECK(verify_diagnostics(diags).empty());

  diags.error(SourceLoc{cmd, 1, 7, 3}, "--set x: no such parameter");
  auto problems = verify_diagnostics(diags);
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].find("unexpected <command line>:1:7: error: --set x") == 0);
}

TEST_CASE("the verifier reports expectations that were not produced, with their line") {
  SourceManager sm;
  sm.add("t.piper", "split batch into 0;  # expected-error {{cannot split}}\n# expected-error@cmdline {{--set}}\n");
  DiagnosticEngine diags(sm);
  auto problems = verify_diagnostics(diags);
  REQUIRE(problems.size() == 2);
  CHECK(problems[0] == "t.piper:1: expected error \"cannot split\" was not produced");
  CHECK(problems[1] == "t.piper:2: expected error \"--set\" was not produced");
}

TEST_CASE("an error on the wrong line does not satisfy an expectation") {
  SourceManager sm;
  FileId f = sm.add("t.piper", "mesh pp = 0;  # expected-error {{size 0}}\nsplit batch into 2;\n");
  DiagnosticEngine diags(sm);
  diags.error(SourceLoc{f, 2, 1, 1}, "mesh axis 'pp' has size 0");
  CHECK(verify_diagnostics(diags).size() == 2);
}
