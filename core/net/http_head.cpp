#include "core/net/http_head.hpp"

namespace pdgate {

namespace {

void append_fields(std::string& out, const boost::beast::http::fields& fields) {
  for (const auto& f : fields) {
    out += f.name_string();
    out += ": ";
    out += f.value();
    out += "\r\n";
  }
  out += "\r\n";
}

const char* version_text(unsigned version) {
  return version == 10 ? "HTTP/1.0" : "HTTP/1.1";
}

}  // namespace

std::string render_request_head(const boost::beast::http::request_header<>& req) {
  std::string head;
  head.reserve(256);
  head += req.method_string();
  head += ' ';
  head += req.target();
  head += ' ';
  head += version_text(req.version());
  head += "\r\n";
  append_fields(head, req);
  return head;
}

std::string render_head(const boost::beast::http::response_header<>& res) {
  std::string head;
  head.reserve(256);
  head += version_text(res.version());
  head += ' ';
  head += std::to_string(res.result_int());
  head += ' ';
  head += res.reason();
  head += "\r\n";
  append_fields(head, res);
  return head;
}

}  // namespace pdgate
