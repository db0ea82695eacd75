#include "text/pyjson.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace dsv4::text {

namespace {

void write_string(std::string& out, const std::string& s) {
  out.push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out.push_back('"');
}

void write_value(std::string& out, const ojson& v) {
  switch (v.type()) {
    case ojson::value_t::null: out += "null"; break;
    case ojson::value_t::boolean: out += v.get<bool>() ? "true" : "false"; break;
    case ojson::value_t::number_integer: out += std::to_string(v.get<int64_t>()); break;
    case ojson::value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); break;
    case ojson::value_t::number_float: out += python_float_repr(v.get<double>()); break;
    case ojson::value_t::string: write_string(out, v.get_ref<const std::string&>()); break;
    case ojson::value_t::array: {
      out.push_back('[');
      bool first = true;
      for (const auto& e : v) {
        if (!first) out += ", ";
        first = false;
        write_value(out, e);
      }
      out.push_back(']');
      break;
    }
    case ojson::value_t::object: {
      out.push_back('{');
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        write_string(out, it.key());
        out += ": ";
        write_value(out, it.value());
      }
      out.push_back('}');
      break;
    }
    default: out += "null"; break;  // binary / discarded never occur in parsed requests
  }
}

}  // namespace

std::string python_float_repr(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form, then laid out as Python's
  // float_repr_style 'short' does: exponent form iff decpt <= -4 or decpt > 16.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool neg = false;
  if (sci[0] == '-') {
    neg = true;
    sci.erase(0, 1);
  }
  const auto epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  const int exp10 = std::stoi(sci.substr(epos + 1));
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits.push_back(c);
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int decpt = exp10 + 1;  // position of the decimal point relative to digits
  std::string out = neg ? "-" : "";
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (digits.size() > 1) {
      out += '.';
      out += digits.substr(1);
    }
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += eb;
  } else if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-decpt), '0');
    out += digits;
  } else if (static_cast<size_t>(decpt) >= digits.size()) {
    out += digits;
    out.append(static_cast<size_t>(decpt) - digits.size(), '0');
    out += ".0";
  } else {
    out += digits.substr(0, decpt);
    out += '.';
    out += digits.substr(decpt);
  }
  return out;
}

std::string python_json_dumps(const ojson& value) {
  std::string out;
  write_value(out, value);
  return out;
}

std::string python_str(const ojson& value) {
  switch (value.type()) {
    case ojson::value_t::string: return value.get<std::string>();
    case ojson::value_t::null: return "None";
    case ojson::value_t::boolean: return value.get<bool>() ? "True" : "False";
    case ojson::value_t::number_float: return python_float_repr(value.get<double>());
    default: return python_json_dumps(value);
  }
}

bool python_truthy(const ojson& value) {
  switch (value.type()) {
    case ojson::value_t::null: return false;
    case ojson::value_t::boolean: return value.get<bool>();
    case ojson::value_t::number_integer: return value.get<int64_t>() != 0;
    case ojson::value_t::number_unsigned: return value.get<uint64_t>() != 0;
    case ojson::value_t::number_float: return value.get<double>() != 0.0;
    case ojson::value_t::string: return !value.get_ref<const std::string&>().empty();
    case ojson::value_t::array:
    case ojson::value_t::object: return !value.empty();
    default: return false;
  }
}

}  // namespace dsv4::text
