#include "runtime/job/train.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "ir/emit.h"
#include "lang/units.h"
#include "runtime/exec/executor.h"
#include "runtime/device/call_watch.h"
#include "runtime/job/settings.h"
#include "runtime/job/stop_report.h"
#include "runtime/job/straggler.h"
#include "runtime/job/trace.h"
#include "runtime/view/rank_view.h"
#include "scheduler/plan.h"

namespace piper::runtime {

namespace {
int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

// The first rank whose plan hash differs from rank 0's (-1: all equal). Each rank fills its slot and a
// sum shows everyone's.
int first_mismatch(Communicator& comm, uint64_t hash) {
  std::vector<double> h(static_cast<size_t>(comm.size()) * 2, 0.0);
  h[static_cast<size_t>(comm.rank()) * 2] = static_cast<double>(hash >> 32);
  h[static_cast<size_t>(comm.rank()) * 2 + 1] = static_cast<double>(hash & 0xffffffffu);
  const auto all = everyone(comm);
  comm.prepare_group(all, kHashChannel);
  comm.all_reduce_sum(h.data(), h.size(), all, kHashChannel);
  for (int r = 1; r < comm.size(); ++r)
    if (h[static_cast<size_t>(r) * 2] != h[0] || h[static_cast<size_t>(r) * 2 + 1] != h[1]) return r;
  return -1;
}

// Every rank's peak tensor bytes of the step, its bytes by category at that moment, its step's
// seconds and the seconds its compute ops ran (rank order).
struct StepRanks {
  std::vector<int64_t> peak;                                 // per rank
  std::vector<std::array<int64_t, kMemCategories>> at_peak;  // per rank
  std::vector<double> seconds, compute;                      // per rank
};
StepRanks gather_ranks(Communicator& comm, const StepResult& mine) {
  const size_t w = static_cast<size_t>(comm.size()), row = 3 + kMemCategories;
  std::vector<double> all(w * row, 0.0);
  const size_t me = static_cast<size_t>(comm.rank()) * row;
  all[me] = static_cast<double>(mine.memory.peak);
  for (size_t c = 0; c < static_cast<size_t>(kMemCategories); ++c) all[me + 1 + c] = static_cast<double>(mine.memory.at_peak[c]);
  all[me + row - 2] = mine.seconds;
  for (const OpSpan& op : mine.ops)
    if (op.compute) all[me + row - 1] += op.end - op.start;
  comm.all_reduce_sum(all.data(), all.size(), everyone(comm), kHashChannel);
  StepRanks out;
  for (size_t r = 0; r < w; ++r) {
    out.peak.push_back(static_cast<int64_t>(all[r * row]));
    out.seconds.push_back(all[r * row + row - 2]);
    out.compute.push_back(all[r * row + row - 1]);
    std::array<int64_t, kMemCategories> cats{};
    for (size_t c = 0; c < static_cast<size_t>(kMemCategories); ++c) cats[c] = static_cast<int64_t>(all[r * row + 1 + c]);
    out.at_peak.push_back(cats);
  }
  return out;
}

// Rank 0's account of each step: a line on stdout (and a progress bar on a terminal), a JSON line in
// the metrics file.
class StepReporter {
 public:
  StepReporter(const TrainOptions& o, int64_t tokens_per_step) : o_(o), tokens_(tokens_per_step) {
    if (!o.metrics_path.empty()) metrics_.open(o.metrics_path);
  }
  void step(int64_t s, const StepResult& r, const StepRanks& mem) {
    const double tps = double(tokens_) / r.seconds;
    const size_t fullest = static_cast<size_t>(std::max_element(mem.peak.begin(), mem.peak.end()) - mem.peak.begin());
    if (o_.progress) fmt::print("\r\033[K");  // replace the progress bar with the step's line
    std::string norm = r.grad_norm >= 0 ? fmt::format("  grad norm {:.4g}", r.grad_norm) : "";
    if (r.val_loss >= 0) norm += fmt::format("  val loss {:.6f}", r.val_loss);
    fmt::print("step {:>4}/{}  loss {:.6f}  lr {:.3g}{}  {:>8.0f} tokens/s  {:.3f} s  tensors {} (rank {})  rss {}\n", s + 1,
               o_.steps, r.loss, r.lr, norm, tps, r.seconds, human_bytes(double(mem.peak[fullest])), fullest,
               human_bytes(double(peak_rss_bytes())));
    if (o_.progress && s + 1 < o_.steps) {
      const auto done = static_cast<size_t>(40 * (s + 1) / o_.steps);
      fmt::print("[{}{}] {}/{}", std::string(done, '#'), std::string(40 - done, '.'), s + 1, o_.steps);
    }
    std::fflush(stdout);
    if (!metrics_.is_open()) return;
    nlohmann::json by_category;
    for (int c = 0; c < kMemCategories; ++c)
      by_category[mem_category_name(static_cast<MemCategory>(c))] = mem.at_peak[fullest][static_cast<size_t>(c)];
    std::string norm_key = r.grad_norm >= 0 ? fmt::format("\"grad_norm\":{:.9g},", r.grad_norm) : "";
    if (r.val_loss >= 0) norm_key += fmt::format("\"val_loss\":{:.9g},\"eval_s\":{:.6f},", r.val_loss, r.eval_seconds);
    if (r.copy_diff >= 0) norm_key += fmt::format("\"copy_diff\":{:.9g},", r.copy_diff);
    if (r.ring_bytes > 0) norm_key += fmt::format("\"ring_bytes\":{},", r.ring_bytes);  // rank 0's
    metrics_ << fmt::format("{{\"step\":{},\"loss\":{:.9g},\"lr\":{:.9g},{}\"tokens_per_s\":{:.1f},\"step_s\":{:.6f},"
                            "\"peak_mem_bytes\":{},\"peak_tensor_bytes\":{},\"peak_tensor_bytes_by_rank\":[{}],"
                            "\"peak_tensor_bytes_by_category\":{},\"step_s_by_rank\":[{:.6f}],\"compute_s_by_rank\":[{:.6f}]}}\n",
                            s + 1, r.loss, r.lr, norm_key, tps, r.seconds, peak_rss_bytes(), mem.peak[fullest],
                            fmt::join(mem.peak, ","), by_category.dump(), fmt::join(mem.seconds, ","),
                            fmt::join(mem.compute, ","))
             << std::flush;
  }
  void finish(std::pair<double, double> checksum) {
    if (metrics_.is_open())
      metrics_ << fmt::format("{{\"final_param_sum\":{:.12g},\"final_param_sumsq\":{:.12g}}}\n", checksum.first, checksum.second);
  }

 private:
  const TrainOptions& o_;
  int64_t tokens_;
  std::ofstream metrics_;
};

// The steps from `first` on, with checkpoints as asked; the spans for the trace when one is written.
void run_steps(const TrainOptions& o, Executor& ex, Communicator& comm, int64_t first, int64_t seq, StragglerWatch& slow) {
  const bool lead = comm.rank() == 0;
  // Between steps every rank meets every other (the metrics; a checkpoint's save): watched as the
  // plan's ops are, so a host lost there is named rather than waited for.
  CallWatch& watch = ex.calls();
  const std::string everyone = comm.hosts().everyone_label(comm.size());
  auto arm = [&](int64_t s, const char* what) {
    watch.arm(fmt::format("after step {}, {} ({})", s + 1, what, everyone));
  };
  std::optional<TokenData> val;
  if (!o.val_data.empty() && o.eval_every > 0) val.emplace(o.val_data);
  std::optional<StepReporter> report;
  if (lead) report.emplace(o, o.batch * seq);
  std::vector<std::pair<int64_t, StepResult>> spans;
  for (int64_t s = first; s < o.steps; ++s) {
    StepResult r = ex.step(s);
    if (o.check_copies) {
      arm(s, "comparing the stages' copies");
      r.copy_diff = ex.copy_divergence();
      watch.disarm();
    }
    if (val && ((s + 1) % o.eval_every == 0 || s + 1 == o.steps)) {
      const auto t0 = std::chrono::steady_clock::now();
      r.val_loss = ex.evaluate(*val, o.eval_batches);
      r.eval_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / double(o.eval_batches);
    }
    arm(s, "gathering the step's metrics");
    const StepRanks mem = gather_ranks(comm, r);
    watch.disarm();
    if (lead) report->step(s, r, mem);
    if (const std::string line = slow.step(mem.compute); lead && !line.empty()) fmt::print("piper-run: {}\n", line);
    if (!o.trace_path.empty()) spans.emplace_back(s, std::move(r));
    if (!o.checkpoint_dir.empty() && ((o.save_every > 0 && (s + 1) % o.save_every == 0) || s + 1 == o.steps)) {
      arm(s, "saving the checkpoint");
      const std::string at = ex.save_checkpoint(o.checkpoint_dir, s + 1, o.strategy, run_settings(o));
      watch.disarm();
      if (lead) fmt::print("piper-run: checkpoint {}\n", at);
    }
  }
  if (!o.save_model.empty()) {
    ex.save_model(o.save_model);
    if (lead) fmt::print("piper-run: wrote the trained model to {}\n", o.save_model);
  }
  if (!o.trace_path.empty()) write_trace(comm, spans, o.trace_path);
  const auto checksum = ex.param_checksum();
  if (lead) report->finish(checksum);
}
}  // namespace

int train(const TrainOptions& o, Communicator& comm) {
  const bool lead = comm.rank() == 0;
  auto fail = [&](const std::string& msg) {
    if (lead) fmt::print(stderr, "{}{}", msg, msg.ends_with('\n') ? "" : "\n");
    return 1;
  };
  // Every rank compiles the same plan from the same inputs; a mismatch is refused below.
  sched::PlanOptions opt;
  opt.machine_path = o.machine_path;
  opt.cmd.np = comm.size();
  opt.cmd.sets = o.sets;
  opt.cmd.batch_size = o.batch;
  opt.global_norm = o.recipe.clip_grad_norm > 0;
  opt.cmd.search_path = o.include;
  for (auto& d : default_search_path()) opt.cmd.search_path.push_back(d);
  const HostMap hosts = comm.hosts();  // from MPI: the plan prices and reports what crosses hosts
  if (hosts.count() > 1) opt.host_of = hosts.host_of;
  std::string errors;
  auto plan = sched::compile_plan(o.model, o.strategy, opt, &errors);
  if (!plan) return fail(errors);
  if (auto missing = Executor::unsupported(*plan); !missing.empty())
    return fail(fmt::format("piper-run: error: {} uses what the runtime does not execute yet: {} (piper-check can still "
                            "check and simulate it)", o.strategy, fmt::join(missing, ", ")));
  if (int r = first_mismatch(comm, plan->hash); r >= 0)
    return fail(fmt::format("piper-run: error: rank {} compiled a different plan than rank 0 (different files or --set on "
                            "different ranks?); refusing to start", r));
  std::optional<double> limit;
  if (!o.memory_limit.empty() && !(limit = parse_size(o.memory_limit)))
    return fail(fmt::format("piper-run: error: --memory-limit: '{}' is not a size like 512MiB", o.memory_limit));
  TokenData data(o.data_path);
  set_intra_op_threads(o.threads);
  ExecutorOptions eo{o.batch, o.lr, o.optimizer, o.seed, o.seq_len, o.op_timeout, o.device};
  eo.recipe = o.recipe;
  if (eo.recipe.decay_steps <= 0) eo.recipe.decay_steps = o.steps;  // the schedule decays over the run
  Executor ex(*plan, o.model, data, comm, eo);
  StopReport stopped(hosts.rank_label(comm.rank()), [&ex] { return ex.report_now(); });
  const auto& first_region = plan->manifest.regions[static_cast<size_t>(plan->manifest.sequence.front())];
  const int64_t seq = o.seq_len > 0 ? o.seq_len : first_region.input->shape[0];
  if (lead)
    fmt::print("piper-run: {} ranks, {} stages, {} microbatches of {} samples, {} threads per rank\n", comm.size(),
               plan->dag.facts.stages.size(), plan->dag.facts.microbatches, plan->samples_per_microbatch(), o.threads);
  if (lead) fmt::print("{}", ir::emit_hosts(plan->dag, hosts.names));
  int64_t first = 0;
  if (!o.resume_dir.empty()) {
    std::string note, saved;
    first = ex.load_checkpoint(o.resume_dir, &note, &saved);
    if (lead) fmt::print("piper-run: {}\n", note);
    const SettingsChanges changed = compare_settings(saved, run_settings(o));
    if (!changed.recipe.empty() && !o.accept_changes)
      return fail(fmt::format("piper-run: error: --resume {}: this run changes the optimizer's recipe the checkpoint was "
                              "trained with: {} (pass them as before, or --accept-changes to continue with the new ones)",
                              o.resume_dir, fmt::join(changed.recipe, ", ")));
    if (lead && !changed.recipe.empty())
      fmt::print("piper-run: note: continuing with a changed recipe (--accept-changes): {}\n", fmt::join(changed.recipe, ", "));
    if (lead && !changed.data.empty())
      fmt::print("piper-run: note: the data settings differ from the checkpoint's, so other samples come next: {}\n",
                 fmt::join(changed.data, ", "));
  }
  if (limit) set_memory_limit(comm.rank(), static_cast<int64_t>(*limit));
  StragglerWatch slow(planned_compute(*plan, comm.size()), hosts);
  run_steps(o, ex, comm, first, seq, slow);
  return 0;
}

}  // namespace piper::runtime
