// An engine's HTTP response as the gateway reads it: the status, the two
// headers that describe the body (Content-Type, Cache-Control), and the
// body written straight into a buffer the caller lends for each parse.
// Beast's basic_parser does the framing (Content-Length, chunked, the
// connection's close); the rest of the header is read and dropped, never
// stored: Beast's message parser allocated every field of every answer
// (five or six per request) only for the gateway to look at two.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include <boost/beast/http/basic_parser.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/field.hpp>

namespace pdgate {

class EngineResponseParser : public boost::beast::http::basic_parser<false> {
 public:
  EngineResponseParser() { body_limit(boost::none); }

  unsigned status() const { return status_; }
  // Empty when the engine sent none.
  const std::string& content_type() const { return content_type_; }
  const std::string& cache_control() const { return cache_control_; }
  // Frees the header values once they have been copied (a relay that
  // lasts minutes does not keep them); status() stays.
  void drop_header_values() {
    std::string().swap(content_type_);
    std::string().swap(cache_control_);
  }

  // Where the next parse writes body bytes, and how many fit; what is
  // left of the room after it (see put()).
  void lend(char* data, std::size_t size) {
    dst_ = data;
    room_ = size;
  }
  std::size_t room_left() const { return room_; }

 private:
  using error_code = boost::beast::error_code;
  using string_view = boost::beast::string_view;

  void on_request_impl(boost::beast::http::verb, string_view, string_view, int,
                       error_code&) override {}
  void on_response_impl(int code, string_view, int, error_code&) override {
    status_ = static_cast<unsigned>(code);
  }
  void on_field_impl(boost::beast::http::field name, string_view, string_view value,
                     error_code&) override {
    if (name == boost::beast::http::field::content_type)
      content_type_.assign(value.data(), value.size());
    else if (name == boost::beast::http::field::cache_control)
      cache_control_.assign(value.data(), value.size());
  }
  void on_header_impl(error_code&) override {}
  void on_body_init_impl(const boost::optional<std::uint64_t>&, error_code&) override {}
  std::size_t on_body_impl(string_view body, error_code& ec) override { return take(body, ec); }
  void on_chunk_header_impl(std::uint64_t, string_view, error_code&) override {}
  std::size_t on_chunk_body_impl(std::uint64_t, string_view body, error_code& ec) override {
    return take(body, ec);
  }
  void on_finish_impl(error_code&) override {}

  // As Beast's buffer_body: need_buffer when the lent room is full.
  std::size_t take(string_view body, error_code& ec) {
    if (dst_ == nullptr || room_ == 0) {
      ec = boost::beast::http::error::need_buffer;
      return 0;
    }
    const std::size_t n = std::min(room_, body.size());
    std::memcpy(dst_, body.data(), n);
    dst_ += n;
    room_ -= n;
    if (n < body.size())
      ec = boost::beast::http::error::need_buffer;
    else
      ec = {};
    return n;
  }

  unsigned status_ = 0;
  std::string content_type_;
  std::string cache_control_;
  char* dst_ = nullptr;
  std::size_t room_ = 0;
};

}  // namespace pdgate
