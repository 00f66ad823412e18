#!/usr/bin/env bash
# Checks that no function body in src/fusetune/ is longer than a screen: MAX lines (default 120)
# from its signature to its closing brace, lambdas inside it included. Declarative tables (a
# brace block opened after `=`, such as an op table or a schema list) are exempt; the check
# lists the long ones so that a reader sees which they are. Prints each long function as
# file:line: N lines: signature, and fails if there is one. bash, find and awk only (a fresh
# Debian has no python3). Comments, string and character literals and raw strings are skipped
# before braces are counted; preprocessor lines are ignored.
#   scripts/check_function_length.sh [MAX [SRC_DIR]]   (defaults: 120 src/fusetune)
set -euo pipefail
cd "$(dirname "$0")/.."
max=${1:-120}
src=${2:-src/fusetune}
[[ -d $src ]] || { echo "check_function_length: no $src" >&2; exit 2; }

find "$src" -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.inc' \) | LC_ALL=C sort |
  xargs awk -v max="$max" '
function flush_header() { header = ""; header_line = 0 }
function add_header(ch) {
  if (header_line == 0 && ch !~ /[ \t]/) header_line = FNR
  if (length(header) < 400) header = header ch
}
function open_block(   kind, h) {
  h = header
  gsub(/[ \t]+/, " ", h)
  inside_fn = (depth > 0 && fn_depth > 0)
  if (inside_fn) kind = "inner"
  else if (h ~ /(^|[^A-Za-z0-9_])namespace([^A-Za-z0-9_]|$)/ || h ~ /extern "C"/) kind = "ns"
  else if (h ~ /=[ ]*$/ || h ~ /=[ ]*[A-Za-z0-9_:<>, ]*$/) kind = "table"
  else if (h ~ /(^|[^A-Za-z0-9_])(class|struct|union|enum)([^A-Za-z0-9_]|$)/ && h !~ /\)/) kind = "class"
  else if (h ~ /\)/) kind = "fn"
  else kind = "inner"
  depth++
  kinds[depth] = kind
  if (kind == "fn" || kind == "table") {
    fn_depth = depth; start[depth] = (header_line ? header_line : FNR)
    sig[depth] = h; sub(/^ /, "", sig[depth])
  }
  flush_header()
}
function close_block(   n, s) {
  if (depth == 0) return
  if (depth == fn_depth) {
    n = FNR - start[depth] + 1
    s = sig[depth]; if (length(s) > 90) s = substr(s, 1, 87) "..."
    if (n > max) {
      if (kinds[depth] == "table") printf "%s:%d: %d lines (a declarative table, allowed): %s\n", FILENAME, start[depth], n, s
      else { printf "%s:%d: %d lines: %s\n", FILENAME, start[depth], n, s; bad++ }
    }
    fn_depth = 0
  }
  depth--
  flush_header()
}
FNR == 1 { depth = 0; fn_depth = 0; in_block_comment = 0; raw_end = ""; continued_pp = 0; flush_header() }
{
  line = $0
  if (raw_end == "" && !in_block_comment) {
    if (continued_pp || line ~ /^[ \t]*#/) { continued_pp = (line ~ /\\$/); next }
  }
  n = length(line); i = 1
  while (i <= n) {
    c = substr(line, i, 1)
    if (raw_end != "") {                       # inside R"delim( ... )delim"
      p = index(substr(line, i), raw_end)
      if (p == 0) { i = n + 1; continue }
      i += p - 1 + length(raw_end); raw_end = ""; continue
    }
    if (in_block_comment) {
      p = index(substr(line, i), "*/")
      if (p == 0) { i = n + 1; continue }
      i += p + 1; in_block_comment = 0; continue
    }
    two = substr(line, i, 2)
    if (two == "//") break
    if (two == "/*") { in_block_comment = 1; i += 2; continue }
    if (c == "R" && substr(line, i + 1, 1) == "\"" && (i == 1 || substr(line, i - 1, 1) !~ /[A-Za-z0-9_]/)) {
      rest = substr(line, i + 2); p = index(rest, "(")
      raw_end = ")" substr(rest, 1, p - 1) "\""; i += 2 + p; add_header("S"); continue
    }
    if (c == "\"" || c == "\x27") {            # a string or character literal
      j = i + 1
      while (j <= n) {
        d = substr(line, j, 1)
        if (d == "\\") { j += 2; continue }
        if (d == c) break
        j++
      }
      # a digit separator (1\x27000) is not a literal: treat a quote after a digit as plain text
      if (c == "\x27" && i > 1 && substr(line, i - 1, 1) ~ /[0-9]/) { i++; continue }
      add_header("S"); i = j + 1; continue
    }
    if (c == "{") { open_block(); i++; continue }
    if (c == "}") { close_block(); i++; continue }
    if (c == ";") { if (fn_depth == 0) flush_header(); i++; continue }
    if (fn_depth == 0) add_header(c)
    i++
  }
  if (fn_depth == 0) add_header(" ")
}
END {
  if (bad) { printf "check_function_length: %d function(s) over %d lines\n", bad, max; exit 1 }
  printf "check_function_length: no function over %d lines\n", max
}'
