#include "core/base/json_body.hpp"
#include "core/base/json_edit.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace pdgate {
namespace {

using nlohmann::json;

std::string nested(std::size_t levels) {
  // `levels` arrays inside the top-level object: total depth levels + 1.
  return R"({"a":)" + std::string(levels, '[') + std::string(levels, ']') + "}";
}

// Renders the edits, checks the output is valid for both our validator and
// nlohmann, and that it means the same as `expected`.
void expect_render(JsonBodyEditor& e, std::string_view expected) {
  const std::string out = e.render();
  const auto idx = index_json_object(out);
  ASSERT_TRUE(idx.ok()) << idx.error() << "\n" << out;
  ASSERT_TRUE(json::accept(out)) << out;
  EXPECT_EQ(json::parse(out), json::parse(expected)) << out;
}

// --- Validation -----------------------------------------------------------

// Valid objects of every value type and spacing are accepted, and nlohmann agrees.
TEST(JsonValidate, AcceptsValidCorpus) {
  const std::vector<std::string> corpus = {
      "{}",
      " \t\r\n{ \t\r\n} \t\r\n",
      R"({"a":1})",
      R"({"a":-0,"b":0.5,"c":-1.25e+10,"d":1E-2,"e":123456789012345678901234567890})",
      R"({"s":"plain","e":"\"\\\/\b\f\n\r\t","u":"\u0041\u00e9\u20ac\ud83d\ude00"})",
      "{\"utf8\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf\"}",
      R"({"t":true,"f":false,"n":null})",
      R"({"arr":[],"obj":{},"mix":[1,"a",{"b":[null,true]},[[]]]})",
      "{\n  \"a\" :\n  [ 1 ,\n 2 ] ,\n \"b\" : { \"c\" : \"d\" }\n}",
      R"({"":""})",
      R"({"dup":1,"dup":2})",
  };
  for (const auto& text : corpus) {
    const auto r = index_json_object(text);
    EXPECT_TRUE(r.ok()) << text << ": " << r.error();
    EXPECT_TRUE(json::accept(text)) << text;
  }
}

// Numbers beyond double range are grammatical JSON (Python reads 1e400 as inf), so they pass.
TEST(JsonValidate, AcceptsHugeExponent) {
  EXPECT_TRUE(index_json_object(R"({"big":1e400,"small":-1e-400})").ok());
}

// Malformed texts are rejected with a message naming the byte offset.
TEST(JsonValidate, RejectsInvalidCorpus) {
  const std::vector<std::string> corpus = {
      "",
      "   ",
      "{",
      "}",
      R"({"a":1)",
      R"({"a":1,})",
      R"({"a":[1,2,]})",
      R"({,})",
      R"({"a" 1})",
      R"({"a":})",
      R"({"a":01})",
      R"({"a":-01})",
      R"({"a":00})",
      R"({"a":1.})",
      R"({"a":.5})",
      R"({"a":1e})",
      R"({"a":1e+})",
      R"({"a":+1})",
      R"({"a":-})",
      R"({"a":NaN})",
      R"({"a":Infinity})",
      R"({"a":tru})",
      R"({"a":nul})",
      R"({"a":True})",
      R"({'a':1})",
      R"({a:1})",
      R"({1:2})",
      R"({"a":"\ud800"})",
      R"({"a":"\udc00"})",
      R"({"a":"\ud800\u0041"})",
      R"({"a":"\ud800x"})",
      R"({"a":"\x41"})",
      R"({"a":"\u12g4"})",
      R"({"a":"\u12"})",
      R"({"a":"unterminated})",
      "{\"a\":\"ctl\x01\"}",
      "{\"a\":\"raw\nnewline\"}",
      "{\"a\":\"tab\there\"}",
      "{\"a\":\"\xff\"}",
      "{\"a\":\"\xc0\xaf\"}",
      "{\"a\":\"\xe0\x80\xaf\"}",
      "{\"a\":\"\xed\xa0\x80\"}",
      "{\"a\":\"\xf4\x90\x80\x80\"}",
      "{\"a\":\"\xe2\x82\"}",
      "{\"a\":\"\x80\"}",
      "{\"a\":1}\x80",
      "\xef\xbb\xbf{}",
      R"({"a":1}x)",
      R"({"a":1}{})",
      R"({"a":[1})",
      R"({"a":{"b":1])",
      std::string("{\"a\":1}\0", 8),
  };
  for (const auto& text : corpus) {
    const auto r = index_json_object(text);
    ASSERT_FALSE(r.ok()) << "accepted: " << text;
    EXPECT_NE(r.error().find("at byte "), std::string::npos) << r.error();
  }
}

// A non-object top level (array, string, number, literal) is rejected.
TEST(JsonValidate, RejectsNonObjectTopLevel) {
  for (std::string text : {"[]", "[{}]", "\"s\"", "1", "null", "true"}) {
    const auto r = index_json_object(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.error().find("object"), std::string::npos) << r.error();
  }
}

// An empty body is rejected with a message saying the body is empty.
TEST(JsonValidate, EmptyBodyMessage) {
  const auto r = index_json_object("");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("empty"), std::string::npos) << r.error();
}

// The error offset points at the offending byte.
TEST(JsonValidate, ErrorOffsetIsExact) {
  const auto r = index_json_object(R"({"a":[1,2,]})");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("at byte 10"), std::string::npos) << r.error();
  const auto lz = index_json_object(R"({"abc":012})");
  ASSERT_FALSE(lz.ok());
  EXPECT_NE(lz.error().find("at byte 7"), std::string::npos) << lz.error();
}

// Long integer arrays (a prefill answer's block ids) take a fast path; a bad element anywhere in
// one is still found, at its exact offset, and every other element form is still accepted.
TEST(JsonValidate, LongIntegerArrays) {
  std::string ids;
  for (int i = 0; i < 5000; ++i)
    ids += (i == 0 ? "" : ",") + std::to_string(i * 37);
  const std::string ok = R"({"kv":{"remote_block_ids":[)" + ids + R"(]},"x":1})";
  ASSERT_TRUE(index_json_object(ok).ok());
  EXPECT_TRUE(json::accept(ok));
  const std::size_t mid = ok.find(",1850,");  // element 50
  ASSERT_NE(mid, std::string::npos);
  for (const std::string bad : {"01", "1.", "-", "1e", "+1", "", "1 1", "0x1"}) {
    std::string text = ok;
    text.replace(mid + 1, 4, bad);
    const auto r = index_json_object(text);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(json::accept(text), false) << bad;
  }
  for (const std::string good : {"-1", "1.5", " 7 ", "0", "2e3", "\"s\"", "[1,2]", "null"}) {
    std::string text = ok;
    text.replace(mid + 1, 4, good);
    EXPECT_TRUE(index_json_object(text).ok()) << good;
  }
  std::string lz = ok;
  lz.replace(mid + 1, 4, "0185");
  const auto r = index_json_object(lz);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("at byte " + std::to_string(mid + 1)), std::string::npos) << r.error();
}

// Nesting of exactly kMaxJsonDepth levels is accepted; one more is rejected.
TEST(JsonValidate, DepthLimit) {
  EXPECT_TRUE(index_json_object(nested(kMaxJsonDepth - 1)).ok());
  const auto r = index_json_object(nested(kMaxJsonDepth));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("nesting"), std::string::npos) << r.error();
  // Far deeper input fails the same way rather than exhausting the stack.
  EXPECT_FALSE(index_json_object(nested(1'000'000)).ok());
}

// validate_json accepts any JSON value at the top level with the same rules.
TEST(JsonValidate, ValidateAnyValue) {
  EXPECT_TRUE(validate_json("[1,2]").ok());
  EXPECT_TRUE(validate_json(" \"s\" ").ok());
  EXPECT_TRUE(validate_json("null").ok());
  EXPECT_FALSE(validate_json("[1,]").ok());
  EXPECT_FALSE(validate_json("1 2").ok());
  EXPECT_FALSE(validate_json("").ok());
}

// Random mutations of valid documents: we accept exactly when nlohmann accepts an object.
TEST(JsonValidate, AgreesWithNlohmannOnMutations) {
  const std::vector<std::string> seeds = {
      R"({"model":"m","prompt":"a\"b\\c\u00e9","n":[1,-2.5e3,true,null],"o":{"k":"v"}})",
      R"({"messages":[{"role":"user","content":"hi \ud83d\ude00"}],"max_tokens":10})",
      "{ \"a\" : [ 0 , 1.0 , -0e0 ] , \"b\" : \"\xc3\xa9\" }",
      // Integer arrays take a fast path (block ids in prefill answers); small numbers, as a
      // mutated exponent past e308 is a known disagreement (AcceptsHugeExponent).
      R"({"kv":{"ids":[0,1,12,3,45,0,10,7],"h":"x"},"n":[5,0,3]})",
  };
  const std::string alphabet = "{}[]:,\"\\ u0123456789.-+eEtrufalsnd\x01\n\xc3\xa9\xed\xa0\x80\xff";
  std::mt19937 rng(12345);
  int disagreements = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string s = seeds[rng() % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < edits && !s.empty(); ++k) {
      const std::size_t pos = rng() % s.size();
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0:
          s[pos] = c;
          break;
        case 1:
          s.insert(s.begin() + static_cast<std::ptrdiff_t>(pos), c);
          break;
        default:
          s.erase(pos, 1);
      }
    }
    bool theirs = json::accept(s);
    if (theirs)
      theirs = json::parse(s).is_object();
    const bool ours = index_json_object(s).ok();
    if (ours != theirs) {
      ++disagreements;
      ADD_FAILURE() << "ours=" << ours << " nlohmann=" << theirs << " text=" << s;
      if (disagreements > 5)
        return;
    }
  }
}

// Special bytes at every offset of strings up to 40 bytes long (the word-at-a-time fast path's
// boundaries) are judged as nlohmann judges them.
TEST(JsonValidate, SpecialBytesAtEveryOffset) {
  const std::vector<std::string> specials = {"\"",   "\\n",      "\\u00e9",  "\x01",
                                             "\x1f", "\xc3\xa9", "\xff",     "\x7f",
                                             "\\",   " ",        "\xe2\x82", "\xf0\x9f\x98\x80"};
  for (std::size_t len = 0; len <= 40; ++len) {
    for (std::size_t pos = 0; pos <= len; ++pos) {
      for (const auto& sp : specials) {
        std::string body(len, 'a');
        body.insert(pos, sp);
        const std::string text = R"({"k":")" + body + R"("})";
        const auto r = index_json_object(text);
        EXPECT_EQ(r.ok(), json::accept(text)) << len << "/" << pos << ": " << text;
        if (r.ok()) {
          EXPECT_EQ(string_member(text, *r, "k"), json::parse(text)["k"].get<std::string>());
        }
      }
    }
  }
}

// --- Index and member access ----------------------------------------------

// Members are indexed with decoded keys and exact byte ranges.
TEST(JsonIndex, RangesAndKeys) {
  const std::string text = " { \"a\" : 1 ,\"max\\u005ftokens\":[1, 2]\n, \"c\":{\"a\":2} } ";
  const auto r = index_json_object(text);
  ASSERT_TRUE(r.ok()) << r.error();
  const auto& m = r->members;
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(r->open_brace, 1u);
  EXPECT_EQ(text[r->close_brace], '}');
  EXPECT_EQ(r->close_brace, text.size() - 2);
  EXPECT_EQ(m[0].key, "a");
  EXPECT_EQ(text.substr(m[0].begin, m[0].end - m[0].begin), "\"a\" : 1");
  EXPECT_EQ(text.substr(m[0].value_begin, m[0].value_end - m[0].value_begin), "1");
  EXPECT_EQ(m[1].key, "max_tokens");
  EXPECT_EQ(text.substr(m[1].value_begin, m[1].value_end - m[1].value_begin), "[1, 2]");
  EXPECT_EQ(m[2].key, "c");
  EXPECT_EQ(text.substr(m[2].value_begin, m[2].value_end - m[2].value_begin), "{\"a\":2}");
}

// raw_member returns the last duplicate; bool_member/string_member type-check.
TEST(JsonIndex, MemberAccessors) {
  const std::string text =
      R"({"k":1,"k":"two","b":true,"f":false,"nb":"true","s":"a\u00e9\ud83d\ude00\n","n":null})";
  const auto r = index_json_object(text);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(raw_member(text, *r, "k"), "\"two\"");
  EXPECT_EQ(raw_member(text, *r, "missing"), std::nullopt);
  EXPECT_EQ(bool_member(text, *r, "b"), true);
  EXPECT_EQ(bool_member(text, *r, "f"), false);
  EXPECT_EQ(bool_member(text, *r, "nb"), std::nullopt);
  EXPECT_EQ(bool_member(text, *r, "n"), std::nullopt);
  EXPECT_EQ(string_member(text, *r, "s"), "a\xc3\xa9\xf0\x9f\x98\x80\n");
  EXPECT_EQ(string_member(text, *r, "k"), "two");
  EXPECT_EQ(string_member(text, *r, "b"), std::nullopt);
}

// Keys with escapes are matched by their decoded form.
TEST(JsonIndex, EscapedKeysDecode) {
  const std::string text = R"({"\u006dodel":"x","a\"b":1,"\ud83d\ude00":2})";
  const auto r = index_json_object(text);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(string_member(text, *r, "model"), "x");
  EXPECT_EQ(raw_member(text, *r, "a\"b"), "1");
  EXPECT_EQ(raw_member(text, *r, "\xf0\x9f\x98\x80"), "2");
}

// json_quote output parses back (nlohmann) to the original string.
TEST(JsonQuote, RoundTrips) {
  std::string all_controls;
  for (int c = 0; c < 0x20; ++c)
    all_controls.push_back(static_cast<char>(c));
  for (const std::string& s :
       {std::string(""), std::string("plain"), std::string("q\"b\\s/"), all_controls,
        std::string("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"), std::string("\x7f")}) {
    const std::string q = json_quote(s);
    ASSERT_TRUE(validate_json(q).ok()) << q;
    EXPECT_EQ(json::parse(q).get<std::string>(), s);
    EXPECT_EQ(decode_json_string(q), s);
  }
}

// Bytes that are not valid UTF-8 become U+FFFD so the literal stays valid JSON.
TEST(JsonQuote, InvalidUtf8Replaced) {
  const std::string q = json_quote(
      "a\xff"
      "b\xed\xa0\x80");
  ASSERT_TRUE(validate_json(q).ok()) << q;
  EXPECT_EQ(json::parse(q).get<std::string>(),
            "a\xef\xbf\xbd"
            "b\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
}

// --- Editing ---------------------------------------------------------------

// With no edits, render copies the text byte for byte.
TEST(JsonEdit, NoEditsIsIdentity) {
  const std::string text = " {\n \"a\" : [1, 2] ,\"b\":\"x\"\t} \n";
  const auto r = index_json_object(text);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(JsonBodyEditor(text, *r).render(), text);
}

// Removing the first, a middle or the last member keeps exactly one comma between the rest.
TEST(JsonEdit, RemoveAtEveryPosition) {
  const std::string text = R"({"a":1, "b":2, "c":3})";
  const auto r = index_json_object(text);
  ASSERT_TRUE(r.ok());
  {
    JsonBodyEditor e(text, *r);
    e.remove("a");
    EXPECT_EQ(e.render(), R"({"b":2, "c":3})");
  }
  {
    JsonBodyEditor e(text, *r);
    e.remove("b");
    EXPECT_EQ(e.render(), R"({"a":1, "c":3})");
  }
  {
    JsonBodyEditor e(text, *r);
    e.remove("c");
    EXPECT_EQ(e.render(), R"({"a":1, "b":2})");
  }
  {
    JsonBodyEditor e(text, *r);
    e.remove("a");
    e.remove("b");
    e.remove("c");
    EXPECT_EQ(e.render(), "{}");
  }
}

// Every subset of members removed, with and without an appended member, in several layouts, gives
// valid JSON with the right content.
TEST(JsonEdit, ExhaustiveRemoveAndAppend) {
  const std::vector<std::string> layouts = {
      R"({"a":1,"b":"x","c":[1],"d":{"a":0}})",
      "{ \"a\" : 1 , \"b\" : \"x\" , \"c\" : [1] , \"d\" : {\"a\":0} }",
      "\n{\n\t\"a\":1,\n\t\"b\":\"x\",\n\t\"c\":[1],\n\t\"d\":{\"a\":0}\n}\n",
  };
  const std::vector<std::string> keys = {"a", "b", "c", "d"};
  for (const auto& layout : layouts) {
    // Prefixes with 0..4 members exercise the empty object too.
    for (std::size_t n = 0; n <= keys.size(); ++n) {
      json base = json::parse(layout);
      for (std::size_t k = n; k < keys.size(); ++k)
        base.erase(keys[k]);
      const std::string text = base.dump(n % 2 == 0 ? -1 : 2);
      const auto r = index_json_object(text);
      ASSERT_TRUE(r.ok()) << text;
      for (unsigned mask = 0; mask < (1u << n); ++mask) {
        for (bool append : {false, true}) {
          JsonBodyEditor e(text, *r);
          json expected = base;
          for (std::size_t k = 0; k < n; ++k) {
            if ((mask & (1u << k)) != 0) {
              e.remove(keys[k]);
              expected.erase(keys[k]);
            }
          }
          if (append) {
            e.set("new", R"({"z":[true]})");
            expected["new"] = json::parse(R"({"z":[true]})");
          }
          SCOPED_TRACE(text + " mask=" + std::to_string(mask));
          expect_render(e, expected.dump());
        }
      }
    }
  }
  // The same on hand-written layouts with odd whitespace.
  for (const auto& text : layouts) {
    const auto r = index_json_object(text);
    ASSERT_TRUE(r.ok());
    for (unsigned mask = 0; mask < 16; ++mask) {
      JsonBodyEditor e(text, *r);
      json expected = json::parse(text);
      for (std::size_t k = 0; k < 4; ++k) {
        if ((mask & (1u << k)) != 0) {
          e.remove(keys[k]);
          expected.erase(keys[k]);
        }
      }
      e.set("b", "42");
      expected["b"] = 42;
      expect_render(e, expected.dump());
    }
  }
}

// Appending to an empty object (with or without inner whitespace) needs no comma.
TEST(JsonEdit, AppendToEmptyObject) {
  for (std::string text : {"{}", "{ }", " {\n\n} \n"}) {
    const auto r = index_json_object(text);
    ASSERT_TRUE(r.ok());
    JsonBodyEditor e(text, *r);
    e.set("x", "1");
    e.set("y", "\"s\"");
    expect_render(e, R"({"x":1,"y":"s"})");
  }
  const auto r = index_json_object("{}");
  JsonBodyEditor e("{}", *r);
  e.set("a b\"", "null");
  EXPECT_EQ(e.render(), R"({"a b\"":null})");
}

// Setting an existing key replaces its value in place and keeps its spelling and surrounding bytes.
TEST(JsonEdit, SetReplacesInPlace) {
  const std::string text = "{ \"max\\u005ftokens\" :  100 ,\"z\":1}";
  const auto r = index_json_object(text);
  ASSERT_TRUE(r.ok());
  JsonBodyEditor e(text, *r);
  e.set("max_tokens", "1");
  EXPECT_EQ(e.render(), "{ \"max\\u005ftokens\" :  1 ,\"z\":1}");
}

// set on a duplicated key keeps the first position and drops the other copies.
TEST(JsonEdit, SetCollapsesDuplicates) {
  const std::string text = R"({"k":1,"a":2,"k":3,"b":4,"k":5})";
  const auto r = index_json_object(text);
  ASSERT_TRUE(r.ok());
  JsonBodyEditor e(text, *r);
  e.set("k", "9");
  EXPECT_EQ(e.render(), R"({"k":9,"a":2,"b":4})");
}

// remove on a duplicated key removes every copy.
TEST(JsonEdit, RemoveAllDuplicates) {
  const std::string text = R"({"k":1,"a":2,"k":3,"k":5})";
  const auto r = index_json_object(text);
  ASSERT_TRUE(r.ok());
  JsonBodyEditor e(text, *r);
  e.remove("k");
  EXPECT_EQ(e.render(), R"({"a":2})");
}

// Nested objects with the same key names are never touched: only the top level is edited.
TEST(JsonEdit, NestedSameNameUntouched) {
  const std::string text =
      R"({"messages":[{"stream":true,"max_tokens":7}],"o":{"stream":1},"stream":true})";
  const auto r = index_json_object(text);
  ASSERT_TRUE(r.ok());
  JsonBodyEditor e(text, *r);
  e.set("stream", "false");
  e.remove("max_tokens");
  EXPECT_EQ(e.render(),
            R"({"messages":[{"stream":true,"max_tokens":7}],"o":{"stream":1},"stream":false})");
}

// Later edits of the same key override earlier ones (set then remove, remove then set).
TEST(JsonEdit, LastEditWins) {
  const std::string text = R"({"a":1,"b":2})";
  const auto r = index_json_object(text);
  ASSERT_TRUE(r.ok());
  JsonBodyEditor e(text, *r);
  e.set("a", "5");
  e.remove("a");
  e.remove("b");
  e.set("b", "6");
  e.set("c", "7");
  e.set("c", "8");
  EXPECT_EQ(e.render(), R"({"b":6,"c":8})");
}

// Removing members the body does not have leaves it one untouched slice
// (the decode body of a request without conversation_id or params); an
// absent key removed, then set, is appended; one set, then removed, is gone.
TEST(JsonEdit, AbsentKeysRemovedKeepTheBodyWhole) {
  const std::string text = R"( {"model":"m", "prompt":"hi"} )";
  const auto r = index_json_object(text);
  ASSERT_TRUE(r.ok());
  JsonBodyEditor e(text, *r);
  e.remove("conversation_id");
  e.remove("kv_transfer_params");
  const SplicedText spliced = e.splice();
  EXPECT_EQ(spliced.piece_count(), 1u);
  EXPECT_EQ(spliced.str(), text);
  e.remove("x");
  e.set("x", "1");
  e.set("y", "2");
  e.remove("y");
  EXPECT_EQ(e.render(), R"( {"model":"m", "prompt":"hi","x":1} )");
}

// A multi-megabyte string value is copied verbatim and the edits around it still land.
TEST(JsonEdit, HugeStringValue) {
  std::string big(10u << 20, 'x');
  for (std::size_t i = 0; i + 1 < big.size(); i += 997)
    big[i] = '\xc3', big[i + 1] = '\xa9';
  const std::string text = R"({"stream":true,"prompt":")" + big + R"(","max_tokens":5})";
  const auto r = index_json_object(text);
  ASSERT_TRUE(r.ok()) << r.error();
  JsonBodyEditor e(text, *r);
  e.set("max_tokens", "1");
  e.remove("stream");
  const std::string out = e.render();
  EXPECT_EQ(out, R"({"prompt":")" + big + R"(","max_tokens":1})");
  EXPECT_TRUE(index_json_object(out).ok());
}

}  // namespace
}  // namespace pdgate

namespace pdgate {
namespace {

// Whole numbers read as vLLM's request models read an int field.
TEST(IntegralValue, WholeNumbersHoweverWritten) {
  EXPECT_EQ(integral_value("100"), 100);
  EXPECT_EQ(integral_value("-7"), -7);
  EXPECT_EQ(integral_value("100.0"), 100);
  EXPECT_EQ(integral_value("1e2"), 100);
  EXPECT_EQ(integral_value("1.0E+2"), 100);
  EXPECT_EQ(integral_value("5e2"), 500);
  EXPECT_EQ(integral_value("\"100\""), 100);
  EXPECT_EQ(integral_value("\"+12\""), 12);
  EXPECT_EQ(integral_value("9223372036854775807"), INT64_MAX);
  EXPECT_EQ(integral_value("-9.223372036854775808e18"), INT64_MIN);
}

// A path into a value: members by name (the last of a name), elements by
// position; whatever the path does not name is nothing.
TEST(RawAtPath, MembersAndElementsAsTheStepsGo) {
  const std::string_view doc =
      R"({"messages": [{"role": "system", "content": "be brief"},)"
      R"( {"role": "user", "content": [{"type": "text", "text": "hi"}]}], "n": 1, "n": 2})";
  const auto at = [&](std::vector<JsonPathStep> path) {
    return raw_at_path(doc, path.data(), path.size());
  };
  JsonPathStep messages{"messages"}, content{"content"}, text{"text"}, role{"role"};
  JsonPathStep first{{}, 0, true}, second{{}, 1, true}, third{{}, 2, true};
  EXPECT_EQ(at({messages, first, content}), R"("be brief")");
  EXPECT_EQ(at({messages, second, content, first, text}), R"("hi")");
  EXPECT_EQ(at({messages, second, role}), R"("user")");
  EXPECT_EQ(at({JsonPathStep{"n"}}), "2");
  EXPECT_EQ(at({}), doc);
  EXPECT_FALSE(at({messages, third}));
  EXPECT_FALSE(at({messages, content}));       // a name into an array
  EXPECT_FALSE(at({messages, first, first}));  // a position into an object
  EXPECT_FALSE(at({JsonPathStep{"n"}, first}));
  EXPECT_FALSE(at({JsonPathStep{"absent"}}));
  // At most kMaxJsonPathSteps steps, however deep the text.
  std::string deep = "0";
  for (std::size_t i = 0; i <= kMaxJsonPathSteps; ++i)
    deep = "[" + deep + "]";
  std::vector<JsonPathStep> down(kMaxJsonPathSteps, first);
  EXPECT_EQ(raw_at_path(deep, down.data(), down.size()), "[0]");
  down.push_back(first);
  EXPECT_FALSE(raw_at_path(deep, down.data(), down.size()));
  // Malformed where a step reads: nothing.
  EXPECT_FALSE(raw_at_path(R"([1, }])", &second, 1));
  EXPECT_FALSE(raw_at_path(R"({"a": })", &messages, 1));
}

TEST(IntegralValue, RefusesWhatIsNotAWholeInt64) {
  for (const char* raw :
       {"100.5", "1e-1", "9223372036854775808", "9.3e18", "1e30", "-1e19", "\"100.0\"", "\"1e2\"",
        "\"\"", "\"-\"", "\" 1\"", "true", "null", "[1]", "{}", "\"lots\""})
    EXPECT_FALSE(integral_value(raw)) << raw;
}

}  // namespace
}  // namespace pdgate
