#include "ops/report.h"

#include <algorithm>
#include <map>

#include "fmt/format.h"
#include "yaml-cpp/yaml.h"

namespace dynmig::ops {
namespace {

void Emit(YAML::Emitter& out, const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::object:
      out << YAML::BeginMap;
      for (const auto& [k, item] : v.items()) {
        out << YAML::Key << k << YAML::Value;
        Emit(out, item);
      }
      out << YAML::EndMap;
      break;
    case nlohmann::json::value_t::array:
      out << YAML::BeginSeq;
      for (const auto& item : v) Emit(out, item);
      out << YAML::EndSeq;
      break;
    case nlohmann::json::value_t::string:
      out << YAML::DoubleQuoted << v.get<std::string>();
      break;
    case nlohmann::json::value_t::boolean:
      out << v.get<bool>();
      break;
    case nlohmann::json::value_t::null:
      out << YAML::Null;
      break;
    case nlohmann::json::value_t::number_unsigned:
      out << v.get<uint64_t>();
      break;
    case nlohmann::json::value_t::number_integer:
      out << v.get<int64_t>();
      break;
    default:  // floating point, binary
      out << v.dump();
      break;
  }
}

}  // namespace

const char* CheckStatusName(CheckStatus status) {
  switch (status) {
    case CheckStatus::kPass:
      return "PASS";
    case CheckStatus::kWarn:
      return "WARN";
    case CheckStatus::kFail:
      return "FAIL";
    case CheckStatus::kSkip:
      return "SKIP";
  }
  return "?";
}

CheckItem& CheckReport::Add(std::string check, std::string node, CheckStatus status,
                            std::string summary, std::vector<std::string> evidence) {
  items.push_back(
      {std::move(check), std::move(node), status, "", std::move(summary), std::move(evidence)});
  return items.back();
}

CheckItem& CheckReport::AddFor(std::string check, std::string node, std::string subject,
                               CheckStatus status, std::string summary,
                               std::vector<std::string> evidence) {
  items.push_back({std::move(check), std::move(node), status, std::move(subject),
                   std::move(summary), std::move(evidence)});
  return items.back();
}

const CheckItem* CheckReport::FindFor(std::string_view check, std::string_view subject) const {
  for (const auto& i : items) {
    if (i.check == check && i.subject == subject) return &i;
  }
  return nullptr;
}

size_t CheckReport::Count(CheckStatus status) const {
  return std::count_if(items.begin(), items.end(),
                       [&](const CheckItem& i) { return i.status == status; });
}

std::vector<const CheckItem*> CheckReport::Find(std::string_view check,
                                                std::string_view node) const {
  std::vector<const CheckItem*> out;
  for (const auto& i : items) {
    if (i.check == check && (node.empty() || i.node == node)) out.push_back(&i);
  }
  return out;
}

nlohmann::json CheckReport::ToJson() const {
  nlohmann::json items_json = nlohmann::json::array();
  for (const auto& i : items) {
    items_json.push_back({{"check", i.check},
                          {"node", i.node},
                          {"result", CheckStatusName(i.status)},
                          {"subject", i.subject},
                          {"summary", i.summary},
                          {"evidence", i.evidence}});
  }
  nlohmann::json out = {{"command", command},
                        {"items", items_json},
                        {"summary",
                         {{"pass", Count(CheckStatus::kPass)},
                          {"warn", Count(CheckStatus::kWarn)},
                          {"fail", Count(CheckStatus::kFail)},
                          {"skip", Count(CheckStatus::kSkip)}}},
                        {"ok", !failed()}};
  if (!notes.empty()) out["notes"] = notes;
  return out;
}

std::string CheckReport::ToText() const {
  size_t node_w = 4, check_w = 5;
  for (const auto& i : items) {
    node_w = std::max(node_w, i.node.empty() ? size_t{1} : i.node.size());
    check_w = std::max(check_w, i.check.size());
  }
  std::string out = fmt::format("{:<6}  {:<{}}  {:<{}}  {}\n", "RESULT", "NODE", node_w, "CHECK",
                                check_w, "SUMMARY");
  for (const auto& i : items) {
    out += fmt::format("{:<6}  {:<{}}  {:<{}}  {}{}\n", CheckStatusName(i.status),
                       i.node.empty() ? "-" : i.node, node_w, i.check, check_w,
                       i.subject.empty() ? "" : i.subject + ": ", i.summary);
    for (const auto& e : i.evidence) out += fmt::format("{:{}}- {}\n", "", 10, e);
  }
  for (const auto& n : notes) out += n + "\n";
  out +=
      fmt::format("{}: {} passed, {} failed, {} warnings, {} skipped: {}\n", command,
                  Count(CheckStatus::kPass), Count(CheckStatus::kFail), Count(CheckStatus::kWarn),
                  Count(CheckStatus::kSkip), failed() ? "FAILED" : "OK");
  return out;
}

absl::StatusOr<OutputFormat> ParseOutputFormat(std::string_view value) {
  if (value == "text" || value == "table" || value.empty()) return OutputFormat::kText;
  if (value == "json") return OutputFormat::kJson;
  if (value == "yaml") return OutputFormat::kYaml;
  return absl::InvalidArgumentError(
      fmt::format("-o: unknown output format \"{}\" (text, json or yaml)", value));
}

std::string JsonToYaml(const nlohmann::json& value) {
  YAML::Emitter out;
  out.SetIndent(2);
  Emit(out, value);
  std::string text = out.c_str();
  if (text.empty() || text.back() != '\n') text += '\n';
  return text;
}

std::string RenderTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<std::string>>& rows,
                        const std::string& indent) {
  std::vector<size_t> widths(header.size(), 0);
  auto measure = [&](const std::vector<std::string>& row) {
    for (size_t c = 0; c < row.size() && c < widths.size(); ++c) {
      widths[c] = std::max(widths[c], row[c].size());
    }
  };
  measure(header);
  for (const auto& r : rows) measure(r);
  auto line = [&](const std::vector<std::string>& row) {
    std::string s = indent;
    for (size_t c = 0; c < widths.size(); ++c) {
      const std::string cell = c < row.size() ? row[c] : "";
      if (c + 1 == widths.size()) {
        s += cell;
      } else {
        s += fmt::format("{:<{}}  ", cell, widths[c]);
      }
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s + "\n";
  };
  std::string out = line(header);
  for (const auto& r : rows) out += line(r);
  return out;
}

}  // namespace dynmig::ops
