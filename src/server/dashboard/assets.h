// The dashboard's built front-end files (web/dist), embedded at build time by
// embed_assets.cmake so the binary serves the page with no files beside it.
#pragma once

#include <cstddef>
#include <span>

namespace laissez::server::dashboard {

struct Asset {
  const char* name;  // File name under /dash/, e.g. "app.js".
  const char* mime;
  const unsigned char* data;
  size_t size;
};

std::span<const Asset> Assets();

}  // namespace laissez::server::dashboard
