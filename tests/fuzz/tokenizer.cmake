# libFuzzer target for the tokenizer.json loader (tokenizer_json_fuzz.cpp). Included from
# tests/fuzz/CMakeLists.txt, which instruments fusetune_core. Seed inputs: tokenizer_corpus/.
#   mkdir -p /tmp/tokcorpus && cp tests/fuzz/tokenizer_corpus/* /tmp/tokcorpus/
#   ./build/fuzz/tests/fuzz/tokenizer_json_fuzz /tmp/tokcorpus -max_total_time=60
# (libFuzzer writes new units into the first corpus directory: keep the seeds read-only.)
add_executable(tokenizer_json_fuzz ${CMAKE_CURRENT_LIST_DIR}/tokenizer_json_fuzz.cpp)
target_link_libraries(tokenizer_json_fuzz PRIVATE fusetune_core)
target_compile_options(tokenizer_json_fuzz PRIVATE -fsanitize=fuzzer,address -fno-omit-frame-pointer)
target_link_options(tokenizer_json_fuzz PRIVATE -fsanitize=fuzzer,address)
