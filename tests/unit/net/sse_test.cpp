#include "core/net/sse.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

namespace pdgate {
namespace {

// Feeds `pieces` one by one, popping events after each feed when
// `pop_each` (the gateway's pattern) or only at the end otherwise.
std::vector<SseEvent> scan(const std::vector<std::string>& pieces, bool pop_each = true) {
  SseScanner s;
  std::vector<SseEvent> out;
  SseEvent ev;
  for (const auto& p : pieces) {
    EXPECT_TRUE(s.feed(p)) << s.error();
    while (pop_each && s.next(ev))
      out.push_back(ev);
  }
  while (s.next(ev))
    out.push_back(ev);
  return out;
}

std::vector<std::string> datas(const std::vector<SseEvent>& evs) {
  std::vector<std::string> out;
  for (const auto& e : evs)
    out.push_back(e.has_data ? "D:" + e.data : (e.comment_only ? "C" : "-"));
  return out;
}

std::string concat_raw(const std::vector<SseEvent>& evs) {
  std::string out;
  for (const auto& e : evs)
    out += e.raw;
  return out;
}

const std::string kStream =
    "data: {\"id\":\"cmpl-1\",\"choices\":[{\"text\":\"Hel\"}]}\n\n"
    ": keepalive\n\n"
    "event: message\nid: 7\nretry: 100\ndata: {\"a\":1}\n\n"
    "data: line1\ndata:line2\ndata:  two spaces\n\n"
    "data\n\n"
    "data: [DONE]\n\n";

// A vLLM-style stream parses into the expected events with exact raw bytes.
TEST(Sse, ParsesEventsAndFields) {
  const auto evs = scan({kStream});
  ASSERT_EQ(evs.size(), 6u);
  EXPECT_EQ(evs[0].data, "{\"id\":\"cmpl-1\",\"choices\":[{\"text\":\"Hel\"}]}");
  EXPECT_EQ(evs[0].raw, "data: {\"id\":\"cmpl-1\",\"choices\":[{\"text\":\"Hel\"}]}\n\n");
  EXPECT_TRUE(evs[1].comment_only);
  EXPECT_FALSE(evs[1].has_data);
  EXPECT_EQ(evs[1].raw, ": keepalive\n\n");
  EXPECT_EQ(evs[2].data, "{\"a\":1}");
  EXPECT_FALSE(evs[2].comment_only);
  EXPECT_EQ(evs[2].raw, "event: message\nid: 7\nretry: 100\ndata: {\"a\":1}\n\n");
  EXPECT_EQ(evs[3].data, "line1\nline2\n two spaces");
  EXPECT_TRUE(evs[4].has_data);
  EXPECT_EQ(evs[4].data, "");
  EXPECT_TRUE(evs[5].is_done);
  EXPECT_FALSE(evs[0].is_done);
  EXPECT_EQ(concat_raw(evs), kStream);
}

// An event with only non-data fields has no data and is not comment-only.
TEST(Sse, FieldsWithoutData) {
  const auto evs = scan({"event: ping\n\n", ": c\nid: 1\n\n", "\n"});
  ASSERT_EQ(evs.size(), 3u);
  EXPECT_FALSE(evs[0].has_data);
  EXPECT_FALSE(evs[0].comment_only);
  EXPECT_FALSE(evs[1].comment_only);
  EXPECT_EQ(evs[2].raw, "\n");
  EXPECT_FALSE(evs[2].has_data);
}

// Split at every byte position (popping after each piece or only at the end), the events are the
// same.
TEST(Sse, EverySplitPosition) {
  const auto whole = scan({kStream});
  for (std::size_t cut = 0; cut <= kStream.size(); ++cut) {
    for (bool pop_each : {true, false}) {
      const auto evs = scan({kStream.substr(0, cut), kStream.substr(cut)}, pop_each);
      ASSERT_EQ(datas(evs), datas(whole)) << "cut at " << cut;
      EXPECT_EQ(concat_raw(evs), kStream) << "cut at " << cut;
    }
  }
}

// CRLF line endings: any split gives the same data; the raw bytes are exact except a
// final \n arriving after its \r's event was already popped, which is dropped.
TEST(Sse, CrLfEverySplit) {
  const std::string crlf = "data: a\r\ndata: b\r\n\r\n: c\r\n\r\ndata: [DONE]\r\n\r\n";
  const auto whole = scan({crlf});
  ASSERT_EQ(datas(whole), (std::vector<std::string>{"D:a\nb", "C", "D:[DONE]"}));
  EXPECT_EQ(concat_raw(whole), crlf);
  for (std::size_t cut = 0; cut <= crlf.size(); ++cut) {
    const auto late_pop = scan({crlf.substr(0, cut), crlf.substr(cut)}, false);
    EXPECT_EQ(datas(late_pop), datas(whole)) << cut;
    EXPECT_EQ(concat_raw(late_pop), crlf) << cut;
    const auto eager = scan({crlf.substr(0, cut), crlf.substr(cut)}, true);
    EXPECT_EQ(datas(eager), datas(whole)) << cut;
    const std::string raw = concat_raw(eager);
    const bool cut_inside_blank_crlf =
        cut > 0 && crlf[cut - 1] == '\r' && cut >= 3 && crlf.substr(cut - 3, 2) == "\r\n";
    EXPECT_EQ(raw.size(), crlf.size() - (cut_inside_blank_crlf ? 1 : 0)) << cut;
  }
}

// The relay frees the scanner's buffers between events (release_idle_memory after popping
// everything): events come out the same for every split, including a \r\n cut in two.
TEST(Sse, ReleaseIdleMemoryBetweenFeeds) {
  const std::string crlf = "data: a\r\ndata: b\r\n\r\n: c\r\n\r\ndata: [DONE]\r\n\r\n";
  for (const std::string& text : {kStream, crlf}) {
    const auto whole = scan({text});
    for (std::size_t cut = 0; cut <= text.size(); ++cut) {
      SseScanner s;
      std::vector<SseEvent> out;
      SseEvent ev;
      for (const std::string& piece : {text.substr(0, cut), text.substr(cut)}) {
        ASSERT_TRUE(s.feed(piece)) << s.error();
        while (s.next(ev))
          out.push_back(ev);
        s.release_idle_memory();
      }
      EXPECT_EQ(datas(out), datas(whole)) << cut;
      if (text == kStream) {
        EXPECT_EQ(concat_raw(out), text) << cut;
      }
      EXPECT_EQ(s.pending_bytes(), 0u) << cut;
    }
  }
}

// A \r at the end of one feed followed by \n in the next is one line ending, not two.
TEST(Sse, CrThenLfAcrossFeedsIsOneLineEnding) {
  // Were "\r" + "\n" two endings, the second would be a blank line ending the event early.
  const auto evs = scan({"data: a\r", "\ndata: b\r\n\r\n"});
  ASSERT_EQ(evs.size(), 1u);
  EXPECT_EQ(evs[0].data, "a\nb");
}

// Lone \r line endings work, including \r\r as the blank line.
TEST(Sse, CrOnly) {
  const std::string cr = "data: x\rdata: y\r\r: k\r\rdata: [DONE]\r\r";
  const auto whole = scan({cr});
  ASSERT_EQ(datas(whole), (std::vector<std::string>{"D:x\ny", "C", "D:[DONE]"}));
  for (std::size_t cut = 0; cut <= cr.size(); ++cut) {
    const auto evs = scan({cr.substr(0, cut), cr.substr(cut)});
    EXPECT_EQ(datas(evs), datas(whole)) << cut;
    EXPECT_EQ(concat_raw(evs), cr) << cut;
  }
}

// Fed one byte at a time, the stream gives the same events, each as soon as its blank line arrives.
TEST(Sse, OneByteAtATime) {
  SseScanner s;
  std::vector<SseEvent> evs;
  SseEvent ev;
  for (std::size_t i = 0; i < kStream.size(); ++i) {
    ASSERT_TRUE(s.feed(kStream.substr(i, 1)));
    while (s.next(ev)) {
      evs.push_back(ev);
      // An event is delivered on the byte that completes it.
      EXPECT_EQ(kStream[i], '\n');
      EXPECT_EQ(s.pending_bytes(), 0u);
    }
  }
  EXPECT_EQ(datas(evs), datas(scan({kStream})));
}

// pending_bytes counts only the incomplete event.
TEST(Sse, PendingBytes) {
  SseScanner s;
  ASSERT_TRUE(s.feed("data: 1\n\ndata: par"));
  EXPECT_EQ(s.pending_bytes(), 9u);
  SseEvent ev;
  ASSERT_TRUE(s.next(ev));
  EXPECT_FALSE(s.next(ev));
  EXPECT_EQ(s.pending_bytes(), 9u);
  ASSERT_TRUE(s.feed("tial\n\n"));
  EXPECT_EQ(s.pending_bytes(), 0u);
  ASSERT_TRUE(s.next(ev));
  EXPECT_EQ(ev.data, "partial");
}

// A 4 MiB event fed in 1-byte and in 7-byte pieces arrives intact, in linear time.
TEST(Sse, FourMiBEventSmallPieces) {
  const std::string payload(4u << 20, 'x');
  const std::string stream = "data: " + payload + "\n\ndata: [DONE]\n\n";
  for (std::size_t piece : {std::size_t{1}, std::size_t{7}}) {
    const auto start = std::chrono::steady_clock::now();
    SseScanner s;
    SseEvent ev;
    std::vector<SseEvent> evs;
    for (std::size_t i = 0; i < stream.size(); i += piece) {
      ASSERT_TRUE(s.feed(std::string_view(stream).substr(i, piece)));
      while (s.next(ev))
        evs.push_back(ev);
    }
    const auto secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ASSERT_EQ(evs.size(), 2u);
    EXPECT_EQ(evs[0].data.size(), payload.size());
    EXPECT_EQ(evs[0].data, payload);
    EXPECT_TRUE(evs[1].is_done);
    // Quadratic rescanning would take minutes here; linear is well under a second.
    EXPECT_LT(secs, 10.0) << "piece " << piece;
  }
}

// Many small events fed in one big chunk are all returned, not mistaken for one huge event.
TEST(Sse, ManyEventsInOneFeedUnderCap) {
  std::string stream;
  for (int i = 0; i < 1000; ++i)
    stream += "data: " + std::to_string(i) + "\n\n";
  SseScanner s(64);
  ASSERT_TRUE(s.feed(stream)) << s.error();
  SseEvent ev;
  int n = 0;
  while (s.next(ev))
    EXPECT_EQ(ev.data, std::to_string(n++));
  EXPECT_EQ(n, 1000);
}

// An incomplete event growing past the cap fails the feed; later feeds fail too.
TEST(Sse, CapExceededIncomplete) {
  SseScanner s(100);
  ASSERT_TRUE(s.feed("data: ok\n\n"));
  EXPECT_TRUE(s.feed(std::string(50, 'a')));
  EXPECT_FALSE(s.feed(std::string(51, 'a')));
  EXPECT_NE(s.error().find("100"), std::string::npos) << s.error();
  EXPECT_FALSE(s.feed("\n\n"));
  // The event completed before the failure can still be delivered.
  SseEvent ev;
  ASSERT_TRUE(s.next(ev));
  EXPECT_EQ(ev.data, "ok");
  EXPECT_FALSE(s.next(ev));
}

// A complete event larger than the cap fails as well, even when it arrives in one feed.
TEST(Sse, CapExceededComplete) {
  SseScanner s(16);
  EXPECT_FALSE(s.feed("data: " + std::string(20, 'b') + "\n\n"));
  EXPECT_FALSE(s.error().empty());
  SseScanner exact(10);
  EXPECT_TRUE(exact.feed("data: 12\n\n"));  // exactly 10 bytes is allowed
}

// sse_data_event frames JSON as one data line, or several when it contains line breaks.
TEST(Sse, DataEventHelper) {
  EXPECT_EQ(sse_data_event(R"({"a":1})"), "data: {\"a\":1}\n\n");
  const std::string multi = sse_data_event("{\n\"a\":1\r\n}");
  EXPECT_EQ(multi, "data: {\ndata: \"a\":1\ndata: }\n\n");
  const auto evs = scan({multi});
  ASSERT_EQ(evs.size(), 1u);
  EXPECT_EQ(evs[0].data, "{\n\"a\":1\n}");
  EXPECT_EQ(scan({sse_data_event("[DONE]")})[0].is_done, true);
}

// ready_bytes() is what next() would hand out, event after event, for
// every split of a stream (CR, LF and CRLF endings, comments, a partial
// event at the end), and drop_ready() leaves the partial event in place.
TEST(Sse, ReadyBytesEqualPoppedEvents) {
  const std::string stream =
      "data: a\n\n: keepalive\r\n\r\nevent: x\rdata: b\r\rdata: c\r\n\r\ndata: partial";
  for (std::size_t cut = 0; cut <= stream.size(); ++cut) {
    SseScanner bulk, single;
    std::string bulk_out, single_out;
    for (const auto piece :
         {std::string_view(stream).substr(0, cut), std::string_view(stream).substr(cut)}) {
      ASSERT_TRUE(bulk.feed(piece));
      ASSERT_TRUE(single.feed(piece));
      bulk_out.append(bulk.ready_bytes());
      bulk.drop_ready();
      SseEvent ev;
      while (single.next(ev))
        single_out += ev.raw;
    }
    EXPECT_EQ(bulk_out, single_out) << "cut at " << cut;
    EXPECT_EQ(bulk.pending_bytes(), single.pending_bytes()) << "cut at " << cut;
  }
}

}  // namespace
}  // namespace pdgate
