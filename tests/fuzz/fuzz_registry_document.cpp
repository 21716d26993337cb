// The shared registry's document as a replica reads it from Redis
// (plugins/shared_registry_document.cpp), the instance ids Redis answers
// (parse_cluster_id), and label sets checked against
// the bounds every source of labels holds (label_problem,
// core/config/validate.cpp). The first byte picks the mode: a document, a
// label set made from the bytes (names and values split at NUL and '='),
// or an id (a rank count, then the text). Whatever the bytes: no crash,
// at most the bounded number of entries, every entry kept has labels
// within the bounds, and every id kept leaves its ranks below the ids a
// replica numbers its own instances from.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>

#include "core/config/config.hpp"
#include "plugins/shared_registry_document.hpp"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant failed: %s\n", what);
    std::abort();
  }
}

void fuzz_document(std::string_view text) {
  const pdgate::RegistryDocument doc = pdgate::parse_registry_document(text);
  check(doc.entries.size() <= pdgate::kMaxRegistryDocumentEntries, "entries bounded");
  if (doc.problem)
    check(doc.entries.empty() && doc.past_bound == 0, "an unusable document yields nothing");
  for (const auto& e : doc.entries) {
    check(!e.url.empty(), "an entry has a URL");
    check(e.url.size() <= pdgate::kMaxRegistryUrlBytes, "URL bounded");
    check(e.weight >= 1 && e.weight <= 1000, "weight in range");
    check(e.dp_size >= 1 && e.dp_size <= pdgate::UpstreamSpec::kMaxDataParallelSize,
          "data_parallel_size in range");
    if (!e.refused && e.id != 0)
      check(e.id <= pdgate::kLocalIdBase - e.dp_size,
            "an id kept leaves its ranks below the local ids");
    if (e.refused)
      check(e.labels.empty(), "a refused entry keeps no labels");
    else
      check(!pdgate::label_problem(e.labels), "kept labels are within the bounds");
  }
}

void fuzz_labels(std::string_view bytes) {
  std::map<std::string, std::string> labels;
  std::size_t pos = 0;
  while (pos <= bytes.size()) {
    std::size_t end = bytes.find('\0', pos);
    if (end == std::string_view::npos)
      end = bytes.size();
    const std::string_view item = bytes.substr(pos, end - pos);
    const std::size_t eq = item.find('=');
    labels[std::string(item.substr(0, eq))] =
        eq == std::string_view::npos ? std::string() : std::string(item.substr(eq + 1));
    pos = end + 1;
  }
  const auto problem = pdgate::label_problem(labels);
  std::size_t total = 0;
  bool fits = labels.size() <= pdgate::LabelLimits::kMaxCount;
  for (const auto& [k, v] : labels) {
    fits = fits && !k.empty() && k.size() <= pdgate::LabelLimits::kMaxKeyBytes &&
           v.size() <= pdgate::LabelLimits::kMaxValueBytes;
    total += k.size() + v.size();
  }
  fits = fits && total <= pdgate::LabelLimits::kMaxTotalBytes;
  check(fits == !problem, "label_problem agrees with the bounds");
}

// An id as Redis answers it: one kept is a plain decimal number whose
// ranks all stay below the ids a replica gives its own instances.
void fuzz_cluster_id(std::string_view bytes) {
  if (bytes.empty())
    return;
  const std::uint32_t ranks = static_cast<unsigned char>(bytes[0]);
  const std::string_view text = bytes.substr(1);
  const std::uint64_t id = pdgate::parse_cluster_id(text, ranks);
  if (id == 0)
    return;
  check(ranks >= 1 && id + ranks - 1 < pdgate::kLocalIdBase,
        "an id's ranks stay below the local ids");
  check(std::to_string(id) == text.substr(text.find_first_not_of('0') == std::string_view::npos
                                              ? text.size()
                                              : text.find_first_not_of('0')),
        "the id is the number written");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0)
    return 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 3 == 0)
    fuzz_document(bytes);
  else if (data[0] % 3 == 1)
    fuzz_labels(bytes);
  else
    fuzz_cluster_id(bytes);
  return 0;
}
