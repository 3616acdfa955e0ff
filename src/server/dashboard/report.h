// `laissez report DIR`: one self-contained HTML page of an experiment
// directory (the simulator writes DIR/*.csv, *.png, *.svg, report.md): the
// report's text, every figure inlined (data: URLs) and every table, so the page
// opens offline, from a file or from `laissez report DIR --serve`.
#pragma once

#include <string>

#include "common/status.h"

namespace laissez::server::dashboard {

// NOT_FOUND if `dir` is not a directory; INVALID_ARGUMENT if it holds none of
// report.md, *.csv, *.png, *.svg.
Result<std::string> RenderReport(const std::string& dir);

// Minimal Markdown to HTML (headings, paragraphs, lists, pipe tables, code
// fences, inline code, emphasis, images by file name). Escapes all HTML.
std::string MarkdownToHtml(const std::string& md);

}  // namespace laissez::server::dashboard
