// The checker's insides, shared by the files that implement it (lang/checker.cpp names them); not for other folders.
#pragma once
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "lang/ast.h"
#include "lang/checker.h"
#include "lang/internal_error.h"
#include "lang/suggest.h"
#include "lang/torch_csv.h"

namespace piper::check {

namespace fs = std::filesystem;

// Sizes past which lowering and simulation could not answer in reasonable time and memory (they
// build tasks per rank, stage and microbatch): refused up front instead of hanging.
constexpr int64_t kMaxMicrobatches = 4096;
constexpr int64_t kMaxStageMicrobatches = 16'384;  // stages × microbatches: forward tasks per step
constexpr int64_t kMaxWorld = 1 << 20;
// Order statements run (instances of `order` lines inside loops): a plan within the task limit
// needs a few per task; past this a loop bound is wrong, and recording them would take seconds.
constexpr int64_t kMaxOrderStatements = 4 * kMaxStageMicrobatches;

struct Value {
  enum class Type { Int, Bool };
  Type type = Type::Int;
  int64_t i = 0;
  bool b = false;
  static Value of(int64_t v) { return Value{Type::Int, v, false}; }
  static Value of_bool(bool v) { return Value{Type::Bool, 0, v}; }
  std::string text() const { return type == Type::Int ? std::to_string(i) : (b ? "true" : "false"); }
};

inline const char* type_name(Value::Type t) { return t == Value::Type::Int ? "an integer" : "a boolean"; }

struct Var {
  Value value;
  SourceLoc decl;
  const char* what;  // "parameter", "let binding", "loop variable"
};

// Lexical scopes of one file; a used file gets a fresh Env of its own.
struct Env {
  std::vector<std::map<std::string, Var>> frames{1};
  const Var* find(const std::string& name) const {
    for (auto it = frames.rbegin(); it != frames.rend(); ++it)
      if (auto v = it->find(name); v != it->end()) return &v->second;
    return nullptr;
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& f : frames)
      for (const auto& [n, _] : f) out.push_back(n);
    return out;
  }
  std::map<std::string, Var> flatten() const {
    std::map<std::string, Var> out;
    for (const auto& f : frames)
      for (const auto& [n, v] : f) out[n] = v;
    return out;
  }
};

// What a `use` hands to the used file: explicit arguments and the user's visible names.
struct UseContext {
  std::map<std::string, std::pair<Value, SourceLoc>> args;
  std::set<std::string> consumed;
  std::map<std::string, Var> inherited;
};

// One `order` statement run, kept small: a loop makes hundreds of thousands of them.
struct PendingOrder {
  const ast::OrderStmt* stmt;
  SourceLoc loc;
  const std::vector<std::string>* names;  // the names its tasks mention (the statement's, shared)
  std::vector<Var> values;  // aligned with names; `what == nullptr` for an unbound (quantified) one
  std::shared_ptr<const std::vector<Note>> context;  // shared by every order run in one `use`
  size_t slot = 0;  // expanded in front of out_.directives[slot]: source order among the directives
  std::string stream;
  std::optional<size_t> prev;  // the order before this one in its `sequence` block
  std::optional<std::vector<Task>> last_group;  // filled on expansion, for the next one in the sequence
  bool in_sequence = false;
  bool failed = false;
};

// Walks the strategy file (and the files it uses) once, in order, collecting checked directives;
// then checks what needs the whole strategy and expands the orders. Every error is reported, located.
class Checker {
 public:
  Checker(const Manifest& m, const CheckOptions& o, SourceManager& s, DiagnosticEngine& d)
      : m_(m), opt_(o), sources_(s), diags_(d) {
    for (const char* name : kBuiltinStreams) streams_[name] = SourceLoc{};
  }
  std::optional<CheckedStrategy> run(FileId top);  // checker.cpp

 private:
  int64_t axis_size(const std::string& name) const {
    for (const auto& a : axes_)
      if (a.name == name) return a.size;
    return 1;
  }

  // evaluation (evaluate.cpp)
  bool step(SourceLoc loc);
  std::optional<Value> lookup(const ast::Expr& e, const Env& env);
  std::optional<Value> eval(const ast::Expr& e, const Env& env);
  std::optional<Value> overflow(const ast::Expr& e);
  bool expect(const Value& v, Value::Type t, const ast::Expr& where, const std::string& context);
  std::optional<Value> binary(const ast::Expr& e, const Env& env);
  std::optional<Value> call(const ast::Expr& e, const Env& env);
  std::optional<int64_t> eval_int(const ast::Expr& e, const Env& env, const std::string& what);

  // regions (selectors.cpp)
  std::vector<std::string> child_names(RegionId r) const;
  // A path below `from` to a descendant named `leaf`, in selector syntax (`moe.experts`).
  std::optional<std::string> find_below(RegionId from, const std::string& leaf) const;
  std::optional<std::vector<RegionId>> resolve(const ast::Selector& sel, const Env& env);
  std::optional<std::vector<RegionId>> resolve_all(const std::vector<ast::Selector>& sels, const Env& env);
  // Pipeline regions (sequence members) covered by a selection, in sequence order.
  std::optional<std::vector<RegionId>> to_pipeline(const std::vector<RegionId>& sel, const ast::Selector& where);

  // statements (statements.cpp; use.cpp for `use`; directives.cpp for the directives)
  void run_file(const ast::File& file, UseContext& use);
  void run_block(const ast::Block& block, Env& env, UseContext& use, FileId file);
  bool declare(Env& env, const std::string& name, Value v, SourceLoc loc, const char* what);
  SourceLoc name_loc(SourceLoc stmt, const std::string& keyword, const std::string& name);
  std::optional<Value> parse_override(const Override& o);
  void run_stmt(const ast::Stmt& s, Env& env, UseContext& use, FileId file);
  void stmt(const ast::ParamStmt& p, const ast::Stmt& s, Env& env, UseContext& use, FileId);
  void check_domain(const ast::ParamStmt& p, const Value& fallback);
  void stmt(const ast::LetStmt& l, const ast::Stmt& s, Env& env, UseContext&, FileId);
  void stmt(const ast::MeshStmt& m, const ast::Stmt& s, Env& env, UseContext&, FileId);
  void stmt(const ast::StreamStmt& st, const ast::Stmt&, Env&, UseContext&, FileId);
  // The stream a statement names ("" when none), its `sms` recorded; nothing after an error.
  std::optional<std::string> check_stream(const std::optional<ast::StreamClause>& st, const Env& env);
  bool check_sms(const ast::StreamClause& st, const Env& env);
  // `path` beside the file `from`, then on the search path; an error naming `what` when it is nowhere.
  std::optional<std::string> find_strategy(const std::string& path, FileId from, SourceLoc loc, const char* what = "strategy");
  void stmt(const ast::UseStmt& u, const ast::Stmt& s, Env& env, UseContext&, FileId file);
  const ast::File* load(const std::string& canon);
  void stmt(const ast::AssertStmt& a, const ast::Stmt& s, Env& env, UseContext&, FileId);
  void stmt(const ast::IfStmt& i, const ast::Stmt&, Env& env, UseContext& use, FileId file);
  void stmt(const ast::ForStmt& f, const ast::Stmt& s, Env& env, UseContext& use, FileId file);
  std::optional<std::string> check_axis(const ast::AxisRef& a, const Env& env);
  void stmt(const ast::PlaceStmt& p, const ast::Stmt& s, Env& env, UseContext&, FileId);
  bool place_on(const ast::PlaceStmt& p, Env& env, PlaceDirective& d);
  bool place_over(const ast::PlaceStmt& p, Env& env, PlaceDirective& d);
  void record_placement(const ast::PlaceStmt& p, const ast::Stmt& s, PlaceDirective d);
  void stmt(const ast::ReplicateStmt& r, const ast::Stmt& s, Env& env, UseContext&, FileId);
  void stmt(const ast::ShardStmt& sh, const ast::Stmt& s, Env& env, UseContext&, FileId);
  void tensor_shard(const ast::ShardStmt& sh, const ast::Stmt& s, const std::vector<RegionId>& sel,
                    const std::string& axis);
  bool tied_slice_ok(RegionId r, SourceLoc at, const std::string& axis);
  // `shard ... over cp sequence ring;` (context_shard.cpp)
  void context_shard(const ast::ShardStmt& sh, const ast::Stmt& s, const std::vector<RegionId>& sel,
                     const std::string& axis);
  bool context_leaves(RegionId r, std::vector<RegionId>& out) const;
  void stmt(const ast::SplitStmt& sp, const ast::Stmt& s, Env& env, UseContext&, FileId);
  void stmt(const ast::MirrorStmt& mi, const ast::Stmt& s, Env& env, UseContext&, FileId);
  void finish_mirror();
  void stmt(const ast::OrderStmt& o, const ast::Stmt& s, Env& env, UseContext&, FileId);
  void stmt(const ast::SequenceStmt& q, const ast::Stmt&, Env& env, UseContext& use, FileId file);
  // `order from "schedule.csv"` (order_from.cpp): the file's lines run as sequences; once stages
  // are known, each line checked to hold its own rank's tasks, each once, and all of them.
  void stmt(const ast::OrderFromStmt& o, const ast::Stmt& s, Env& env, UseContext& use, FileId file);
  std::optional<std::string> schedule_path(const ast::OrderFromStmt& o, const Env& env);
  void finish_schedule_files();
  void check_schedule_line(const CsvSchedule& c, size_t line);
  void stmt(const ast::RecomputeStmt& r, const ast::Stmt& s, Env& env, UseContext&, FileId);
  void stmt(const ast::PrecisionStmt& p, const ast::Stmt& s, Env& env, UseContext&, FileId);

  // whole-strategy checks (whole_checks.cpp)
  void finish();
  void finish_mesh();
  void finish_placement();
  void finish_axes();
  void finish_split_blocks();
  bool claim_model_axis(std::map<std::string, SourceLoc>& uses, const std::string& axis, SourceLoc at, SourceLoc stmt,
                        const char* message, const char* note);
  void finish_batch();

  // order expansion (order_expansion.cpp)
  static std::optional<TaskKind> task_kind(const std::string& name);
  void finish_orders();
  struct FreeVar {  // an order's quantified variable and how many values it takes
    std::string name;
    int64_t domain;
  };
  void expand(PendingOrder& p, int64_t stages, std::vector<Directive>& out);
  bool free_variables(const PendingOrder& p, int64_t stages, std::vector<FreeVar>& free);
  bool instance(const PendingOrder& p, const Env& env, bool quantified, int64_t stages, OrderDirective& d, bool& keep,
                std::optional<std::string>& out_of_range);
  bool check_instance(const PendingOrder& p, const OrderDirective& d);

  const Manifest& m_;
  const CheckOptions& opt_;
  SourceManager& sources_;
  DiagnosticEngine& diags_;
  FileId top_ = 0;
  CheckedStrategy out_;
  std::vector<MeshAxis> axes_;  // the mesh as declared so far; out_.mesh is made from it at the end
  std::map<std::string, SourceLoc> streams_;
  std::map<std::string, SourceLoc> declared_params_;
  std::set<std::string> used_overrides_;
  std::map<std::string, SourceLoc> bound_by_use_;  // parameters a `use` argument fixed, where
  std::set<std::string> used_axes_;
  std::map<std::string, SourceLoc> replicate_axes_, shard_axes_, tensor_axes_, context_axes_;
  std::map<RegionId, SourceLoc> context_sharded_;  // the leaves run on shares of the tokens, where
  std::map<RegionId, SourceLoc> tensor_sharded_;  // regions sharded over a tensor-parallel axis, where
  std::map<RegionId, SourceLoc> placed_;  // where each pipeline region was placed ("placed twice/never")
  std::map<std::pair<int64_t, int64_t>, std::pair<bool, SourceLoc>> backward_form_;
  std::vector<PendingOrder> pending_;
  int64_t orders_run_ = 0;  // order statements run, recorded or not (kMaxOrderStatements)
  std::shared_ptr<const std::vector<Note>> order_context_;  // diags_.context() as last recorded for orders
  // Per order statement: the names its tasks' arguments mention (an instance records only those).
  struct OrderNames {
    std::vector<std::string> names;
    std::vector<const ast::Expr*> nested;  // names only inside expressions: these must be bound
    bool reported = false;  // an unknown name reported once, not once per loop iteration
  };
  std::map<const ast::OrderStmt*, OrderNames> order_names_;
  std::vector<std::optional<size_t>> sequences_;  // per open `sequence` block: its latest order
  std::vector<std::string> stack_;
  std::map<std::string, const ast::File*> parsed_;
  std::vector<std::unique_ptr<ast::File>> owned_;
  std::vector<std::unique_ptr<CsvSchedule>> schedules_;  // read by `order from`; their orders point into them
  // `place ... over AXIS balanced` (and `interleaved(v) balanced`, `vshape balanced`): cut into
  // chunks by cost once every placement is known.
  SourceLoc first_mesh_, first_place_, split_loc_, first_stmt_, mirror_loc_, mirror_axis_loc_;
  size_t place_count_ = 0;
  int64_t steps_ = 0;
  bool budget_reported_ = false;
};

}  // namespace piper::check
