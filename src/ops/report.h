// Check reports shared by `dynmig preflight` and `dynmig validate`: items that PASS, FAIL, WARN
// or are SKIPped, each with its evidence, rendered as a readable table or as JSON/YAML. Also the
// output helpers every ops command uses (JSON to YAML, aligned tables). Pure; thread-compatible.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace dynmig::ops {

enum class CheckStatus { kPass, kWarn, kFail, kSkip };
const char* CheckStatusName(CheckStatus status);  // "PASS", "WARN", "FAIL", "SKIP"

struct CheckItem {
  std::string check;  // stable id, e.g. "legacy-pods"
  std::string node;   // "" for cluster-wide items
  CheckStatus status = CheckStatus::kPass;
  std::string subject;                // what the item is about beyond the node (a pod), or ""
  std::string summary;                // one line
  std::vector<std::string> evidence;  // supporting lines (pods, annotations, values)
};

struct CheckReport {
  std::string command;  // "preflight", "validate"
  std::vector<CheckItem> items;
  // Free-form lines printed after the table (e.g. the canary's step log).
  std::vector<std::string> notes;

  CheckItem& Add(std::string check, std::string node, CheckStatus status, std::string summary,
                 std::vector<std::string> evidence = {});
  // The same about a subject (a pod key): printed "subject: summary".
  CheckItem& AddFor(std::string check, std::string node, std::string subject, CheckStatus status,
                    std::string summary, std::vector<std::string> evidence = {});
  size_t Count(CheckStatus status) const;
  bool failed() const { return Count(CheckStatus::kFail) > 0; }
  // The items of one check (tests).
  std::vector<const CheckItem*> Find(std::string_view check, std::string_view node = "") const;
  // The one item of `check` about `subject`, or nullptr.
  const CheckItem* FindFor(std::string_view check, std::string_view subject) const;

  nlohmann::json ToJson() const;
  // RESULT  NODE  CHECK  SUMMARY, evidence indented below each item, then a verdict line.
  std::string ToText() const;
};

// What a command answers: the same content for people and for machines.
struct CommandOutput {
  nlohmann::json json;
  std::string text;
};

// Output formats of the ops commands.
enum class OutputFormat { kText, kJson, kYaml };
absl::StatusOr<OutputFormat> ParseOutputFormat(std::string_view value);  // "text"|"json"|"yaml"

// JSON rendered as YAML (block style; strings quoted when YAML would read them as something else).
std::string JsonToYaml(const nlohmann::json& value);

// Renders rows as columns padded to the widest cell (two spaces apart), with a header row.
std::string RenderTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<std::string>>& rows,
                        const std::string& indent = "");

}  // namespace dynmig::ops
