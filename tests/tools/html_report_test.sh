#!/usr/bin/env bash
# The HTML reports in headless Chromium (Debian's): each page loads with no script error, its
# grid has one cell per row of the JSON report, and a screenshot is produced. Chromium is
# installed when missing (as root or with sudo); when it cannot be, the test is skipped
# (exit 77) saying why.
# Usage: html_report_test.sh GRADNORM WORK_DIR
set -euo pipefail
gradnorm=$(realpath "$1") work=$(realpath -m "$2")
rm -rf "$work"
mkdir -p "$work"
browser=$(command -v chromium || true)
if [ -z "$browser" ]; then
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then
    if sudo -n true 2>/dev/null; then sudo_cmd=(sudo -n); else
      echo "SKIPPED: chromium is not installed and this user cannot install it (no root, no sudo)"
      exit 77
    fi
  fi
  if ! DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends chromium \
       > "$work/apt.log" 2>&1; then
    echo "SKIPPED: chromium could not be installed: $(tail -1 "$work/apt.log")"
    exit 77
  fi
  browser=$(command -v chromium)
fi
fail() { echo "FAIL: $*" >&2; exit 1; }

cd "$work"
status=0
"$gradnorm" run -q -s 'dist/*' -s 'single/n3/*' -v baseline -v skip -v 'broken/*' \
  --json run.json --html run.html > run.log 2>&1 || status=$?
[ "$status" -le 1 ] || fail "gradnorm run exited $status: $(tail -3 run.log)"
"$gradnorm" run -q -s 'dist/*' -s 'single/n3/*' -v baseline -v skip -v 'broken/*' --ignore-findings \
  --json head.json > /dev/null 2>&1 || true
status=0
"$gradnorm" diff run.json head.json --html diff.html --markdown diff.md > /dev/null 2>&1 || status=$?
[ "$status" -le 1 ] || fail "gradnorm diff exited $status"

flags=(--headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking
       --disable-component-update --disable-sync --user-data-dir="$work/profile")
for name in run diff; do
  page="$work/$name.html"
  rows=$("${GRADNORM_PYTHON:-python3}" -c "import json,sys; print(len(json.load(open(sys.argv[1]))['records']))" \
         "$work/$([ "$name" = run ] && echo run || echo head).json")
  timeout 120 "$browser" "${flags[@]}" --virtual-time-budget=5000 --dump-dom "file://$page" \
    > "$work/$name.dom" 2> "$work/$name.console" || fail "$name: chromium could not load the page"
  grep -q 'data-ready="yes"' "$work/$name.dom" || fail "$name: the page's script did not run to its end"
  grep -q 'data-errors="0"' "$work/$name.dom" || fail "$name: script errors: $(grep -o 'data-errors="[0-9]*"' "$work/$name.dom")"
  if grep -E 'Uncaught|CONSOLE.*(error|Error)' "$work/$name.console"; then fail "$name: console errors"; fi
  cells=$(grep -o 'data-cells="[0-9]*"' "$work/$name.dom" | tr -dc 0-9)
  [ "$cells" = "$rows" ] || fail "$name: $cells grid cells for $rows rows"
  timeout 120 "$browser" "${flags[@]}" --window-size=1400,1600 --screenshot="$work/$name.png" "file://$page" \
    > /dev/null 2>&1 || fail "$name: no screenshot"
  [ -s "$work/$name.png" ] || fail "$name: empty screenshot"
  echo "$name.html: $cells cells for $rows rows, no script error, screenshot $(stat -c %s "$work/$name.png") bytes"
done
# Nothing is fetched: the pages name no http(s) resource to load.
if grep -E '(src|href)="https?:' "$work/run.html" "$work/diff.html"; then fail "a page loads from the network"; fi
echo "html: ok"
