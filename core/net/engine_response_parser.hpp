// An engine's HTTP/1.x response as the gateway reads it: the status, the
// two headers that describe the body (Content-Type, Cache-Control), the
// framing (Content-Length, chunked, or the connection's close) and the body
// written straight into a buffer the caller lends for each parse.
//
// Written for the one job, in place of Beast's basic_parser: the gateway
// looks at four header fields of every answer and drops the rest, and
// Beast's generic parser spent ~700 instructions per field (a hash of every
// name, list validation, callbacks), 4k of a one-hop request's 44k. The
// interface is the subset of basic_parser's the exchange used, with the
// same error codes (boost::beast::http::error), so the exchange's handling
// of need_more, need_buffer and the connection's end is unchanged.
//
// What it accepts is a subset of what Beast's parser accepts (the fuzzer
// checks both on the same bytes): CRLF line endings only, no obs-fold, one
// Content-Length, never Content-Length with Transfer-Encoding; interim
// answers (1xx) are skipped whole, where Beast's parser stops at them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <boost/asio/buffer.hpp>
#include <boost/beast/core/error.hpp>

namespace pdgate {

class EngineResponseParser {
 public:
  using error_code = boost::beast::error_code;

  // Interim answers (1xx but 101, e.g. 103 Early Hints) are skipped, as
  // RFC 9110 15.2 asks; more than this many before the final answer is
  // not an engine speaking HTTP (bad_status). A 101 is never asked for,
  // so it is bad_status too.
  static constexpr unsigned kMaxInterimAnswers = 16;

  // Parses what it can of `bytes` and returns how many it used; the caller
  // drops those and passes the rest (with more) again. `ec`:
  // - need_more: nothing more can be parsed until more bytes come (some of
  //   these may have been used: body bytes, a chunk's framing);
  // - need_buffer: the lent room is full (lend more and call again);
  // - a parse error (bad_version, bad_status, bad_reason, bad_field,
  //   bad_value, bad_content_length, bad_transfer_encoding, bad_chunk,
  //   header_limit): the answer is unusable;
  // - none: the header was parsed (and not eager), or the answer is done.
  std::size_t put(boost::asio::const_buffer bytes, error_code& ec);
  // The connection ended: completes a body framed by the close; anything
  // else unfinished is partial_message.
  void put_eof(error_code& ec);

  // Without eager, a put() that completes the header returns there (the
  // body's first bytes stay for the caller to read when it is ready);
  // with it, one put() also parses every body byte given.
  void eager(bool on) { eager_ = on; }
  bool eager() const { return eager_; }
  // The largest header (status line and fields, and a chunked body's
  // trailers) accepted; 8 KiB unless set.
  void header_limit(std::uint32_t bytes) { header_limit_ = bytes; }

  bool got_some() const { return got_some_; }
  bool is_header_done() const { return state_ > State::header; }
  bool is_done() const { return state_ == State::done; }
  // Whether the connection may carry another request once this answer is
  // done: HTTP/1.1 without "Connection: close", HTTP/1.0 with
  // "Connection: keep-alive", and never a body framed by the close.
  bool keep_alive() const { return keep_alive_; }

  unsigned status() const { return status_; }
  // Empty when the engine sent none (the last one when it sent several).
  const std::string& content_type() const { return content_type_; }
  const std::string& cache_control() const { return cache_control_; }
  // Frees the header values once they have been copied (a relay that
  // lasts minutes does not keep them); status() stays.
  void drop_header_values() {
    std::string().swap(content_type_);
    std::string().swap(cache_control_);
  }

  // Where the next parse writes body bytes, and how many fit; what is
  // left of the room after it.
  void lend(char* data, std::size_t size) {
    dst_ = data;
    room_ = size;
  }
  std::size_t room_left() const { return room_; }

 private:
  enum class State : std::uint8_t {
    header,      // status line and fields, parsed once all are there
    length,      // remaining_ body bytes of a Content-Length body
    until_eof,   // a body framed by the connection's close
    chunk_size,  // a chunk's size line (or the last chunk's, and trailers)
    chunk_data,  // remaining_ bytes of the current chunk
    chunk_crlf,  // the CRLF after a chunk's data
    done,
  };

  // Each returns the bytes used from `s`; `ec` as put()'s.
  std::size_t parse_header(std::string_view s, error_code& ec);
  std::size_t parse_chunk_size(std::string_view s, error_code& ec);
  // Copies up to `n` (at least one) body bytes into the lent room.
  std::size_t take(const char* p, std::size_t n, error_code& ec);
  // One header field; false (with ec set) if it is malformed.
  bool on_field(std::string_view name, std::string_view value, error_code& ec);

  State state_ = State::header;
  bool eager_ = false;
  bool got_some_ = false;
  bool keep_alive_ = false;
  bool chunked_ = false;
  bool has_length_ = false;
  bool has_encoding_ = false;
  bool close_ = false;       // Connection: close
  bool keep_token_ = false;  // Connection: keep-alive
  unsigned status_ = 0;
  unsigned interim_answers_ = 0;
  std::uint32_t header_limit_ = 8 * 1024;
  std::size_t header_scanned_ = 0;  // where the search for the header's end resumes
  std::uint64_t remaining_ = 0;
  std::string content_type_;
  std::string cache_control_;
  char* dst_ = nullptr;
  std::size_t room_ = 0;
};

}  // namespace pdgate
