// Pass 10, storage: per stage and replica member, what that rank holds of the stage's parameters for
// the whole step (ir/facts.h, StageStorage). Decided here once; the executor, the memory model and
// checkpoints read it.
#include "ir/pass.h"

namespace piper::ir {

namespace {
MemberStorage member_storage(const StageFacts& st, const StageStorage& lay, int64_t member) {
  const Replication& rep = st.replication;
  MemberStorage m;
  if (lay.zero == 0) {
    m.stepped.push_back(Range{0, st.dense_elems});
  } else {
    for (const Range& r : lay.zero == 3 ? rep.units : rep.buckets)
      m.stepped.push_back(Range{Replication::shard_begin(r, rep.ways, member), Replication::shard_begin(r, rep.ways, member + 1)});
  }
  m.param_elems = lay.whole_params ? st.dense_elems : m.stepped_elems();
  m.grad_elems = lay.whole_grads ? st.dense_elems : m.stepped_elems();
  return m;
}
}  // namespace

void storage_pass(LowerContext& c) {
  for (StageFacts& st : c.graph.facts.stages) {
    StageStorage lay;
    lay.zero = st.replication.axis >= 0 ? st.replication.zero : 0;
    lay.whole_params = lay.zero < 3;
    lay.whole_grads = lay.zero <= 1;
    lay.bf16_copy = st.precision == DType::BF16;
    const int64_t members = st.replication.axis >= 0 ? st.replication.ways : 1;
    for (int64_t j = 0; j < members; ++j) lay.members.push_back(member_storage(st, lay, j));
    st.storage = std::move(lay);
  }
}

}  // namespace piper::ir
