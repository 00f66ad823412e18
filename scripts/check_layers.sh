#!/usr/bin/env bash
# Checks every #include "fusetune/..." under src/fusetune/ against the allowed-dependency table
# (scripts/layers.txt: each folder and the folders below it that it may include). Prints each
# include that is not allowed as file:line, with the edge it adds, and fails; also fails when a
# folder of src/fusetune/ is missing from the table, or when the table lets a folder include
# one that is not below it. bash, grep and awk only (a fresh Debian has no python3).
#   scripts/check_layers.sh [SRC_DIR [TABLE]]   (defaults: src/fusetune scripts/layers.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:-src/fusetune}
table=${2:-scripts/layers.txt}
[[ -d $src && -f $table ]] || { echo "check_layers: no $src or no $table" >&2; exit 2; }

# Every folder, then every include (file:line:text), after the table.
{
  for d in "$src"/*/; do d=${d%/}; echo "folder ${d##*/}"; done
  grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]fusetune/' "$src" \
    --include='*.h' --include='*.hpp' --include='*.cpp' --include='*.cc' --include='*.inc' || true
} | awk -v src="$src" -v table="$table" '
function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s); return s }
BEGIN {
  n = 0; bad = 0; checked = 0
  while ((getline raw < table) > 0) {
    ++tline
    sub(/#.*/, "", raw)
    if (trim(raw) == "") continue
    c = index(raw, ":")
    if (c == 0) { printf "%s:%d: expected \"folder: folders it may include\"\n", table, tline; bad++; continue }
    name = trim(substr(raw, 1, c - 1))
    if (name in rank) { printf "%s:%d: %s is listed twice\n", table, tline, name; bad++; continue }
    rank[name] = ++n
    names[n] = name
    k = split(substr(raw, c + 1), deps, /[ \t,]+/)
    for (i = 1; i <= k; i++) {
      if (deps[i] == "") continue
      if (!(deps[i] in rank)) {
        printf "%s:%d: %s may include %s, which is not on a line above it\n", table, tline, name, deps[i]
        bad++
        continue
      }
      allowed[name, deps[i]] = 1
      may[name] = may[name] " " deps[i]
    }
  }
  close(table)
  if (n == 0) { printf "%s: no layers\n", table; fatal = 1; exit 2 }
}
$1 == "folder" && NF == 2 {
  if (!($2 in rank)) { printf "%s/%s/: a folder that %s does not list\n", src, $2, table; bad++ }
  next
}
{
  # file:line:text; file names hold no colon.
  c1 = index($0, ":"); file = substr($0, 1, c1 - 1); rest = substr($0, c1 + 1)
  c2 = index(rest, ":"); line = substr(rest, 1, c2 - 1); text = substr(rest, c2 + 1)
  rel = substr(file, length(src) + 2)
  s = index(rel, "/")
  if (s == 0) { printf "%s:%s: a file outside the layer folders\n", file, line; bad++; next }
  from = substr(rel, 1, s - 1)
  if (!match(text, /fusetune\/[^\/">]+\//)) next
  to = substr(text, RSTART + 9, RLENGTH - 10)
  checked++
  if (!(from in rank)) next  # reported once, as a folder the table does not list
  if (from == to) next
  inc = text; sub(/^[ \t]*#[ \t]*include[ \t]*/, "", inc); sub(/[ \t]*(\/\/.*)?$/, "", inc)
  if (!(to in rank)) {
    printf "%s:%s: %s -> %s: %s includes a folder the table does not list\n", file, line, from, to, inc
    bad++
  } else if (!((from, to) in allowed)) {
    dir = rank[to] > rank[from] ? "upward" : "downward, not in the table"
    printf "%s:%s: %s -> %s (%s): %s; %s may include only:%s\n", file, line, from, to, dir, inc, from, \
      (from in may) ? may[from] : " its own folder"
    bad++
  }
}
END {
  if (fatal) exit 2
  if (bad) { printf "check_layers: %d problem(s) (%d includes checked; table: %s)\n", bad, checked, table; exit 1 }
  printf "check_layers: %d includes of %d layers checked, every one points down\n", checked, n
}'
