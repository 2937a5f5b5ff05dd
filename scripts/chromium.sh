#!/usr/bin/env bash
# Debian's chromium for the console's browser tests (tests/integration/
# test_console_browser.py drives it with Playwright; a browser is never downloaded:
# `playwright install` is not used). Installs it with apt-get when it is missing and we
# are root or in CI (CI=true, with sudo when not root); otherwise says that the browser
# tests will skip. Never fails the caller: the browser is for tests only.
set -uo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
  if [ "${CI:-}" = true ] && command -v sudo >/dev/null 2>&1; then
    sudo="sudo -n"
  else
    echo "==> chromium is not installed (needs root): the console's browser tests will skip;" \
         "install it with: sudo apt-get install -y chromium" >&2
    exit 0
  fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "==> chromium is not installed and there is no apt-get: the console's browser tests" \
       "will skip" >&2
  exit 0
fi
echo "==> installing Debian's chromium for the console's browser tests" >&2
export DEBIAN_FRONTEND=noninteractive
if ! { $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends chromium; } >&2; then
  echo "==> chromium could not be installed: the console's browser tests will skip" >&2
fi
exit 0
