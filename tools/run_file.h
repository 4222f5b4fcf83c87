// The run file: every option of a tool's command line as TOML keys (`lr = 6e-4`, `betas = [0.9,
// 0.95]`, `set = ["pp=2"]`), read with toml++ into CLI11's own config mechanism — so each key is
// checked by the option's validators and the command line still wins — with errors located at
// FILE:LINE:COL; and written back from the resolved options (header-only: tools have no library).
#pragma once
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "lang/suggest.h"

namespace piper {

class TomlRunFile : public CLI::Config {
 public:
  // Options never read from or written to a run file: what names the file, and the one-shot actions.
  inline static const std::vector<std::string> kNotSettings = {"help", "version", "config", "write-config"};

  std::vector<CLI::ConfigItem> from_config(std::istream& in) const override {
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    toml::table table;
    try {
      table = toml::parse(text, path_);
    } catch (const toml::parse_error& e) {
      throw CLI::ConfigError(located(e.source().begin, std::string(e.description())));
    }
    std::vector<CLI::ConfigItem> settings_read;
    for (auto&& [key, node] : table) {
      std::string name(key.str());
      for (char& c : name) c = c == '_' ? '-' : c;  // lr_schedule or lr-schedule
      const CLI::Option* opt = option(name);
      if (!opt)
        throw CLI::ConfigError(located(key.source().begin, fmt::format("unknown setting '{}'{}", key.str(),
                                                                      piper::did_you_mean(name, settings()))));
      CLI::ConfigItem item;
      item.name = name;
      if (const toml::array* arr = node.as_array())
        for (auto&& v : *arr) item.inputs.push_back(scalar(v, name));
      else
        item.inputs.push_back(scalar(node, name));
      where_[name] = fmt::format("{}:{}:{}: ", path_, node.source().begin.line, node.source().begin.column);
      settings_read.push_back(std::move(item));
    }
    return settings_read;
  }

  // The resolved options (given, or their defaults) as TOML that from_config reads back.
  std::string to_config(const CLI::App* app, bool, bool, std::string) const override {
    toml::table out;
    for (const CLI::Option* opt : app->get_options()) {
      const std::string name = opt->get_lnames().empty() ? "" : opt->get_lnames().front();
      if (name.empty() || is_not_setting(name)) continue;
      std::vector<std::string> values = opt->count() > 0 ? opt->reduced_results() : std::vector<std::string>{};
      if (values.empty() && !opt->get_default_str().empty()) values = {opt->get_default_str()};
      if (values.empty()) continue;
      if (opt->get_expected_max() > 1 || values.size() > 1) {
        toml::array arr;
        for (const auto& v : values) typed(v, [&](auto x) { arr.push_back(x); });
        out.insert(name, std::move(arr));
      } else if (opt->get_type_size() == 0) {  // a flag
        out.insert(name, values[0] != "0" && values[0] != "false");
      } else {
        typed(values[0], [&](auto x) { out.insert(name, x); });
      }
    }
    std::ostringstream s;
    // Relaxed: 6e-4 written as 0.0006, not 0.00059999999999999995 (both read back to the same double).
    s << toml::toml_formatter(out, toml::toml_formatter::default_flags | toml::format_flags::relaxed_float_precision) << "\n";
    return s.str();
  }

  // Installs the run file on `app` as `--config FILE`, and `--write-config FILE`.
  static std::shared_ptr<TomlRunFile> install(CLI::App& app, std::string& write_path) {
    auto file = std::make_shared<TomlRunFile>();
    file->app_ = &app;
    app.config_formatter(file);
    app.set_config("--config", "", "read options from a run file (TOML: `lr = 6e-4`, `set = [\"pp=2\"]`); the "
                   "command line wins over it");
    app.add_option("--write-config", write_path, "write every resolved option as a run file that --config reads back");
    app.allow_config_extras(false);
    return file;
  }
  // The run file's name, for messages (CLI11 hands from_config only its stream).
  void find_path(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--config" && i + 1 < argc) path_ = argv[i + 1];
      if (a.starts_with("--config=")) path_ = a.substr(9);
    }
  }
  // After parsing: the resolved options into --write-config's file (false when it cannot be written).
  bool write(const CLI::App& app, const std::string& to) const {
    if (to.empty()) return true;
    std::ofstream out(to);
    return static_cast<bool>(out << app.config_to_str(true, false));
  }

  // A validator's message about an option the run file set, located at the file's value.
  std::string locate(const std::string& message) const {
    const std::string* best = nullptr;  // the longest name the message mentions (--lr-schedule, not --lr)
    size_t len = 0;
    for (const auto& [name, at] : where_)
      if (message.find("--" + name) != std::string::npos && name.size() > len) {
        best = &at;
        len = name.size();
      }
    return best ? *best + "error: " + message : message;
  }

 private:
  const CLI::App* app_ = nullptr;
  std::string path_ = "run file";
  mutable std::map<std::string, std::string> where_;  // option -> "FILE:LINE:COL: " of its value

  static bool is_not_setting(const std::string& name) {
    return std::find(kNotSettings.begin(), kNotSettings.end(), name) != kNotSettings.end();
  }
  const CLI::Option* option(const std::string& name) const {
    if (is_not_setting(name)) return nullptr;
    return app_->get_option_no_throw("--" + name);
  }
  std::vector<std::string> settings() const {
    std::vector<std::string> out;
    for (const CLI::Option* o : app_->get_options())
      if (!o->get_lnames().empty() && !is_not_setting(o->get_lnames().front())) out.push_back(o->get_lnames().front());
    return out;
  }
  std::string located(const toml::source_position& at, const std::string& message) const {
    return fmt::format("{}:{}:{}: error: {}", path_, at.line, at.column, message);
  }
  std::string scalar(const toml::node& v, const std::string& name) const {
    if (auto s = v.value_exact<std::string>()) return *s;
    if (auto i = v.value_exact<int64_t>()) return std::to_string(*i);
    if (auto d = v.value_exact<double>()) return fmt::format("{}", *d);  // the shortest text that reads back exactly
    if (auto b = v.value_exact<bool>()) return *b ? "true" : "false";
    throw CLI::ConfigError(located(v.source().begin, fmt::format("'{}': expected a string, number, boolean or a list of them", name)));
  }
  // Hands `insert` the value as the TOML type it reads as: numbers and booleans bare, the rest strings.
  template <typename Insert>
  static void typed(const std::string& v, Insert&& insert) {
    size_t used = 0;
    try {
      if (const long long i = std::stoll(v, &used); used == v.size()) return insert(static_cast<int64_t>(i));
      if (const double d = std::stod(v, &used); used == v.size()) return insert(d);
    } catch (const std::exception&) {  // not a number
    }
    if (v == "true" || v == "false") return insert(v == "true");
    insert(v);
  }
};

}  // namespace piper
