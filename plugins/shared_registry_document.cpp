#include "plugins/shared_registry_document.hpp"

#include <charconv>
#include <cstdint>
#include <utility>

#include <nlohmann/json.hpp>

namespace pdgate {

namespace {

using json = nlohmann::json;

std::uint64_t valid_id(std::uint64_t id, std::uint32_t ranks) {
  return id >= 1 && ranks >= 1 && id <= kLocalIdBase - ranks ? id : 0;
}

std::optional<RegistryEntry> parse_entry(const json& e) {
  if (!e.is_object())
    return std::nullopt;
  auto text = [&e](const char* key) {
    const auto it = e.find(key);
    return it != e.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  RegistryEntry out;
  const auto role = role_from_string(text("role"));
  out.url = text("url");
  out.state = text("state");
  if (!role || out.url.empty())
    return std::nullopt;
  out.role = *role;
  // A URL is short; one of megabytes would be copied into every policy
  // state and log line.
  if (out.url.size() > kMaxRegistryUrlBytes) {
    out.refused = "a url longer than " + std::to_string(kMaxRegistryUrlBytes) + " bytes";
    out.url.resize(kMaxRegistryUrlBytes);
    return out;
  }
  if (const auto it = e.find("labels"); it != e.end() && it->is_object()) {
    // The admin API's bounds (LabelLimits), the count checked before
    // anything is copied: one entry's labels must not grow every
    // replica's policy states.
    if (it->size() > LabelLimits::kMaxCount) {
      out.refused = "at most " + std::to_string(LabelLimits::kMaxCount) +
                    " labels per instance (got " + std::to_string(it->size()) + ")";
    } else {
      for (const auto& [k, v] : it->items()) {
        if (v.is_string())
          out.labels[k] = v.get<std::string>();
      }
      out.refused = label_problem(out.labels);
    }
    if (out.refused) {
      out.refused = "labels: " + *out.refused;
      out.labels.clear();
    }
  }
  if (const auto it = e.find("weight"); it != e.end()) {
    if (!it->is_number_unsigned() || it->get<std::uint64_t>() < 1 ||
        it->get<std::uint64_t>() > 1000) {
      return std::nullopt;
    }
    out.weight = static_cast<unsigned>(it->get<std::uint64_t>());
  }
  if (const auto it = e.find("data_parallel_size"); it != e.end()) {
    if (!it->is_number_unsigned() || it->get<std::uint64_t>() < 1 ||
        it->get<std::uint64_t>() > UpstreamSpec::kMaxDataParallelSize) {
      return std::nullopt;
    }
    out.dp_size = static_cast<std::uint32_t>(it->get<std::uint64_t>());
  }
  if (const auto it = e.find("id"); it != e.end() && !out.refused) {
    // An id past the bounds would collide with the ids a replica gives
    // its own instances (kLocalIdBase); one another instance has is
    // refused when it is added.
    if (it->is_number_unsigned())
      out.id = valid_id(it->get<std::uint64_t>(), out.dp_size);
    if (out.id == 0)
      out.refused = "an id that is not 1 to " + std::to_string(kLocalIdBase - out.dp_size);
  }
  return out;
}

}  // namespace

RegistryDocument parse_registry_document(std::string_view text) {
  RegistryDocument out;
  if (text.size() > kMaxRegistryDocumentBytes) {
    out.problem = "the document is " + std::to_string(text.size()) + " bytes, more than " +
                  std::to_string(kMaxRegistryDocumentBytes);
    return out;
  }
  const auto doc = json::parse(text, nullptr, false);
  if (!doc.is_object()) {
    out.problem = "the document is not a JSON object";
    return out;
  }
  std::size_t seen = 0;
  for (const auto& [field, e] : doc.items()) {
    if (++seen > kMaxRegistryDocumentEntries) {
      ++out.past_bound;
      continue;
    }
    if (auto entry = parse_entry(e))
      out.entries.push_back(std::move(*entry));
  }
  return out;
}

std::uint64_t parse_cluster_id(std::string_view text, std::uint32_t ranks) {
  if (text.empty() || text.size() > 19 ||
      text.find_first_not_of("0123456789") != std::string_view::npos)
    return 0;
  std::uint64_t id = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), id);
  if (ec != std::errc() || end != text.data() + text.size())
    return 0;
  return valid_id(id, ranks);
}

}  // namespace pdgate
