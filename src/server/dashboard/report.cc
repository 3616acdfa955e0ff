#include "server/dashboard/report.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "server/dashboard/assets.h"

namespace laissez::server::dashboard {
namespace {

namespace fs = std::filesystem;

std::string Escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string Base64(const std::string& in) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += k[v >> 18];
    out += k[(v >> 12) & 63];
    out += k[(v >> 6) & 63];
    out += k[v & 63];
  }
  if (i < in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    if (i + 1 < in.size()) v |= uint8_t(in[i + 1]) << 8;
    out += k[v >> 18];
    out += k[(v >> 12) & 63];
    out += i + 1 < in.size() ? k[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string ReadAll(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// Inline markup: `code`, **bold**, *em*, on already-escaped text.
std::string Inline(const std::string& raw) {
  std::string s = Escape(raw), out;
  bool code = false, bold = false, em = false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '`') {
      out += code ? "</code>" : "<code>";
      code = !code;
    } else if (!code && s.compare(i, 2, "**") == 0) {
      out += bold ? "</strong>" : "<strong>";
      bold = !bold;
      ++i;
    } else if (!code && s[i] == '*' && i + 1 < s.size() && s[i + 1] != ' ') {
      out += em ? "</em>" : "<em>";
      em = !em;
    } else if (!code && s[i] == '*' && em) {
      out += "</em>";
      em = false;
    } else {
      out += s[i];
    }
  }
  if (code) out += "</code>";
  if (bold) out += "</strong>";
  if (em) out += "</em>";
  return out;
}

std::vector<std::string> SplitRow(std::string line) {
  std::vector<std::string> cells;
  if (!line.empty() && line.front() == '|') line.erase(0, 1);
  if (!line.empty() && line.back() == '|') line.pop_back();
  std::string cur;
  for (char c : line) {
    if (c == '|') {
      cells.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  cells.push_back(cur);
  for (auto& c : cells) {
    auto b = c.find_first_not_of(' ');
    auto e = c.find_last_not_of(' ');
    c = b == std::string::npos ? "" : c.substr(b, e - b + 1);
  }
  return cells;
}

std::vector<std::string> SplitCsv(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cur += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cur += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.push_back(cur);
      cur.clear();
    } else if (c != '\r') {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

std::string CsvTable(const std::string& text, size_t max_rows) {
  std::istringstream in(text);
  std::string line, html = "<table>\n";
  size_t row = 0, total = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    ++total;
    if (row > max_rows) continue;
    auto cells = SplitCsv(line);
    const char* tag = row == 0 ? "th" : "td";
    html += row == 0 ? "<thead><tr>" : "<tr>";
    for (const auto& c : cells) html += std::string("<") + tag + ">" + Escape(c) + "</" + tag + ">";
    html += row == 0 ? "</tr></thead><tbody>\n" : "</tr>\n";
    ++row;
  }
  html += "</tbody></table>\n";
  if (total > max_rows + 1) {
    html += "<p class=\"note\">First " + std::to_string(max_rows) + " of " + std::to_string(total - 1) +
            " rows.</p>\n";
  }
  return html;
}

}  // namespace

std::string MarkdownToHtml(const std::string& md) {
  std::istringstream in(md);
  std::string line, out;
  std::vector<std::string> para;
  bool in_code = false, in_list = false;
  std::vector<std::string> table;
  auto flush_para = [&] {
    if (!para.empty()) {
      std::string joined;
      for (const auto& p : para) joined += (joined.empty() ? "" : " ") + p;
      out += "<p>" + Inline(joined) + "</p>\n";
      para.clear();
    }
  };
  auto flush_list = [&] {
    if (in_list) out += "</ul>\n";
    in_list = false;
  };
  auto flush_table = [&] {
    if (table.empty()) return;
    out += "<table>\n";
    for (size_t i = 0; i < table.size(); ++i) {
      auto cells = SplitRow(table[i]);
      bool sep = std::all_of(table[i].begin(), table[i].end(),
                             [](char c) { return c == '|' || c == '-' || c == ':' || c == ' '; });
      if (sep) continue;
      const char* tag = i == 0 ? "th" : "td";
      out += "<tr>";
      for (const auto& c : cells) out += std::string("<") + tag + ">" + Inline(c) + "</" + tag + ">";
      out += "</tr>\n";
    }
    out += "</table>\n";
    table.clear();
  };
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind("```", 0) == 0) {
      flush_para();
      flush_list();
      flush_table();
      out += in_code ? "</code></pre>\n" : "<pre><code>";
      in_code = !in_code;
      continue;
    }
    if (in_code) {
      out += Escape(line) + "\n";
      continue;
    }
    if (!line.empty() && line.front() == '|') {
      flush_para();
      flush_list();
      table.push_back(line);
      continue;
    }
    flush_table();
    if (line.empty()) {
      flush_para();
      flush_list();
      continue;
    }
    size_t hashes = 0;
    while (hashes < line.size() && line[hashes] == '#') ++hashes;
    if (hashes > 0 && hashes <= 6 && hashes < line.size() && line[hashes] == ' ') {
      flush_para();
      flush_list();
      std::string h = std::to_string(std::min<size_t>(hashes + 1, 6));
      out += "<h" + h + ">" + Inline(line.substr(hashes + 1)) + "</h" + h + ">\n";
      continue;
    }
    if (line.rfind("- ", 0) == 0 || line.rfind("* ", 0) == 0) {
      flush_para();
      if (!in_list) out += "<ul>\n";
      in_list = true;
      out += "<li>" + Inline(line.substr(2)) + "</li>\n";
      continue;
    }
    if (line.rfind("![", 0) == 0) continue;  // Figures are all shown below.
    para.push_back(line);
  }
  flush_para();
  flush_list();
  flush_table();
  if (in_code) out += "</code></pre>\n";
  return out;
}

Result<std::string> RenderReport(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return NotFound("dir: \"" + dir + "\" is not a directory");
  std::vector<fs::path> csvs, figures;
  fs::path md;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (!entry.is_regular_file()) continue;
    auto ext = entry.path().extension().string();
    if (ext == ".csv") csvs.push_back(entry.path());
    if (ext == ".png" || ext == ".svg") figures.push_back(entry.path());
    if (entry.path().filename() == "report.md") md = entry.path();
  }
  if (csvs.empty() && figures.empty() && md.empty()) {
    return InvalidArgument("dir: \"" + dir + "\" holds no report.md, *.csv, *.png or *.svg");
  }
  std::sort(csvs.begin(), csvs.end());
  std::sort(figures.begin(), figures.end());
  std::string css;
  for (const Asset& a : Assets()) {
    if (std::string_view(a.name) == "report.css") css.assign(reinterpret_cast<const char*>(a.data), a.size);
  }
  std::string title = fs::path(dir).filename().string();
  if (title.empty()) title = fs::path(dir).parent_path().filename().string();
  std::string html = "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
                     "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>" +
                     Escape(title) + " - LaissezCloud experiment</title>\n<style>\n" + css + "</style></head><body>\n";
  html += "<header><h1>Experiment: " + Escape(title) + "</h1><nav aria-label=\"Sections\">";
  if (!md.empty()) html += "<a href=\"#report\">Report</a> ";
  if (!figures.empty()) html += "<a href=\"#figures\">Figures (" + std::to_string(figures.size()) + ")</a> ";
  if (!csvs.empty()) html += "<a href=\"#tables\">Tables (" + std::to_string(csvs.size()) + ")</a>";
  html += "</nav></header>\n<main>\n";
  if (!md.empty()) html += "<section id=\"report\">\n" + MarkdownToHtml(ReadAll(md)) + "</section>\n";
  if (!figures.empty()) {
    html += "<section id=\"figures\"><h2>Figures</h2>\n";
    for (const auto& f : figures) {
      std::string mime = f.extension() == ".svg" ? "image/svg+xml" : "image/png";
      std::string name = f.filename().string();
      html += "<figure id=\"fig-" + Escape(name) + "\"><img alt=\"" + Escape(name) + "\" src=\"data:" + mime +
              ";base64," + Base64(ReadAll(f)) + "\"><figcaption>" + Escape(name) + "</figcaption></figure>\n";
    }
    html += "</section>\n";
  }
  if (!csvs.empty()) {
    html += "<section id=\"tables\"><h2>Tables</h2>\n";
    for (const auto& c : csvs) {
      html += "<details open><summary>" + Escape(c.filename().string()) + "</summary>\n" + CsvTable(ReadAll(c), 200) +
              "</details>\n";
    }
    html += "</section>\n";
  }
  html += "</main></body></html>\n";
  return html;
}

}  // namespace laissez::server::dashboard
