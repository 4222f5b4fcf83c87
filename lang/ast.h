// The strategy language's syntax tree: what the parser builds and the checker walks.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "lang/source.h"

namespace piper::ast {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

// A path into the model's region tree: `layers[0..3].moe.experts`, or `*` for the whole model.
struct SelectorPart {
  enum class Index { None, One, Range, All };
  std::string name;
  SourceLoc loc;  // covers the name and its index
  Index index = Index::None;
  ExprPtr lo, hi;  // One: lo; Range: lo..hi (inclusive)
};
struct Selector {
  bool whole_model = false;  // `*`
  std::vector<SelectorPart> parts;
  SourceLoc loc;
};

struct CallArg {
  ExprPtr expr;                    // min(a, b), or a bare name that may also be a selector
  std::optional<Selector> selector;  // len(layers[*].moe.experts)
};

struct Expr {
  enum class Kind { Int, Bool, Name, Unary, Binary, Call };
  Kind kind;
  SourceLoc loc;
  int64_t int_value = 0;  // Int (sizes are already scaled to bytes)
  bool bool_value = false;
  std::string name;  // Name, Call (the function), Unary/Binary (the operator)
  ExprPtr lhs, rhs;  // Unary uses lhs
  std::vector<CallArg> args;
};

struct AxisRef {
  std::string name;
  ExprPtr size;  // optional `= expr`: a check that the mesh axis has this size
  SourceLoc loc;
};

struct Binding {
  std::string name;
  ExprPtr value;
  SourceLoc loc;
};

struct Task {
  std::string kind;  // fwd, bwd, bwd_input, bwd_weight (checked later)
  std::vector<ExprPtr> args;
  SourceLoc loc;
};
using TaskGroup = std::vector<Task>;  // members run co-scheduled (`a || b`)

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Block = std::vector<StmtPtr>;

// `in {1, 2, 4}` or `in divisors(world)`: the values piper-tune tries. Constants only (literals, world).
struct ParamDomain {
  std::string function;         // "" for a list; else the function's name (divisors), of values[0]
  std::vector<ExprPtr> values;  // the list, or the function's one argument
  SourceLoc loc;
  bool empty() const { return values.empty(); }
};
struct ParamStmt { std::string name; ExprPtr value; ParamDomain domain; };
struct LetStmt { std::string name; ExprPtr value; };
struct MeshStmt { std::vector<Binding> axes; };
struct StreamStmt { std::vector<std::pair<std::string, SourceLoc>> names; };
// `on stream NAME [sms N]`
struct StreamClause {
  std::string name;
  SourceLoc loc;
  ExprPtr sms;  // null when not given
  SourceLoc sms_loc;
};
struct UseStmt { std::string path; SourceLoc path_loc; std::vector<Binding> args; };
struct AssertStmt { ExprPtr cond; std::string message; };
struct IfStmt { ExprPtr cond; Block then_block; Block else_block; };
struct ForStmt { std::string var; ExprPtr lo, hi; Block body; };
struct PlaceStmt {
  enum class Mode { On, Contiguous, Interleaved, VShape, Balanced };
  std::vector<Selector> regions;
  Mode mode = Mode::On;
  AxisRef axis;                  // for the `over` forms
  ExprPtr chunks;                // interleaved(v)
  bool balanced = false;         // interleaved(v) balanced, vshape balanced: chunks cut by cost
  std::vector<Binding> coords;   // for `on pp=0, ...`
  std::optional<StreamClause> stream;
};
struct ReplicateStmt {
  std::vector<Selector> regions;
  AxisRef axis;
  ExprPtr zero, bucket, prefetch;
  std::vector<Selector> unit;  // ZeRO-3's gather units, when given
  std::optional<StreamClause> stream;
};
struct ShardStmt {
  std::vector<Selector> regions;
  AxisRef axis;
  std::optional<std::pair<std::string, SourceLoc>> dim;  // `over tp heads`: what a tensor shard splits
  std::optional<SourceLoc> sequence;  // `over tp heads sequence`: its replicated part on sequence shards
  // `over cp sequence ring`: context parallelism, the regions on shares of the tokens exchanging so
  std::optional<std::pair<std::string, SourceLoc>> exchange;
  std::optional<StreamClause> stream;
};
struct SplitStmt { ExprPtr microbatches; };
// `mirror over pp;`: every stage also held at the mirrored pipeline coordinate (DeepSeek's DualPipe).
struct MirrorStmt { AxisRef axis; };
struct OrderStmt {
  std::vector<TaskGroup> chain;  // group[0] -> group[1] -> ...
  std::optional<StreamClause> stream;
};
struct SequenceStmt { Block body; };  // its orders run one after another, in evaluation order
// `order from "schedule.csv";`: torch.distributed.pipelining's schedule file, a `sequence` per line.
struct OrderFromStmt { std::string path; SourceLoc path_loc; };
struct RecomputeStmt { std::vector<Selector> regions; };
struct PrecisionStmt { std::string dtype; SourceLoc dtype_loc; std::vector<Selector> regions; };

using StmtNode = std::variant<ParamStmt, LetStmt, MeshStmt, StreamStmt, UseStmt, AssertStmt, IfStmt,
                              ForStmt, PlaceStmt, ReplicateStmt, ShardStmt, SplitStmt, MirrorStmt, OrderStmt,
                              SequenceStmt, OrderFromStmt, RecomputeStmt, PrecisionStmt>;

struct Stmt {
  SourceLoc loc;  // the statement's keyword
  StmtNode node;
};

struct File {
  FileId id = 0;
  Block stmts;
};

}  // namespace piper::ast
