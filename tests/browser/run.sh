#!/usr/bin/env bash
# The dashboard's browser test (CTest: dashboard_browser_test).
# Usage: run.sh LAISSEZ_BINARY ARTIFACT_DIR
# Installs what is missing: Debian's chromium (scripts/install-deps.sh) and the
# npm packages pinned in web/package-lock.json (npm ci). Never downloads a browser.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="$1"
artifacts="$2"
if [ ! -x /usr/bin/chromium ] || ! command -v npm >/dev/null; then
  bash "$root/scripts/install-deps.sh"
fi
if [ ! -f "$root/web/node_modules/playwright-core/package.json" ]; then
  echo "browser test: npm ci in web/" >&2
  (cd "$root/web" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --ignore-scripts >&2)
fi
mkdir -p "$artifacts"
exec env NODE_PATH="$root/web/node_modules" LAISSEZ="$bin" ARTIFACTS="$artifacts" \
  node "$here/dashboard_test.js"
