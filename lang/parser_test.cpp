#include "lang/parser.h"

#include <doctest/doctest.h>

using namespace piper;

namespace {
struct Parsed {
  SourceManager sm;
  DiagnosticEngine diags{sm};
  std::unique_ptr<ast::File> file;
  explicit Parsed(const std::string& text, ParseLimits limits = {}) {
    file = parse_strategy(sm.add("t.piper", text), sm, diags, limits);
  }
  std::string first() const { return diags.all().empty() ? "" : diags.render(diags.all().front()); }
};
}  // namespace

TEST_CASE("statements parse into the syntax tree") {
  Parsed p(
      "param pp = 4;\n"
      "mesh pp = pp, dp = world / pp;\n"
      "place layers[0..3], head on pp = 1;\n"
      "replicate * over dp zero 3 bucket 25MiB on stream comm;\n"
      "shard layers[*].moe.experts over ep = 8;\n"
      "order fwd(i) || bwd(i - 1) on stream comm;\n"
      "order bwd(s, i) -> fwd(s, i + pp - s);\n"
      "for s in 0..pp-1 { if s % 2 == 0 { recompute layers[s]; } else if s > 2 { precision bf16; } }\n");
  REQUIRE_MESSAGE(p.file, p.first());
  REQUIRE(p.file->stmts.size() == 8);
  const auto& mesh = std::get<ast::MeshStmt>(p.file->stmts[1]->node);
  CHECK(mesh.axes.size() == 2);
  CHECK(mesh.axes[1].value->kind == ast::Expr::Kind::Binary);
  const auto& place = std::get<ast::PlaceStmt>(p.file->stmts[2]->node);
  CHECK(place.mode == ast::PlaceStmt::Mode::On);
  REQUIRE(place.regions.size() == 2);
  CHECK(place.regions[0].parts[0].index == ast::SelectorPart::Index::Range);
  const auto& rep = std::get<ast::ReplicateStmt>(p.file->stmts[3]->node);
  CHECK(rep.regions[0].whole_model);
  CHECK(rep.bucket->int_value == 25 << 20);
  CHECK(rep.stream->name == "comm");
  const auto& shard = std::get<ast::ShardStmt>(p.file->stmts[4]->node);
  CHECK(shard.regions[0].parts.size() == 3);
  CHECK(shard.axis.size->int_value == 8);
  const auto& overlap = std::get<ast::OrderStmt>(p.file->stmts[5]->node);
  REQUIRE(overlap.chain.size() == 1);
  CHECK(overlap.chain[0].size() == 2);
  const auto& chain = std::get<ast::OrderStmt>(p.file->stmts[6]->node);
  CHECK(chain.chain.size() == 2);
  const auto& loop = std::get<ast::ForStmt>(p.file->stmts[7]->node);
  const auto& cond = std::get<ast::IfStmt>(loop.body[0]->node);
  REQUIRE(cond.else_block.size() == 1);
  CHECK(std::holds_alternative<ast::IfStmt>(cond.else_block[0]->node));
}

TEST_CASE("a missing semicolon is reported after the previous token") {
  Parsed p("mesh pp = 4\nsplit batch into 2;\n");
  CHECK(!p.file);
  CHECK(p.first().find("t.piper:1:12: error: expected ';' after '4'") == 0);
}

TEST_CASE("every syntax error of a file is reported in one run") {
  Parsed p("mesh pp = ;\nplace embed on pp = 0\nsplit batch into 2;\norder fwd(0, 0) -> ;\n");
  CHECK(!p.file);
  CHECK(p.diags.error_count() >= 3);
}

TEST_CASE("lexical errors are named in plain words") {
  Parsed bad("mesh pp = 4 @ 2;\n");
  CHECK(bad.first().find("unexpected character '@'") != std::string::npos);
  Parsed str("use \"1f1b.piper;\n");
  CHECK(str.first().find("unterminated string") != std::string::npos);
}

TEST_CASE("deep nesting and huge inputs are errors, not crashes") {
  Parsed deep("let x = " + std::string(10000, '(') + "1" + std::string(10000, ')') + ";\n");
  CHECK(!deep.file);
  CHECK(deep.first().find("nested more than 64 levels deep") != std::string::npos);

  std::string chain = "let x = 1";
  for (int i = 0; i < 5000; ++i) chain += " + 1";
  Parsed longchain("mesh pp = 1;\n" + chain + ";\n");
  CHECK(!longchain.file);
  CHECK(longchain.first().find("2:1: error: this statement nests more than") != std::string::npos);

  // A few hundred terms, or a run of unary minus signs, are within the limits.
  std::string flat = "let x = 1", minus = "let y = ";
  for (int i = 0; i < 600; ++i) flat += " + 1";
  for (int i = 0; i < 300; ++i) minus += "- ";
  Parsed fine(flat + ";\n" + minus + "1;\n");
  CHECK_MESSAGE(fine.file, fine.first());

  ParseLimits small;
  small.max_bytes = 10;
  Parsed big("mesh pp = 4;\n", small);
  CHECK(big.first().find("the limit is 10") != std::string::npos);
}

TEST_CASE("integer literals that overflow are errors") {
  Parsed p("let x = 99999999999999999999;\nlet y = 9999999999GiB;\n");
  CHECK(!p.file);
  CHECK(p.diags.error_count() == 2);
  CHECK(p.first().find("does not fit in a 64-bit integer") != std::string::npos);
}

TEST_CASE("malformed UTF-8 is an error at the bad byte") {
  Parsed p("mesh pp = 2;\n# caf\xc3\xa9 ok\nsplit batch into \xff;\n");
  CHECK(!p.file);
  CHECK(p.first().find("t.piper:3:18: error: strategy is not valid UTF-8") == 0);
  Parsed ok("# caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\nmesh pp = 2;\n");
  CHECK(ok.file);
}
