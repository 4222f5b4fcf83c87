#include "lang/parser.h"

#include <fmt/format.h>

#include <charconv>
#include <regex>
#include <set>

#include "PiperLexer.h"
#include "PiperParser.h"
#include "antlr4-runtime.h"
#include "lang/internal_error.h"
#include "lang/units.h"

namespace piper {
namespace {

using G = grammar::PiperParser;

SourceLoc tok_loc(FileId f, const antlr4::Token* t) {
  auto len = t->getStopIndex() >= t->getStartIndex() ? t->getStopIndex() - t->getStartIndex() + 1 : 1;
  return SourceLoc{f, static_cast<uint32_t>(t->getLine()),
                   static_cast<uint32_t>(t->getCharPositionInLine() + 1), static_cast<uint32_t>(len)};
}

// A context's location: its first token, underlining up to its last token when on the same line.
SourceLoc ctx_loc(FileId f, antlr4::ParserRuleContext* c) {
  SourceLoc loc = tok_loc(f, c->getStart());
  const antlr4::Token* stop = c->getStop();
  if (stop && stop->getLine() == c->getStart()->getLine() && stop->getStopIndex() >= c->getStart()->getStartIndex())
    loc.length = static_cast<uint32_t>(stop->getStopIndex() - c->getStart()->getStartIndex() + 1);
  return loc;
}

// ANTLR's wording ("mismatched input", "extraneous input", token-set dumps) rewritten for users.
std::string friendly_token_set(std::string set) {
  static const std::pair<const char*, const char*> kWords[] = {
      {"NAME", "a name"}, {"INT", "a number"}, {"SIZE", "a size"}, {"STRING", "a string"},
      {"<EOF>", "end of file"}};
  for (auto [from, to] : kWords) {
    size_t pos;
    while ((pos = set.find(from)) != std::string::npos) set.replace(pos, strlen(from), to);
  }
  if (set.size() > 2 && set.front() == '{') {
    size_t commas = std::count(set.begin(), set.end(), ',');
    if (commas >= 4) return "";  // a long list helps nobody
    set = set.substr(1, set.size() - 2);
    size_t last = set.rfind(", ");
    if (last != std::string::npos) set.replace(last, 2, " or ");
  }
  return set;
}

std::string describe(const antlr4::Token* t) {
  if (!t || t->getType() == antlr4::Token::EOF) return "end of file";
  return fmt::format("'{}'", t->getText());
}

class SyntaxErrors : public antlr4::BaseErrorListener {
 public:
  SyntaxErrors(FileId f, DiagnosticEngine& d, antlr4::TokenStream* tokens, std::set<size_t> lexical_lines)
      : file_(f), diags_(d), tokens_(tokens), lexical_lines_(std::move(lexical_lines)) {}
  void syntaxError(antlr4::Recognizer*, antlr4::Token* offending, size_t line, size_t col,
                   const std::string& msg, std::exception_ptr) override {
    SourceLoc loc = offending ? tok_loc(file_, offending) : SourceLoc{file_, uint32_t(line), uint32_t(col + 1), 1};
    std::smatch m;
    std::string text;
    if (std::regex_search(msg, m, std::regex("^missing (.*) at "))) {
      // "missing ';'" belongs right after the previous token, where clang puts it.
      if (auto* prev = previous(offending)) {
        loc = tok_loc(file_, prev);
        loc.col += loc.length;
        loc.length = 1;
      }
      std::string want = friendly_token_set(m[1].str());
      text = fmt::format("expected {}", want.empty() ? "more input" : want);
      if (auto* prev = previous(offending)) text += fmt::format(" after {}", describe(prev));
    } else if (std::regex_search(msg, m, std::regex("^(?:mismatched|extraneous) input .* expecting (.*)$")) &&
               m[1].str().find("';'") != std::string::npos && previous(offending)) {
      // A statement could have ended here: the likely fix is the ';' after the previous token.
      const antlr4::Token* prev = previous(offending);
      loc = tok_loc(file_, prev);
      loc.col += loc.length;
      loc.length = 1;
      text = fmt::format("expected ';' after {}", describe(prev));
    } else if (std::regex_search(msg, m, std::regex("^(?:mismatched|extraneous) input .* expecting (.*)$"))) {
      std::string want = friendly_token_set(m[1].str());
      text = want.empty() ? fmt::format("unexpected {}", describe(offending))
                          : fmt::format("expected {}, found {}", want, describe(offending));
    } else if (msg.rfind("no viable alternative", 0) == 0) {
      text = fmt::format("unexpected {}: this does not start or continue a valid statement", describe(offending));
    } else {
      text = msg;
    }
    if (loc == last_loc_) return;  // ANTLR's recovery can report one spot twice
    // A stray character or an open string already explains what the parser trips over next.
    if (!lexical_lines_.empty() &&
        (lexical_lines_.count(loc.line) || (offending && offending->getType() == antlr4::Token::EOF)))
      return;
    last_loc_ = loc;
    diags_.error(loc, text);
  }

 private:
  const antlr4::Token* previous(const antlr4::Token* t) const {
    if (!t) return nullptr;
    for (ssize_t i = static_cast<ssize_t>(t->getTokenIndex()) - 1; i >= 0; --i) {
      const antlr4::Token* p = tokens_->get(i);
      if (p->getChannel() == antlr4::Token::DEFAULT_CHANNEL) return p;
    }
    return nullptr;
  }
  FileId file_;
  DiagnosticEngine& diags_;
  antlr4::TokenStream* tokens_;
  std::set<size_t> lexical_lines_;
  SourceLoc last_loc_;
};

// Turns ANTLR's parse tree into our syntax tree. Only reached for trees without syntax errors.
class Builder {
 public:
  explicit Builder(FileId f) : f_(f) {}

  ast::Block block(const std::vector<G::StmtContext*>& stmts) {
    ast::Block out;
    for (auto* s : stmts) out.push_back(stmt(s));
    return out;
  }

  ast::OrderStmt order_stmt(G::OrderStmtContext* p) {
    ast::OrderStmt o;
    for (auto* g : p->chain()->group()) {
      ast::TaskGroup group;
      for (auto* t : g->task()) {
        ast::Task task{t->NAME()->getText(), {}, ctx_loc(f_, t)};
        for (auto* e : t->expr()) task.args.push_back(expr(e));
        group.push_back(std::move(task));
      }
      o.chain.push_back(std::move(group));
    }
    o.stream = stream(p->streamClause());
    return o;
  }

  ast::StmtPtr stmt(G::StmtContext* c) {
    auto s = std::make_unique<ast::Stmt>();
    s->loc = tok_loc(f_, c->getStart());
    if (auto* p = dynamic_cast<G::ParamStmtContext*>(c)) {
      s->node = ast::ParamStmt{p->NAME()->getText(), expr(p->expr()), domain(p->domain())};
    } else if (auto* p = dynamic_cast<G::LetStmtContext*>(c)) {
      s->node = ast::LetStmt{p->NAME()->getText(), expr(p->expr())};
    } else if (auto* p = dynamic_cast<G::MeshStmtContext*>(c)) {
      ast::MeshStmt m;
      for (auto* a : p->axisDef()) m.axes.push_back(binding(a->NAME(), a->expr(), a));
      s->node = std::move(m);
    } else if (auto* p = dynamic_cast<G::StreamStmtContext*>(c)) {
      ast::StreamStmt st;
      for (auto* n : p->NAME()) st.names.emplace_back(n->getText(), tok_loc(f_, n->getSymbol()));
      s->node = std::move(st);
    } else if (auto* p = dynamic_cast<G::UseStmtContext*>(c)) {
      ast::UseStmt u;
      std::string quoted = p->STRING()->getText();
      u.path = quoted.substr(1, quoted.size() - 2);
      u.path_loc = tok_loc(f_, p->STRING()->getSymbol());
      for (auto* b : p->binding()) u.args.push_back(binding(b->NAME(), b->expr(), b));
      s->node = std::move(u);
    } else if (auto* p = dynamic_cast<G::AssertStmtContext*>(c)) {
      std::string msg;
      if (p->STRING()) {
        msg = p->STRING()->getText();
        msg = msg.substr(1, msg.size() - 2);
      }
      s->node = ast::AssertStmt{expr(p->expr()), msg};
    } else if (auto* p = dynamic_cast<G::IfStmtContext*>(c)) {
      s->node = if_chain(p->ifChain());
    } else if (auto* p = dynamic_cast<G::ForStmtContext*>(c)) {
      s->node = ast::ForStmt{p->NAME()->getText(), expr(p->expr(0)), expr(p->expr(1)), block(p->block()->stmt())};
    } else if (auto* p = dynamic_cast<G::PlaceStmtContext*>(c)) {
      ast::PlaceStmt pl;
      pl.regions = selectors(p->selectors());
      if (auto* over = dynamic_cast<G::PlaceOverContext*>(p->placeTarget())) {
        pl.axis = axis_ref(over->axisRef());
        pl.mode = ast::PlaceStmt::Mode::Contiguous;
        if (auto* m = over->placeMode()) {
          if (auto* il = dynamic_cast<G::ModeInterleavedContext*>(m)) {
            pl.mode = ast::PlaceStmt::Mode::Interleaved;
            pl.chunks = expr(il->expr());
            pl.balanced = il->balance() != nullptr;
          } else if (auto* vs = dynamic_cast<G::ModeVshapeContext*>(m)) {
            pl.mode = ast::PlaceStmt::Mode::VShape;
            pl.balanced = vs->balance() != nullptr;
          } else if (dynamic_cast<G::ModeBalancedContext*>(m)) {
            pl.mode = ast::PlaceStmt::Mode::Balanced;
          }
        }
      } else {
        auto* on = dynamic_cast<G::PlaceOnContext*>(p->placeTarget());
        PIPER_INTERNAL_ASSERT(on, "place target is neither 'over' nor 'on'");
        for (auto* co : on->coord()) pl.coords.push_back(binding(co->NAME(), co->expr(), co));
      }
      pl.stream = stream(p->streamClause());
      s->node = std::move(pl);
    } else if (auto* p = dynamic_cast<G::ReplicateStmtContext*>(c)) {
      ast::ReplicateStmt r;
      r.regions = selectors(p->selectors());
      r.axis = axis_ref(p->axisRef());
      for (auto* o : p->replicateOpt()) {
        if (auto* z = dynamic_cast<G::ZeroOptContext*>(o)) r.zero = expr(z->expr());
        if (auto* b = dynamic_cast<G::BucketOptContext*>(o)) r.bucket = expr(b->expr());
        if (auto* u = dynamic_cast<G::UnitOptContext*>(o)) r.unit = selectors(u->selectors());
        if (auto* pf = dynamic_cast<G::PrefetchOptContext*>(o)) r.prefetch = expr(pf->expr());
      }
      r.stream = stream(p->streamClause());
      s->node = std::move(r);
    } else if (auto* p = dynamic_cast<G::ShardStmtContext*>(c)) {
      s->node = shard_stmt(p);
    } else if (auto* p = dynamic_cast<G::SplitStmtContext*>(c)) {
      s->node = ast::SplitStmt{expr(p->expr())};
    } else if (auto* p = dynamic_cast<G::MirrorStmtContext*>(c)) {
      s->node = ast::MirrorStmt{axis_ref(p->axisRef())};
    } else if (auto* p = dynamic_cast<G::OrderStmtContext*>(c)) {
      s->node = order_stmt(p);
    } else if (auto* p = dynamic_cast<G::OrderFromStmtContext*>(c)) {
      std::string quoted = p->STRING()->getText();
      s->node = ast::OrderFromStmt{quoted.substr(1, quoted.size() - 2), tok_loc(f_, p->STRING()->getSymbol())};
    } else if (auto* p = dynamic_cast<G::SequenceStmtContext*>(c)) {
      s->node = ast::SequenceStmt{block(p->block()->stmt())};
    } else if (auto* p = dynamic_cast<G::RecomputeStmtContext*>(c)) {
      s->node = ast::RecomputeStmt{selectors(p->selectors())};
    } else if (auto* p = dynamic_cast<G::PrecisionStmtContext*>(c)) {
      ast::PrecisionStmt pr{p->NAME()->getText(), tok_loc(f_, p->NAME()->getSymbol()), {}};
      if (p->selectors()) pr.regions = selectors(p->selectors());
      s->node = std::move(pr);
    } else {
      PIPER_INTERNAL_ASSERT(false, "unhandled statement alternative: " + c->getText());
    }
    return s;
  }

 private:
  ast::IfStmt if_chain(G::IfChainContext* c) {
    ast::IfStmt s;
    s.cond = expr(c->expr());
    s.then_block = block(c->block(0)->stmt());
    if (auto* next = c->ifChain()) {
      auto nested = std::make_unique<ast::Stmt>();
      nested->loc = tok_loc(f_, next->getStart());
      nested->node = if_chain(next);
      s.else_block.push_back(std::move(nested));
    } else if (c->block().size() > 1) {
      s.else_block = block(c->block(1)->stmt());
    }
    return s;
  }

  ast::Binding binding(antlr4::tree::TerminalNode* name, G::ExprContext* e, antlr4::ParserRuleContext* c) {
    return ast::Binding{name->getText(), expr(e), ctx_loc(f_, c)};
  }

  ast::AxisRef axis_ref(G::AxisRefContext* c) {
    return ast::AxisRef{c->NAME()->getText(), c->expr() ? expr(c->expr()) : nullptr, ctx_loc(f_, c)};
  }

  ast::ShardStmt shard_stmt(G::ShardStmtContext* p) {
    std::optional<std::pair<std::string, SourceLoc>> dim;
    if (auto* d = p->shardDim()) dim = std::make_pair(d->NAME()->getText(), tok_loc(f_, d->NAME()->getSymbol()));
    std::optional<SourceLoc> sequence;
    if (p->seq) sequence = tok_loc(f_, p->seq);
    std::optional<std::pair<std::string, SourceLoc>> exchange;
    if (p->exchange) exchange = std::make_pair(p->exchange->getText(), tok_loc(f_, p->exchange));
    return ast::ShardStmt{selectors(p->selectors()), axis_ref(p->axisRef()), std::move(dim), sequence, std::move(exchange),
                          stream(p->streamClause())};
  }

  std::optional<ast::StreamClause> stream(G::StreamClauseContext* c) {
    if (!c) return std::nullopt;
    ast::StreamClause s{c->NAME()->getText(), tok_loc(f_, c->NAME()->getSymbol()), nullptr, {}};
    if (auto* e = c->expr()) {
      s.sms = expr(e);
      s.sms_loc = ctx_loc(f_, e);
    }
    return s;
  }

  std::vector<ast::Selector> selectors(G::SelectorsContext* c) {
    std::vector<ast::Selector> out;
    for (auto* s : c->selector()) out.push_back(selector(s));
    return out;
  }

  ast::Selector selector(G::SelectorContext* c) {
    ast::Selector sel;
    sel.loc = ctx_loc(f_, c);
    if (dynamic_cast<G::AllSelectorContext*>(c)) {
      sel.whole_model = true;
      return sel;
    }
    auto* path = dynamic_cast<G::PathSelectorContext*>(c);
    for (auto* part : path->pathPart()) {
      ast::SelectorPart p;
      p.name = part->NAME()->getText();
      p.loc = ctx_loc(f_, part);
      if (auto* idx = part->index()) {
        if (dynamic_cast<G::IndexAllContext*>(idx)) {
          p.index = ast::SelectorPart::Index::All;
        } else if (auto* r = dynamic_cast<G::IndexRangeContext*>(idx)) {
          p.index = ast::SelectorPart::Index::Range;
          p.lo = expr(r->expr(0));
          p.hi = expr(r->expr(1));
        } else if (auto* one = dynamic_cast<G::IndexOneContext*>(idx)) {
          p.index = ast::SelectorPart::Index::One;
          p.lo = expr(one->expr());
        }
      }
      sel.parts.push_back(std::move(p));
    }
    return sel;
  }

  ast::ExprPtr make(ast::Expr::Kind k, antlr4::ParserRuleContext* c) {
    auto e = std::make_unique<ast::Expr>();
    e->kind = k;
    e->loc = ctx_loc(f_, c);
    return e;
  }

  ast::ExprPtr binary(antlr4::ParserRuleContext* c, G::ExprContext* l, G::ExprContext* r, antlr4::Token* op,
                      const char* fixed_op = nullptr) {
    auto e = make(ast::Expr::Kind::Binary, c);
    e->name = fixed_op ? fixed_op : op->getText();
    e->lhs = expr(l);
    e->rhs = expr(r);
    return e;
  }

  ast::ParamDomain domain(G::DomainContext* c) {
    ast::ParamDomain d;
    if (!c) return d;
    d.loc = tok_loc(f_, c->getStart());
    if (auto* l = dynamic_cast<G::DomainListContext*>(c)) {
      for (auto* e : l->expr()) d.values.push_back(expr(e));
    } else if (auto* f = dynamic_cast<G::DomainCallContext*>(c)) {
      d.function = f->NAME()->getText();
      d.values.push_back(expr(f->expr()));
    }
    return d;
  }

  ast::ExprPtr expr(G::ExprContext* c) {
    using K = ast::Expr::Kind;
    if (auto* p = dynamic_cast<G::ParenExprContext*>(c)) return expr(p->expr());
    if (auto* p = dynamic_cast<G::IntExprContext*>(c)) {
      auto e = make(K::Int, c);
      e->int_value = parse_int(p->INT()->getText(), 1, e->loc);
      return e;
    }
    if (auto* p = dynamic_cast<G::SizeExprContext*>(c)) {
      std::string text = p->SIZE()->getText();
      size_t digits = text.find_first_not_of("0123456789");
      std::string unit = text.substr(digits);
      const int64_t scale = size_unit(unit);  // the grammar admits only units it knows
      auto e = make(K::Int, c);
      e->int_value = parse_int(text.substr(0, digits), scale, e->loc);
      return e;
    }
    if (auto* p = dynamic_cast<G::BoolExprContext*>(c)) {
      auto e = make(K::Bool, c);
      e->bool_value = p->getText() == "true";
      return e;
    }
    if (auto* p = dynamic_cast<G::NameExprContext*>(c)) {
      auto e = make(K::Name, c);
      e->name = p->NAME()->getText();
      return e;
    }
    if (auto* p = dynamic_cast<G::UnaryExprContext*>(c)) {
      auto e = make(K::Unary, c);
      e->name = p->op->getText();
      e->lhs = expr(p->expr());
      return e;
    }
    if (auto* p = dynamic_cast<G::MulExprContext*>(c)) return binary(c, p->expr(0), p->expr(1), p->op);
    if (auto* p = dynamic_cast<G::AddExprContext*>(c)) return binary(c, p->expr(0), p->expr(1), p->op);
    if (auto* p = dynamic_cast<G::CmpExprContext*>(c)) return binary(c, p->expr(0), p->expr(1), p->op);
    if (auto* p = dynamic_cast<G::EqExprContext*>(c)) return binary(c, p->expr(0), p->expr(1), p->op);
    if (auto* p = dynamic_cast<G::AndExprContext*>(c)) return binary(c, p->expr(0), p->expr(1), nullptr, "and");
    if (auto* p = dynamic_cast<G::OrExprContext*>(c)) return binary(c, p->expr(0), p->expr(1), nullptr, "or");
    if (auto* p = dynamic_cast<G::CallExprContext*>(c)) {
      auto e = make(K::Call, c);
      e->name = p->NAME()->getText();
      for (auto* a : p->callArg()) {
        ast::CallArg arg;
        if (a->expr()) arg.expr = expr(a->expr());
        else arg.selector = selector(a->selector());
        e->args.push_back(std::move(arg));
      }
      return e;
    }
    PIPER_INTERNAL_ASSERT(false, "unhandled expression alternative: " + c->getText());
  }

  int64_t parse_int(const std::string& digits, int64_t scale, SourceLoc loc) {
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (ec != std::errc() || __builtin_mul_overflow(v, scale, &v)) overflow.push_back(loc);
    return v;
  }

  FileId f_;

 public:
  std::vector<SourceLoc> overflow;  // integer literals that do not fit in 64 bits
};

// The offset of the first byte that is not part of a well-formed UTF-8 sequence, or npos.
size_t first_invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size() || (n == 2 && c < 0xC2)) return i;
    uint32_t cp = n == 1 ? c : c & (0xFF >> (n + 1));
    for (size_t k = 1; k < n; ++k) {
      auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc >> 6) != 0x2) return i;
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are malformed too.
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
      return i;
    i += n;
  }
  return std::string::npos;
}

// Bounds the parse tree's depth without recursing, so the builder's recursion is safe.
size_t tree_depth(antlr4::tree::ParseTree* root) {
  size_t max_depth = 0;
  std::vector<std::pair<antlr4::tree::ParseTree*, size_t>> stack{{root, 1}};
  while (!stack.empty()) {
    auto [node, d] = stack.back();
    stack.pop_back();
    max_depth = std::max(max_depth, d);
    for (auto* child : node->children) stack.emplace_back(child, d + 1);
  }
  return max_depth;
}

}  // namespace

std::unique_ptr<ast::File> parse_strategy(FileId file, const SourceManager& sources, DiagnosticEngine& diags,
                                          const ParseLimits& given) {
  const std::string& text = sources.text(file);
  const ParseLimits& limits = text.starts_with(kCanonicalHeader) ? kCanonicalLimits : given;
  if (text.size() > limits.max_bytes) {
    diags.error(SourceLoc{file, 1, 1, 1},
                fmt::format("strategy file is {} bytes; the limit is {} (is this really a strategy?)",
                            text.size(), limits.max_bytes));
    return nullptr;
  }
  // ANTLR's input stream throws on malformed UTF-8; say where instead.
  if (size_t bad = first_invalid_utf8(text); bad != std::string::npos) {
    diags.error(sources.loc_at(file, bad), "strategy is not valid UTF-8 text (invalid byte here)");
    return nullptr;
  }
  antlr4::ANTLRInputStream input(text);
  grammar::PiperLexer lexer(&input);
  lexer.removeErrorListeners();  // BAD and UNTERMINATED tokens cover every character
  antlr4::CommonTokenStream tokens(&lexer);
  tokens.fill();
  if (tokens.size() > limits.max_tokens) {
    diags.error(SourceLoc{file, 1, 1, 1},
                fmt::format("strategy has {} tokens; the limit is {}", tokens.size(), limits.max_tokens));
    return nullptr;
  }

  // Lexical problems and nesting depth, checked before the (recursive) parser runs.
  size_t errors_before = diags.error_count();
  std::set<size_t> lexical_lines;
  size_t depth = 0;
  bool too_deep = false;
  for (antlr4::Token* t : tokens.getTokens()) {
    if (t->getType() == grammar::PiperLexer::BAD) {
      diags.error(tok_loc(file, t), fmt::format("unexpected character '{}'", t->getText()));
      lexical_lines.insert(t->getLine());
    } else if (t->getType() == grammar::PiperLexer::UNTERMINATED) {
      diags.error(tok_loc(file, t), "unterminated string: add the closing '\"' on the same line");
      lexical_lines.insert(t->getLine());
    } else if (t->getChannel() == antlr4::Token::DEFAULT_CHANNEL) {
      const std::string tt = t->getText();
      if (tt == "(" || tt == "[" || tt == "{") {
        if (++depth > limits.max_nesting && !too_deep) {
          too_deep = true;
          diags.error(tok_loc(file, t), fmt::format("nested more than {} levels deep", limits.max_nesting));
        }
      } else if ((tt == ")" || tt == "]" || tt == "}") && depth > 0) {
        --depth;
      }
    }
  }
  if (too_deep) return nullptr;

  grammar::PiperParser parser(&tokens);
  parser.removeErrorListeners();
  SyntaxErrors listener(file, diags, &tokens, std::move(lexical_lines));
  parser.addErrorListener(&listener);
  G::FileContext* tree = parser.file();
  if (diags.error_count() > errors_before) return nullptr;
  // Operator chains nest in the tree as brackets do: bound the depth the builder and the evaluator
  // recurse to, and point at the statement that goes too deep.
  bool chain_too_deep = false;
  for (auto* st : tree->stmt())
    if (tree_depth(st) > limits.max_tree_depth) {
      diags.error(tok_loc(file, st->getStart()),
                  fmt::format("this statement nests more than {} levels deep (a chain of about {} operators); split "
                              "it with let", limits.max_tree_depth, limits.max_tree_depth / 2));
      chain_too_deep = true;
    }
  if (chain_too_deep) return nullptr;

  Builder builder(file);
  auto out = std::make_unique<ast::File>();
  out->id = file;
  out->stmts = builder.block(tree->stmt());
  for (SourceLoc loc : builder.overflow) diags.error(loc, "number does not fit in a 64-bit integer");
  if (!builder.overflow.empty()) return nullptr;
  return out;
}

}  // namespace piper
