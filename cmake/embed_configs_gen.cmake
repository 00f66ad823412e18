# cmake -DROOT=<configs dir> -DOUT=<file.cpp> -P embed_configs_gen.cmake
# Writes every ROOT/**/*.yaml as a byte array (hex, so any content is safe) into OUT, with its
# name relative to ROOT without ".yaml" ("llama3_2/1B_full_single_device").
file(GLOB_RECURSE _files RELATIVE ${ROOT} ${ROOT}/*.yaml)
list(SORT _files)
set(_arrays "")
set(_table "")
set(_i 0)
foreach(_f IN LISTS _files)
  file(READ ${ROOT}/${_f} _hex HEX)
  string(LENGTH "${_hex}" _len)
  math(EXPR _size "${_len} / 2")
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," _bytes "${_hex}")
  string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){20})" "\\1\n    " _bytes "${_bytes}")
  string(REGEX REPLACE "\\.yaml$" "" _name "${_f}")
  string(APPEND _arrays "// ${_f}\nconst unsigned char k${_i}[] = {\n    ${_bytes}0x00};\n")
  string(APPEND _table "    {\"${_name}\", k${_i}, ${_size}},\n")
  math(EXPR _i "${_i} + 1")
endforeach()
list(LENGTH _files _count)
file(WRITE ${OUT}.tmp
"// Generated from configs/**/*.yaml by cmake/embed_configs_gen.cmake; do not edit.
#include \"fusetune/config/embedded_configs.h\"

namespace fusetune::detail {
namespace {
${_arrays}}  // namespace

const EmbeddedFile kEmbeddedConfigs[] = {
${_table}    {nullptr, nullptr, 0}};
const size_t kNumEmbeddedConfigs = ${_count};

}  // namespace fusetune::detail
")
file(COPY_FILE ${OUT}.tmp ${OUT} ONLY_IF_DIFFERENT)
file(REMOVE ${OUT}.tmp)
