#!/usr/bin/env bash
# Installs every Debian package fusetune needs to build, test and benchmark.
# Idempotent: does nothing when all packages are already present.
#   --with-reference  also makes sure Node.js and npm exist (the independent tokenizer
#                     implementation the conformance tests compare against) and Chromium
#                     (headless, it renders `fusetune report` pages for the browser test);
#                     tests skip without them, so a failure here only warns.
set -euo pipefail
pkgs=(
  cmake ninja-build g++ clang pkg-config   # build
  ccache                                   # compiler cache (~/.cache/ccache): warm rebuilds
  libclang-rt-14-dev                       # libFuzzer, ASan and UBSan runtimes for clang (asan preset)
  libomp-dev                               # clang's OpenMP runtime (asan preset)
  libopenblas-openmp-dev                   # GEMM (OpenMP build: shares our thread pool)
  libdnnl-dev                              # oneDNN: bf16 matmuls on CPUs with bf16 dot products
  nlohmann-json3-dev                       # JSON: config.json, safetensors header, tokenizer.json
  libyaml-cpp-dev                          # YAML recipe configs
  libpcre2-dev                             # Unicode regex for tokenizer pre-tokenizers
  libsentencepiece-dev                     # SentencePiece tokenizer.model files
  libicu-dev                               # Unicode normalization (NFC...) for tokenizer.json normalizers
  libgtest-dev googletest                  # unit tests
  libprotobuf-dev                          # tests: protobuf's parser reads TensorBoard event files
  libbenchmark-dev                         # micro-benchmarks
  libopenmpi-dev openmpi-bin               # the *_distributed recipes: ranks over MPI (mpirun)
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "installing: ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Node.js + npm: checked by command, not package, since a machine may carry Node from
# elsewhere (with npm bundled), where Debian's npm package would conflict.
if [ "${1:-}" = "--with-reference" ] && ! { command -v node && command -v npm; } >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null ||
    echo "warning: could not install nodejs/npm; tokenizer conformance tests will skip" >&2
fi

# Chromium: only the browser test (tests/browser) needs it, and it is large, so it comes with
# the reference tools rather than with the build dependencies.
if [ "${1:-}" = "--with-reference" ] && ! command -v chromium >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null ||
    echo "warning: could not install chromium; the report's browser test will skip" >&2
fi
