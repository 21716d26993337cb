#include "sim/one_hop_api.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/generation_request.hpp"
#include "sim/responses.hpp"
#include "sim/tokenizer.hpp"

namespace pdgate::sim {

namespace {

using nlohmann::json;

OneHopAnswer error(int code, const std::string& message) {
  return {code, make_error(message, code).dump(), "application/json"};
}

// A number in [-1, 1) hashed from `text` and `salt`.
double hashed_unit(std::string_view text, std::uint64_t salt) {
  const std::uint64_t h = fnv1a64(text, 14695981039346656037ull ^ (salt * 0x9E3779B97F4A7C15ull));
  return static_cast<double>(h % 2000) / 1000.0 - 1.0;
}

ojson vector_for(std::string_view text) {
  ojson v = ojson::array();
  for (std::size_t k = 0; k < kEmbeddingDim; ++k)
    v.push_back(hashed_unit(text, k + 1));
  return v;
}

// A score in [0, 1) for a pair.
double pair_score(std::string_view a, std::string_view b) {
  std::string both(a);
  both.push_back('\0');
  both.append(b);
  return (hashed_unit(both, 0) + 1.0) / 2.0;
}

// The texts of an embeddings/pooling/classify `input`: a string, a list
// of strings, a list of token ids, or a list of such lists.
std::optional<std::vector<std::string>> input_texts(const json& input) {
  std::vector<std::string> out;
  auto ids_text = [](const json& ids) -> std::optional<std::string> {
    std::vector<std::uint32_t> v;
    for (const json& id : ids) {
      if (!id.is_number_unsigned())
        return std::nullopt;
      v.push_back(id.get<std::uint32_t>());
    }
    return detokenize_ids(v);
  };
  if (input.is_string()) {
    out.push_back(input.get<std::string>());
    return out;
  }
  if (!input.is_array() || input.empty())
    return std::nullopt;
  if (input.front().is_number()) {
    auto t = ids_text(input);
    if (!t)
      return std::nullopt;
    out.push_back(std::move(*t));
    return out;
  }
  for (const json& item : input) {
    if (item.is_string()) {
      out.push_back(item.get<std::string>());
    } else if (item.is_array()) {
      auto t = ids_text(item);
      if (!t)
        return std::nullopt;
      out.push_back(std::move(*t));
    } else {
      return std::nullopt;
    }
  }
  return out;
}

ojson usage_for(std::size_t tokens) {
  ojson u;
  u["prompt_tokens"] = tokens;
  u["total_tokens"] = tokens;
  u["completion_tokens"] = 0;
  u["prompt_tokens_details"] = nullptr;
  return u;
}

ojson list_head(const std::string& prefix, const std::string& rid, std::int64_t created,
                const std::string& model) {
  ojson j;
  j["id"] = prefix + rid;
  j["object"] = "list";
  j["created"] = created;
  j["model"] = model;
  return j;
}

std::vector<std::string> strings_of(const json& v) {
  std::vector<std::string> out;
  if (v.is_string())
    out.push_back(v.get<std::string>());
  if (v.is_array()) {
    for (const json& s : v) {
      if (s.is_string())
        out.push_back(s.get<std::string>());
    }
  }
  return out;
}

// multipart/form-data: the named fields' bytes. Returns nullopt when the
// body is no form with that boundary.
struct FormField {
  std::string name;
  std::string_view value;
};
std::optional<std::vector<FormField>> form_fields(std::string_view content_type,
                                                  std::string_view body) {
  const auto b = content_type.find("boundary=");
  if (b == std::string_view::npos)
    return std::nullopt;
  std::string_view boundary = content_type.substr(b + 9);
  boundary = boundary.substr(0, boundary.find(';'));
  if (boundary.size() >= 2 && boundary.front() == '"' && boundary.back() == '"')
    boundary = boundary.substr(1, boundary.size() - 2);
  if (boundary.empty())
    return std::nullopt;
  const std::string delim = "--" + std::string(boundary);
  std::vector<FormField> out;
  std::size_t at = body.find(delim);
  if (at == std::string_view::npos)
    return std::nullopt;
  for (;;) {
    at += delim.size();
    if (body.substr(at, 2) == "--")
      return out;  // the closing delimiter
    const std::size_t head_end = body.find("\r\n\r\n", at);
    if (head_end == std::string_view::npos)
      return std::nullopt;
    const std::string_view head = body.substr(at, head_end - at);
    const std::size_t next = body.find("\r\n" + delim, head_end + 4);
    if (next == std::string_view::npos)
      return std::nullopt;
    FormField f;
    if (const auto n = head.find("name=\""); n != std::string_view::npos) {
      const auto e = head.find('"', n + 6);
      if (e != std::string_view::npos)
        f.name = std::string(head.substr(n + 6, e - n - 6));
    }
    f.value = body.substr(head_end + 4, next - head_end - 4);
    out.push_back(std::move(f));
    at = next + 2;
  }
}

OneHopAnswer transcription(std::string_view content_type, const std::string& body,
                           const std::string& model) {
  const auto fields = form_fields(content_type, body);
  if (!fields)
    return error(400, "Invalid multipart/form-data body");
  std::optional<std::string_view> file;
  for (const FormField& f : *fields) {
    if (f.name == "file")
      file = f.value;
    if (f.name == "model" && f.value != model)
      return error(404, "The model `" + std::string(f.value) + "` does not exist.");
  }
  if (!file)
    return error(400, "Field required: file");
  // The text names the upload's size and hash: a test can tell that the
  // bytes arrived as sent.
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a64(*file)));
  ojson j;
  j["text"] = std::to_string(file->size()) + " bytes of audio, fnv1a64 " + hex;
  j["usage"] = {{"type", "duration"}, {"seconds", file->size() / 32000 + 1}};
  return {200, j.dump(), "application/json"};
}

}  // namespace

std::string detokenize_ids(const std::vector<std::uint32_t>& ids) {
  std::string out;
  for (std::uint32_t id : ids) {
    for (int k = 0; k < 4; ++k)
      out.push_back(static_cast<char>((id >> (8 * k)) & 0xff));
  }
  while (!out.empty() && out.back() == '\0')
    out.pop_back();
  return out;
}

bool is_one_hop_path(std::string_view path) {
  static constexpr std::string_view kPaths[] = {"/detokenize",
                                                "/v1/embeddings",
                                                "/pooling",
                                                "/classify",
                                                "/score",
                                                "/v1/score",
                                                "/rerank",
                                                "/v1/rerank",
                                                "/v2/rerank",
                                                "/v1/audio/transcriptions",
                                                "/v1/audio/translations"};
  return std::find(std::begin(kPaths), std::end(kPaths), path) != std::end(kPaths);
}

OneHopAnswer answer_one_hop(std::string_view path, std::string_view content_type,
                            const std::string& body_text, const std::string& model,
                            const std::string& rid, std::int64_t created) {
  if (path == "/v1/audio/transcriptions" || path == "/v1/audio/translations")
    return transcription(content_type, body_text, model);
  const json body = json::parse(body_text, nullptr, false);
  if (body.is_discarded())
    return error(400, "Invalid JSON in request body");
  if (!body.is_object())
    return error(400, "Request body must be a JSON object");
  if (std::optional<HttpError> e = check_model(body, model))
    return error(e->code, e->message);

  if (path == "/detokenize") {
    if (!body.contains("tokens") || !body["tokens"].is_array())
      return error(400, "Field required: tokens");
    std::vector<std::uint32_t> ids;
    for (const json& id : body["tokens"]) {
      if (!id.is_number_unsigned())
        return error(400, "'tokens' must be a list of token ids");
      ids.push_back(id.get<std::uint32_t>());
    }
    ojson j;
    j["prompt"] = detokenize_ids(ids);
    return {200, j.dump(), "application/json"};
  }

  if (path == "/v1/embeddings" || path == "/pooling" || path == "/classify") {
    if (!body.contains("input"))
      return error(400, "Field required: input");
    const auto texts = input_texts(body["input"]);
    if (!texts)
      return error(400, "'input' must be a string, a list of strings or of token ids");
    const std::string prefix = path == "/v1/embeddings" ? "embd-"
                               : path == "/pooling"     ? "pool-"
                                                        : "classify-";
    ojson j = list_head(prefix, rid, created, model);
    ojson data = ojson::array();
    std::size_t tokens = 0;
    for (std::size_t i = 0; i < texts->size(); ++i) {
      const std::string& t = (*texts)[i];
      tokens += tokens_for_bytes(t.size());
      ojson d;
      d["index"] = i;
      if (path == "/classify") {
        const double p = (hashed_unit(t, 7) + 1.0) / 2.0;
        d["label"] = p >= 0.5 ? "LABEL_0" : "LABEL_1";
        d["probs"] = ojson::array({p, 1.0 - p});
        d["num_classes"] = 2;
      } else if (path == "/pooling") {
        d["object"] = "pooling";
        d["data"] = vector_for(t);
      } else {
        d["object"] = "embedding";
        d["embedding"] = vector_for(t);
      }
      data.push_back(std::move(d));
    }
    j["data"] = std::move(data);
    j["usage"] = usage_for(tokens);
    return {200, j.dump(), "application/json"};
  }

  if (path == "/score" || path == "/v1/score") {
    // text_1 / text_2, or the newer queries / documents.
    std::vector<std::string> left = strings_of(body.value("text_1", body.value("queries", json())));
    std::vector<std::string> right =
        strings_of(body.value("text_2", body.value("documents", json())));
    if (left.empty() || right.empty())
      return error(400, "Field required: text_1 and text_2");
    if (left.size() != 1 && left.size() != right.size())
      return error(400, "text_1 must be one text or as many as text_2");
    ojson j = list_head("score-", rid, created, model);
    ojson data = ojson::array();
    std::size_t tokens = 0;
    for (std::size_t i = 0; i < right.size(); ++i) {
      const std::string& l = left.size() == 1 ? left[0] : left[i];
      tokens += tokens_for_bytes(l.size() + right[i].size());
      ojson d;
      d["index"] = i;
      d["object"] = "score";
      d["score"] = pair_score(l, right[i]);
      data.push_back(std::move(d));
    }
    j["data"] = std::move(data);
    j["usage"] = usage_for(tokens);
    return {200, j.dump(), "application/json"};
  }

  // /rerank, /v1/rerank, /v2/rerank.
  if (!body.contains("query") || !body["query"].is_string())
    return error(400, "Field required: query");
  const std::string query = body["query"].get<std::string>();
  const std::vector<std::string> docs = strings_of(body.value("documents", json()));
  if (docs.empty())
    return error(400, "Field required: documents");
  std::vector<std::pair<double, std::size_t>> ranked;
  std::size_t tokens = 0;
  for (std::size_t i = 0; i < docs.size(); ++i) {
    ranked.emplace_back(pair_score(query, docs[i]), i);
    tokens += tokens_for_bytes(query.size() + docs[i].size());
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::size_t top = ranked.size();
  if (body.contains("top_n") && body["top_n"].is_number_unsigned() &&
      body["top_n"].get<std::size_t>() > 0)
    top = std::min(top, body["top_n"].get<std::size_t>());
  ojson j;
  j["id"] = "rerank-" + rid;
  j["model"] = model;
  j["usage"] = {{"prompt_tokens", tokens}, {"total_tokens", tokens}};
  ojson results = ojson::array();
  for (std::size_t k = 0; k < top; ++k) {
    ojson r;
    r["index"] = ranked[k].second;
    r["document"] = {{"text", docs[ranked[k].second]}};
    r["relevance_score"] = ranked[k].first;
    results.push_back(std::move(r));
  }
  j["results"] = std::move(results);
  return {200, j.dump(), "application/json"};
}

}  // namespace pdgate::sim
