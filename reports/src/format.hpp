#pragma once
// Number formatting shared by the text writers: fixed, locale-free, NaN spelled out.

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

namespace gradnorm::reports::detail {

inline std::string sci(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value == 0) return "0";
  return fmt::format("{:.2e}", value);
}

inline std::string sci(const std::optional<double>& value) { return value ? sci(*value) : "-"; }

inline std::string ulps(std::int64_t value) {
  if (value == std::numeric_limits<std::int64_t>::max()) return "max";
  return fmt::format("{}", value);
}

// A Markdown table cell: no line breaks or pipes, backticks that would end a code span
// turned into quotes, control characters shown as \xNN, and '<' as &lt; so that no text
// opens HTML (a reason holding "<!--" hid the rest of a pull-request comment on GitHub).
inline std::string markdown_cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '<') {
      out += "&lt;";
    } else if (c == '|') {
      out += "\\|";
    } else if (c == '`') {
      out += '\'';
    } else if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out += c;
    }
  }
  return out;
}

// Text for XML or HTML, element or attribute: the five entities escaped, and characters XML
// 1.0 cannot carry (controls other than tab, newline, return) written as \xNN.
inline std::string xml_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        if ((u < 0x20 && c != '\t' && c != '\n' && c != '\r') || u == 0x7f) {
          out += fmt::format("\\x{:02x}", u);
        } else {
          out += c;
        }
    }
  }
  return out;
}

// Appends to a comment while it stays under a size (what must follow is reserved by the
// caller); counts what did not fit.
class Budget {
 public:
  Budget(std::string& out, std::size_t limit) : out_(out), limit_(limit) {}
  bool add(const std::string& text) {
    if (out_.size() + text.size() > limit_) {
      ++left_out_;
      return false;
    }
    out_ += text;
    return true;
  }
  [[nodiscard]] std::size_t left_out() const { return left_out_; }

 private:
  std::string& out_;
  std::size_t limit_;
  std::size_t left_out_ = 0;
};

}  // namespace gradnorm::reports::detail
