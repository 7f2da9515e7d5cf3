// A strict little XML reader for the report tests: it accepts what a conforming XML parser accepts of
// the subset the report writes (elements, double- or single-quoted attributes, text, the five
// predefined entities and numeric character references, comments, a prolog and a DOCTYPE) and
// refuses the rest with a reason: an unclosed or mismatched tag, a raw '<' or '&' in text or in an
// attribute value, an unknown entity, a duplicate attribute, two roots, or anything after the root.
#pragma once

#include <cctype>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace ftplan::testing {

struct XmlElement {
  std::string name;
  std::map<std::string, std::string> attrs;  // values decoded
  std::string text;                          // the element's own text, decoded (children's excluded)
  std::vector<XmlElement> children;

  // Every element of this tree (itself included) named `tag`, in document order.
  void find_all(const std::string& tag, std::vector<const XmlElement*>& out) const {
    if (name == tag) out.push_back(this);
    for (const auto& c : children) c.find_all(tag, out);
  }
  std::vector<const XmlElement*> all(const std::string& tag) const {
    std::vector<const XmlElement*> out;
    find_all(tag, out);
    return out;
  }
  // The text of the element and its descendants, in order.
  std::string all_text() const {
    std::string t = text;
    for (const auto& c : children) t += c.all_text();
    return t;
  }
  bool has_class(const std::string& cls) const {
    const auto it = attrs.find("class");
    if (it == attrs.end()) return false;
    std::string word;
    for (size_t i = 0; i <= it->second.size(); ++i) {
      if (i == it->second.size() || it->second[i] == ' ') {
        if (word == cls) return true;
        word.clear();
      } else {
        word += it->second[i];
      }
    }
    return false;
  }
  double number(const std::string& attr) const { return std::stod(attrs.at(attr)); }
};

struct XmlResult {
  bool ok = false;
  std::string error;  // where and why, when not ok
  XmlElement root;
};

namespace detail {

struct XmlReader {
  const std::string& s;
  size_t i = 0;
  std::string error;

  bool fail(const std::string& why) {
    if (error.empty()) error = why + " at offset " + std::to_string(i) + ": '" + s.substr(i, 40) + "'";
    return false;
  }
  bool starts(const char* p) const { return s.compare(i, std::char_traits<char>::length(p), p) == 0; }
  static bool name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':'; }
  static bool name_char(char c) {
    return name_start(c) || std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '.';
  }
  void skip_space() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  bool read_name(std::string& out) {
    if (i >= s.size() || !name_start(s[i])) return fail("expected a name");
    const size_t start = i;
    while (i < s.size() && name_char(s[i])) ++i;
    out = s.substr(start, i - start);
    return true;
  }
  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6)), out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12)), out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18)), out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  // At '&': decodes one reference into out.
  bool read_reference(std::string& out) {
    const size_t semi = s.find(';', i);
    if (semi == std::string::npos || semi - i > 12) return fail("'&' not starting a reference");
    const std::string ref = s.substr(i + 1, semi - i - 1);
    static const std::map<std::string, std::string> named = {
        {"amp", "&"}, {"lt", "<"}, {"gt", ">"}, {"quot", "\""}, {"apos", "'"}};
    if (named.count(ref)) {
      out += named.at(ref);
    } else if (ref.size() > 1 && ref[0] == '#') {
      const bool hex = ref[1] == 'x';
      const std::string digits = ref.substr(hex ? 2 : 1);
      if (digits.empty()) return fail("empty character reference");
      for (char c : digits)
        if (!(hex ? std::isxdigit(static_cast<unsigned char>(c)) : std::isdigit(static_cast<unsigned char>(c))))
          return fail("bad character reference");
      append_utf8(out, static_cast<uint32_t>(std::stoul(digits, nullptr, hex ? 16 : 10)));
    } else {
      return fail("unknown entity &" + ref + ";");
    }
    i = semi + 1;
    return true;
  }
  bool skip_misc() {  // comments, processing instructions, DOCTYPE, whitespace
    for (;;) {
      skip_space();
      if (starts("<!--")) {
        const size_t end = s.find("-->", i);
        if (end == std::string::npos) return fail("unclosed comment");
        i = end + 3;
      } else if (starts("<?")) {
        const size_t end = s.find("?>", i);
        if (end == std::string::npos) return fail("unclosed processing instruction");
        i = end + 2;
      } else if (starts("<!DOCTYPE")) {
        const size_t end = s.find('>', i);
        if (end == std::string::npos) return fail("unclosed DOCTYPE");
        i = end + 1;
      } else {
        return true;
      }
    }
  }
  bool read_element(XmlElement& e) {
    if (i >= s.size() || s[i] != '<') return fail("expected '<'");
    ++i;
    if (!read_name(e.name)) return false;
    for (;;) {
      const size_t before = i;
      skip_space();
      if (i >= s.size()) return fail("unclosed start tag <" + e.name);
      if (starts("/>")) {
        i += 2;
        return true;
      }
      if (s[i] == '>') {
        ++i;
        break;
      }
      if (i == before) return fail("expected a space before an attribute of <" + e.name);
      std::string attr;
      if (!read_name(attr)) return false;
      skip_space();
      if (i >= s.size() || s[i] != '=') return fail("attribute " + attr + " without '='");
      ++i;
      skip_space();
      if (i >= s.size() || (s[i] != '"' && s[i] != '\'')) return fail("attribute " + attr + " not quoted");
      const char quote = s[i++];
      std::string value;
      while (i < s.size() && s[i] != quote) {
        if (s[i] == '<') return fail("'<' in the value of " + attr);
        if (s[i] == '&') {
          if (!read_reference(value)) return false;
        } else {
          value += s[i++];
        }
      }
      if (i >= s.size()) return fail("unterminated value of " + attr);
      ++i;
      if (e.attrs.count(attr)) return fail("duplicate attribute " + attr + " on <" + e.name);
      e.attrs[attr] = value;
    }
    for (;;) {  // content
      if (i >= s.size()) return fail("<" + e.name + "> never closed");
      if (starts("</")) {
        i += 2;
        std::string closing;
        if (!read_name(closing)) return false;
        if (closing != e.name) return fail("</" + closing + "> closes <" + e.name + ">");
        skip_space();
        if (i >= s.size() || s[i] != '>') return fail("bad end tag </" + closing);
        ++i;
        return true;
      }
      if (starts("<!--")) {
        const size_t end = s.find("-->", i);
        if (end == std::string::npos) return fail("unclosed comment");
        i = end + 3;
        continue;
      }
      if (s[i] == '<') {
        e.children.emplace_back();
        if (!read_element(e.children.back())) return false;
        continue;
      }
      if (s[i] == '&') {
        if (!read_reference(e.text)) return false;
        continue;
      }
      if (s[i] == '>' && i > 0 && starts(">") && i >= 2 && s.compare(i - 2, 2, "]]") == 0)
        return fail("']]>' in text");
      e.text += s[i++];
    }
  }
};

}  // namespace detail

inline XmlResult parse_xml(const std::string& text) {
  XmlResult r;
  detail::XmlReader reader{text};
  if (reader.skip_misc() && reader.read_element(r.root) && reader.skip_misc()) {
    if (reader.i == text.size()) r.ok = true;
    else reader.fail("content after the root element");
  }
  r.error = reader.error;
  return r;
}

}  // namespace ftplan::testing
