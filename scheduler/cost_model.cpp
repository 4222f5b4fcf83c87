#include "scheduler/cost_model.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <sstream>

namespace piper::sched {

using nlohmann::json;

std::optional<Machine> parse_machine(FileId file, const SourceManager& sources, DiagnosticEngine& diags) {
  auto fail = [&](const std::string& msg) {
    diags.error(SourceLoc{file, 0, 0, 0}, "invalid machine description: " + msg);
    return std::nullopt;
  };
  json j;
  try {
    j = json::parse(sources.text(file));
  } catch (const json::parse_error& e) {
    diags.error(sources.loc_at(file, e.byte > 0 ? e.byte - 1 : 0), std::string("machine description is not valid JSON: ") + e.what());
    return std::nullopt;
  }
  auto number = [&](const json& obj, const char* key, double& out, bool required) {
    if (!obj.contains(key)) return !required;
    if (!obj[key].is_number() || obj[key].get<double>() < 0) return false;
    out = obj[key].get<double>();
    return true;
  };
  auto link = [&](const json& obj, Link& out) {
    return obj.is_object() && number(obj, "bandwidth", out.bandwidth, true) && out.bandwidth > 0 &&
           number(obj, "latency", out.latency, false);
  };
  if (!j.is_object()) return fail("expected a JSON object");
  Machine m;
  m.name = j.value("name", "");
  if (!number(j, "flops", m.flops, true) || m.flops <= 0) return fail("\"flops\" (FLOP/s per device) must be positive");
  if (!number(j, "memory_bytes", m.memory_bytes, true)) return fail("\"memory_bytes\" is required");
  if (!number(j, "memory_bandwidth", m.memory_bandwidth, true) || m.memory_bandwidth <= 0)
    return fail("\"memory_bandwidth\" (bytes/s) must be positive");
  if (!j.contains("link") || !link(j["link"], m.default_link))
    return fail("\"link\": {\"bandwidth\": bytes/s, \"latency\": s} is required");
  if (j.contains("axes")) {
    if (!j["axes"].is_object()) return fail("\"axes\" maps mesh axis names to links");
    for (const auto& [axis, l] : j["axes"].items()) {
      Link x;
      if (!link(l, x)) return fail(fmt::format("axes.{}: expected {{\"bandwidth\": ..., \"latency\": ...}}", axis));
      m.axes[axis] = x;
    }
  }
  return m;
}

std::optional<UnitCosts> parse_unit_costs(const std::string& spec, std::string* error) {
  UnitCosts c;
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t eq = item.find('=');
    double v = 0;
    try {
      if (eq == std::string::npos) throw std::invalid_argument("");
      size_t used = 0;
      v = std::stod(item.substr(eq + 1), &used);
      if (used != item.size() - eq - 1 || v < 0) throw std::invalid_argument("");
    } catch (const std::exception&) {
      *error = fmt::format("--cost: '{}' is not NAME=NUMBER (a non-negative number)", item);
      return std::nullopt;
    }
    std::string k = item.substr(0, eq);
    if (k == "F") c.F = v;
    else if (k == "B") c.B = v;
    else if (k == "W") c.W = v;
    else if (k == "comm") c.comm = v;
    else if (k == "U") c.update = v;
    else if (k == "FB") c.FB = v;
    else {
      *error = fmt::format("--cost: unknown cost '{}' (known: F, B, W, FB, comm, U)", k);
      return std::nullopt;
    }
  }
  if (c.W > c.B) {
    *error = "--cost: W (the weight half of a backward) cannot exceed B (the whole backward)";
    return std::nullopt;
  }
  return c;
}

double CostModel::cost(const ir::Node& n, int64_t group_size, double share) const {
  using ir::Op;
  if (unit_) {
    switch (n.op) {
      case Op::F: return unit_->F * share;
      case Op::B: return unit_->B * share;
      case Op::BI: return (unit_->B - unit_->W) * share;
      case Op::BW: return unit_->W * share;
      case Op::U: return unit_->update;
      case Op::Recv: return 0;  // the transfer is charged to the send
      default: return unit_->comm;
    }
  }
  const Machine& m = *machine_;
  const double fwd = static_cast<double>(n.flops) * static_cast<double>(samples_) / m.flops;
  // Backward = input gradient + weight gradient, each about one forward.
  switch (n.op) {
    case Op::F: return fwd;
    case Op::B: return 2 * fwd;
    case Op::BI:
    case Op::BW: return fwd;
    case Op::U: return 16.0 * static_cast<double>(n.bytes) / m.memory_bandwidth;  // read/write params, grads, 2 moments
    case Op::Recv: return 0;
    default: break;
  }
  const Link& l = n.axis >= 0 && static_cast<size_t>(n.axis) < axes_.size() && m.axes.count(axes_[static_cast<size_t>(n.axis)])
                      ? m.axes.at(axes_[static_cast<size_t>(n.axis)])
                      : m.default_link;
  const double b = static_cast<double>(n.bytes), k = static_cast<double>(std::max<int64_t>(group_size, 1));
  switch (n.op) {
    case Op::Send: return l.latency + b / l.bandwidth;
    case Op::AllReduce: return 2 * (k - 1) * l.latency + 2 * (k - 1) / k * b / l.bandwidth;  // ring
    case Op::AllGather:
    case Op::ReduceScatter:
    case Op::AllToAll: return (k - 1) * l.latency + (k - 1) / k * b / l.bandwidth;
    case Op::Broadcast: return l.latency + b / l.bandwidth;
    default: return 0;
  }
}

}  // namespace piper::sched
