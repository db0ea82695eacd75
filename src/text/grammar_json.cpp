#include "text/grammar_json.h"

#include "text/grammar_regex.h"

#include <map>
#include <optional>
#include <set>
#include <tuple>

namespace dsv4::text {

namespace {

using ojson = nlohmann::ordered_json;
using Sequence = GrammarBuilder::Sequence;
using Symbol = GrammarBuilder::Symbol;

// Keywords that only describe: accepted and ignored.
const std::set<std::string> kAnnotations = {"title",  "description", "default",     "examples", "$schema",
                                            "$id",    "$comment",    "deprecated",  "readOnly", "writeOnly",
                                            "strict", "$defs",       "definitions", "nullable"};
const std::set<std::string> kSupported = {"type",      "properties", "required", "additionalProperties",
                                          "items",     "minItems",   "maxItems", "enum",
                                          "const",     "anyOf",      "$ref",     "minLength",
                                          "maxLength", "format",     "pattern"};
constexpr int kMaxSchemaDepth = 128;

class SchemaCompiler {
 public:
  SchemaCompiler(GrammarBuilder& builder, const ojson* root, const JsonGrammarOptions& options)
      : b_(builder), root_(root), options_(options) {}

  // Schemas reached through $ref compile after the one that names them, from
  // a queue: a long $ref chain costs no recursion.
  uint32_t compile_root(const ojson& schema) {
    const uint32_t rule = b_.new_rule("root");
    b_.add_alternative(rule, {compile(schema, "#", 0)});
    while (!pending_.empty()) {
      auto [ref_rule, target, where] = pending_.back();
      pending_.pop_back();
      b_.add_alternative(ref_rule, {compile(*target, where, 0)});
    }
    return rule;
  }

  Symbol any_value(int depth) {
    if (depth >= kAnyJsonDepth) return scalar();
    auto& rule = any_value_rules_[depth];
    if (rule) return GrammarBuilder::call(rule - 1);
    const uint32_t r = b_.new_rule("any_value");
    rule = r + 1;
    b_.add_alternative(r, {any_object(depth)});
    b_.add_alternative(r, {any_array(depth)});
    b_.add_alternative(r, {scalar()});
    return GrammarBuilder::call(r);
  }
  Symbol any_object(int depth) {
    const Sequence member = Sequence{string_value()} + b_.literal(":") + Sequence{ws(), any_value(depth + 1)};
    return object_of(member);
  }

 private:
  Symbol compile(const ojson& schema, const std::string& where, int depth) {
    if (depth > kMaxSchemaDepth) throw GrammarError("the schema nests deeper than " + std::to_string(kMaxSchemaDepth));
    if (schema.is_boolean()) {
      if (!schema.get<bool>()) throw GrammarError("schema at " + where + " is false: no value matches it");
      return any_value(0);
    }
    if (!schema.is_object()) throw GrammarError("schema at " + where + " must be an object or a boolean");
    std::string unsupported;
    for (auto it = schema.begin(); it != schema.end(); ++it)
      if (!kSupported.count(it.key()) && !kAnnotations.count(it.key()))
        unsupported += (unsupported.empty() ? "'" : ", '") + it.key() + "'";
    if (!unsupported.empty()) throw GrammarError("unsupported JSON Schema keyword(s) " + unsupported + " at " + where);

    if (schema.contains("$ref")) return ref(schema["$ref"], where);
    if (schema.contains("const")) return literal_value(schema["const"]);
    if (schema.contains("enum")) {
      const ojson& values = schema["enum"];
      if (!values.is_array() || values.empty()) throw GrammarError("'enum' at " + where + " must be a non-empty array");
      std::vector<std::string> texts;
      for (const ojson& v : values) texts.push_back(v.dump());
      return b_.literals(texts, "enum");
    }
    if (schema.contains("anyOf")) {
      const ojson& options = schema["anyOf"];
      if (!options.is_array() || options.empty())
        throw GrammarError("'anyOf' at " + where + " must be a non-empty array");
      std::vector<Sequence> alternatives;
      for (size_t i = 0; i < options.size(); ++i)
        alternatives.push_back({compile(options[i], where + "/anyOf/" + std::to_string(i), depth + 1)});
      return b_.choice(alternatives, "anyOf");
    }
    std::vector<std::string> types;
    if (schema.contains("type")) {
      const ojson& t = schema["type"];
      if (t.is_string())
        types.push_back(t.get<std::string>());
      else if (t.is_array())
        for (const ojson& one : t) {
          if (!one.is_string()) throw GrammarError("'type' at " + where + " must be a string or a list of strings");
          types.push_back(one.get<std::string>());
        }
      else
        throw GrammarError("'type' at " + where + " must be a string or a list of strings");
      if (types.empty()) throw GrammarError("'type' at " + where + " is an empty list");
    } else if (schema.contains("properties") || schema.contains("additionalProperties")) {
      types = {"object"};
    } else if (schema.contains("items")) {
      types = {"array"};
    } else if (schema.contains("format") || schema.contains("minLength") || schema.contains("maxLength") ||
               schema.contains("pattern")) {
      types = {"string"};
    } else {
      return any_value(0);
    }
    std::vector<Sequence> alternatives;
    for (const std::string& type : types) alternatives.push_back({typed(schema, type, where, depth)});
    return alternatives.size() == 1 ? alternatives[0][0] : b_.choice(alternatives, "types");
  }

  Symbol typed(const ojson& schema, const std::string& type, const std::string& where, int depth) {
    if (type == "string") return string_schema(schema, where);
    if (type == "integer") return integer();
    if (type == "number") return number();
    if (type == "boolean") return b_.choice({b_.literal("true"), b_.literal("false")}, "boolean");
    if (type == "null") return b_.choice({b_.literal("null")}, "null");
    if (type == "object") return object_schema(schema, where, depth);
    if (type == "array") return array_schema(schema, where, depth);
    throw GrammarError("unknown type '" + type + "' at " + where);
  }

  Symbol ref(const ojson& target, const std::string& where) {
    if (!target.is_string()) throw GrammarError("'$ref' at " + where + " must be a string");
    const std::string name = target.get<std::string>();
    auto found = refs_.find(name);
    if (found != refs_.end()) return GrammarBuilder::call(found->second);
    if (name.empty() || name[0] != '#')
      throw GrammarError("'$ref' " + name + " at " + where + ": only references into this schema (#...) are supported");
    const ojson* schema = nullptr;
    try {
      schema = &root_->at(ojson::json_pointer(name.substr(1)));
    } catch (const std::exception&) {
      throw GrammarError("'$ref' " + name + " at " + where + " does not resolve");
    }
    const uint32_t rule = b_.new_rule("ref " + name);
    refs_[name] = rule;
    pending_.push_back({rule, schema, name});
    return GrammarBuilder::call(rule);
  }

  Symbol literal_value(const ojson& value) { return b_.choice({b_.literal(value.dump())}, "const"); }

  // ---- strings ----
  Symbol ws() {
    if (!ws_) ws_ = b_.optional(b_.literal(" "), "ws");
    return *ws_;
  }
  Symbol string_char() {
    if (char_) return *char_;
    std::vector<Sequence> alts;
    ByteSet plain{};
    for (unsigned c = 0x20; c < 0x80; ++c)
      if (c != '"' && c != '\\') plain[c / 64] |= uint64_t(1) << (c % 64);
    alts.push_back({b_.byte_set(plain)});
    auto tail = [&] { return b_.byte_range(0x80, 0xBF); };
    // Well-formed UTF-8 only (RFC 3629 table 3-7).
    alts.push_back({b_.byte_range(0xC2, 0xDF), tail()});
    alts.push_back({b_.byte_range(0xE0, 0xE0), b_.byte_range(0xA0, 0xBF), tail()});
    alts.push_back({b_.byte_range(0xE1, 0xEC), tail(), tail()});
    alts.push_back({b_.byte_range(0xED, 0xED), b_.byte_range(0x80, 0x9F), tail()});
    alts.push_back({b_.byte_range(0xEE, 0xEF), tail(), tail()});
    alts.push_back({b_.byte_range(0xF0, 0xF0), b_.byte_range(0x90, 0xBF), tail(), tail()});
    alts.push_back({b_.byte_range(0xF1, 0xF3), tail(), tail(), tail()});
    alts.push_back({b_.byte_range(0xF4, 0xF4), b_.byte_range(0x80, 0x8F), tail(), tail()});
    ByteSet escapes{};
    for (char c : std::string("\"\\/bfnrt")) escapes[uint8_t(c) / 64] |= uint64_t(1) << (uint8_t(c) % 64);
    alts.push_back(b_.literal("\\") + Sequence{b_.byte_set(escapes)});
    alts.push_back(b_.literal("\\u") + Sequence{hex(), hex(), hex(), hex()});
    char_ = b_.choice(alts, "char");
    return *char_;
  }
  Symbol hex() {
    if (!hex_) hex_ = b_.choice({{b_.byte_range('0', '9')}, {b_.byte_range('a', 'f')}, {b_.byte_range('A', 'F')}});
    return *hex_;
  }
  Symbol string_value() {
    if (string_) return *string_;
    const int64_t cap = options_.max_string_chars;
    const Symbol chars = cap > 0 ? b_.repeat({string_char()}, 0, cap, {}, "chars") : b_.star({string_char()}, "chars");
    string_ = b_.choice({b_.literal("\"") + Sequence{chars} + b_.literal("\"")}, "string");
    return *string_;
  }
  Symbol digits(int64_t min, int64_t max) { return b_.repeat({b_.byte_range('0', '9')}, min, max, {}, "digits"); }

  Symbol string_schema(const ojson& schema, const std::string& where) {
    const bool lengths = schema.contains("minLength") || schema.contains("maxLength");
    if (schema.contains("pattern")) {
      if (lengths || schema.contains("format"))
        throw GrammarError("'pattern' with 'format', 'minLength' or 'maxLength' at " + where + " is not supported");
      if (!schema["pattern"].is_string()) throw GrammarError("'pattern' at " + where + " must be a string");
      // A full match is also a match anywhere (JSON Schema's reading).
      const uint32_t rule = add_regex(b_, schema["pattern"].get<std::string>(), /*inside_json_string=*/true);
      return b_.choice({b_.literal("\"") + Sequence{GrammarBuilder::call(rule)} + b_.literal("\"")}, "pattern");
    }
    if (schema.contains("format")) {
      if (lengths) throw GrammarError("'format' with 'minLength'/'maxLength' at " + where + " is not supported");
      return format(schema["format"], where);
    }
    if (!lengths) return string_value();
    const int64_t min = count_field(schema, "minLength", 0, where);
    const int64_t max = schema.contains("maxLength") ? count_field(schema, "maxLength", 0, where) : -1;
    if (max >= 0 && max < min) throw GrammarError("'maxLength' < 'minLength' at " + where);
    return b_.choice(
        {b_.literal("\"") + Sequence{b_.repeat({string_char()}, min, max, {}, "chars")} + b_.literal("\"")}, "string");
  }

  int64_t count_field(const ojson& schema, const char* key, int64_t fallback, const std::string& where) {
    if (!schema.contains(key)) return fallback;
    const ojson& v = schema[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      throw GrammarError(std::string("'") + key + "' at " + where + " must be a non-negative integer");
    if (v.get<int64_t>() > 10000) throw GrammarError(std::string("'") + key + "' at " + where + " is above 10000");
    return v.get<int64_t>();
  }

  Symbol format(const ojson& name, const std::string& where) {
    const std::string f = name.is_string() ? name.get<std::string>() : "";
    auto d = [&](int n) { return Sequence{digits(n, n)}; };
    const Sequence quote = b_.literal("\"");
    const Sequence date = d(4) + b_.literal("-") + Sequence{b_.byte_range('0', '1'), b_.byte_range('0', '9')} +
                          b_.literal("-") + Sequence{b_.byte_range('0', '3'), b_.byte_range('0', '9')};
    const Sequence offset = {b_.choice(
        {b_.literal("Z"), Sequence{b_.choice({b_.literal("+"), b_.literal("-")})} + d(2) + b_.literal(":") + d(2)})};
    const Sequence time = Sequence{b_.byte_range('0', '2'), b_.byte_range('0', '9')} + b_.literal(":") +
                          Sequence{b_.byte_range('0', '5'), b_.byte_range('0', '9')} + b_.literal(":") +
                          Sequence{b_.byte_range('0', '5'), b_.byte_range('0', '9')} +
                          Sequence{b_.optional(b_.literal(".") + Sequence{digits(1, 6)})} + offset;
    Sequence body;
    if (f == "date") {
      body = date;
    } else if (f == "time") {
      body = time;
    } else if (f == "date-time") {
      body = date + b_.literal("T") + time;
    } else if (f == "uuid") {
      auto h = [&](int n) { return Sequence{b_.repeat({hex()}, n, n, {}, "hex")}; };
      body = h(8) + b_.literal("-") + h(4) + b_.literal("-") + h(4) + b_.literal("-") + h(4) + b_.literal("-") + h(12);
    } else if (f == "ipv4") {
      // 0-255, without leading zeros.
      const Symbol octet = b_.choice({{b_.byte_range('0', '9')},
                                      {b_.byte_range('1', '9'), b_.byte_range('0', '9')},
                                      {b_.byte_range('1', '1'), b_.byte_range('0', '9'), b_.byte_range('0', '9')},
                                      {b_.byte_range('2', '2'), b_.byte_range('0', '4'), b_.byte_range('0', '9')},
                                      b_.literal("25") + Sequence{b_.byte_range('0', '5')}},
                                     "octet");
      body = {octet};
      for (int i = 0; i < 3; ++i) body = body + b_.literal(".") + Sequence{octet};
    } else if (f == "email") {
      ByteSet local{}, label{};
      for (unsigned c = 0; c < 128; ++c) {
        const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        if (alnum || c == '.' || c == '_' || c == '%' || c == '+' || c == '-') local[c / 64] |= uint64_t(1) << (c % 64);
        if (alnum) label[c / 64] |= uint64_t(1) << (c % 64);
      }
      const Symbol word = b_.repeat({b_.byte_set(label)}, 1, 63, {}, "label");
      body = Sequence{b_.repeat({b_.byte_set(local)}, 1, 64, {}, "local")} + b_.literal("@") + Sequence{word} +
             Sequence{b_.repeat(b_.literal(".") + Sequence{word}, 1, 4, {}, "domain")};
    } else {
      throw GrammarError("unsupported string format " + name.dump() + " at " + where);
    }
    return b_.choice({quote + body + quote}, "format");
  }

  // ---- numbers ----
  Symbol int_part() {
    if (!int_part_) int_part_ = b_.choice({b_.literal("0"), Sequence{b_.byte_range('1', '9'), digits(0, 15)}}, "int");
    return *int_part_;
  }
  Symbol integer() {
    if (!integer_) integer_ = b_.choice({{b_.optional(b_.literal("-")), int_part()}}, "integer");
    return *integer_;
  }
  Symbol number() {
    if (number_) return *number_;
    const Symbol frac = b_.optional(b_.literal(".") + Sequence{digits(1, 15)}, "frac");
    const Symbol exp = b_.optional(Sequence{b_.choice({b_.literal("e"), b_.literal("E")}),
                                            b_.optional({b_.choice({b_.literal("+"), b_.literal("-")})}), digits(1, 2)},
                                   "exp");
    number_ = b_.choice({{b_.optional(b_.literal("-")), int_part(), frac, exp}}, "number");
    return *number_;
  }
  Symbol scalar() {
    if (!scalar_)
      scalar_ = b_.choice({{string_value()}, {number()}, b_.literal("true"), b_.literal("false"), b_.literal("null")},
                          "scalar");
    return *scalar_;
  }

  // ---- containers ----
  Symbol any_array(int depth) { return array_of({any_value(depth + 1)}, 0, -1); }
  Symbol object_of(const Sequence& member) {
    const Symbol members = b_.repeat(member, 0, -1, b_.literal(",") + Sequence{ws()}, "members");
    return b_.choice({b_.literal("{") + Sequence{members} + b_.literal("}")}, "object");
  }
  Symbol array_of(const Sequence& item, int64_t min, int64_t max) {
    const Symbol items = b_.repeat(item, min, max, b_.literal(",") + Sequence{ws()}, "items");
    return b_.choice({b_.literal("[") + Sequence{items} + b_.literal("]")}, "array");
  }

  Symbol object_schema(const ojson& schema, const std::string& where, int depth) {
    const ojson* props = schema.contains("properties") ? &schema["properties"] : nullptr;
    if (props && !props->is_object()) throw GrammarError("'properties' at " + where + " must be an object");
    std::set<std::string> required;
    if (schema.contains("required")) {
      const ojson& r = schema["required"];
      if (!r.is_array()) throw GrammarError("'required' at " + where + " must be an array");
      for (const ojson& name : r) {
        if (!name.is_string()) throw GrammarError("'required' at " + where + " must list strings");
        if (!props || !props->contains(name.get<std::string>()))
          throw GrammarError("required property '" + name.get<std::string>() + "' at " + where +
                             " is not in 'properties'");
        required.insert(name.get<std::string>());
      }
    }
    const ojson additional = schema.contains("additionalProperties") ? schema["additionalProperties"] : ojson(true);
    if (!additional.is_boolean() && !additional.is_object())
      throw GrammarError("'additionalProperties' at " + where + " must be a boolean or a schema");
    if (!props || props->empty()) {
      if (additional.is_boolean() && !additional.get<bool>()) return b_.choice({b_.literal("{}")}, "empty_object");
      const Symbol value = additional.is_object() ? compile(additional, where + "/additionalProperties", depth + 1)
                                                  : any_value(depth + 1);
      return object_of(Sequence{string_value()} + b_.literal(":") + Sequence{ws(), value});
    }
    // Properties in schema order. first[i]: the members from i on when none
    // was written yet; rest[i]: the same after one was (a comma first).
    std::vector<Sequence> members;
    std::vector<bool> is_required;
    for (auto it = props->begin(); it != props->end(); ++it) {
      const Symbol value = compile(it.value(), where + "/properties/" + it.key(), depth + 1);
      members.push_back(b_.literal(ojson(it.key()).dump()) + b_.literal(":") + Sequence{ws(), value});
      is_required.push_back(required.count(it.key()) > 0);
    }
    const size_t n = members.size();
    std::vector<Symbol> first(n + 1), rest(n + 1);
    const uint32_t none = b_.new_rule("no_members");
    b_.add_alternative(none, {});
    first[n] = rest[n] = GrammarBuilder::call(none);
    for (size_t i = n; i-- > 0;) {
      std::vector<Sequence> r = {b_.literal(",") + Sequence{ws()} + members[i] + Sequence{rest[i + 1]}};
      std::vector<Sequence> f = {members[i] + Sequence{rest[i + 1]}};
      if (!is_required[i]) r.push_back({rest[i + 1]}), f.push_back({first[i + 1]});
      rest[i] = b_.choice(r, "rest");
      first[i] = b_.choice(f, "first");
    }
    return b_.choice({b_.literal("{") + Sequence{first[0]} + b_.literal("}")}, "object");
  }

  Symbol array_schema(const ojson& schema, const std::string& where, int depth) {
    const int64_t min = count_field(schema, "minItems", 0, where);
    const int64_t max = schema.contains("maxItems") ? count_field(schema, "maxItems", 0, where) : -1;
    if (max >= 0 && max < min) throw GrammarError("'maxItems' < 'minItems' at " + where);
    const Symbol item =
        schema.contains("items") ? compile(schema["items"], where + "/items", depth + 1) : any_value(depth + 1);
    return array_of({item}, min, max);
  }

  GrammarBuilder& b_;
  const ojson* root_;
  JsonGrammarOptions options_;
  std::map<std::string, uint32_t> refs_;
  std::vector<std::tuple<uint32_t, const ojson*, std::string>> pending_;
  std::map<int, uint32_t> any_value_rules_;  // depth -> rule + 1
  std::optional<Symbol> ws_, char_, hex_, string_, int_part_, integer_, number_, scalar_;
};

}  // namespace

uint32_t add_json_schema(GrammarBuilder& builder, const nlohmann::ordered_json& schema,
                         const JsonGrammarOptions& options) {
  return SchemaCompiler(builder, &schema, options).compile_root(schema);
}

uint32_t add_any_json_value(GrammarBuilder& builder, const JsonGrammarOptions& options) {
  SchemaCompiler compiler(builder, nullptr, options);
  const uint32_t rule = builder.new_rule("json_value");
  builder.add_alternative(rule, {compiler.any_value(0)});
  return rule;
}

uint32_t add_any_json_object(GrammarBuilder& builder, const JsonGrammarOptions& options) {
  SchemaCompiler compiler(builder, nullptr, options);
  const uint32_t rule = builder.new_rule("json_object");
  builder.add_alternative(rule, {compiler.any_object(0)});
  return rule;
}

Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const JsonGrammarOptions& options) {
  GrammarBuilder builder;
  const uint32_t root = add_json_schema(builder, schema, options);
  return builder.build(root);
}

Grammar json_object_grammar(const JsonGrammarOptions& options) {
  GrammarBuilder builder;
  const uint32_t root = add_any_json_object(builder, options);
  return builder.build(root);
}

}  // namespace dsv4::text
