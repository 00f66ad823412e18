# Sourced by scripts/test.sh and .ci/run: `phase NAME COMMAND...` runs COMMAND and prints the
# wall time it took, so that a slow CI says which part was slow.
phase() {
  local name=$1 start=$SECONDS
  shift
  echo "== phase $name: start" >&2
  "$@"
  echo "== phase $name: $((SECONDS - start)) s" >&2
}
