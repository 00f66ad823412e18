# libFuzzer target for the tokenizer.json loader (tokenizer_json_fuzz.cpp). Included from
# tests/fuzz/CMakeLists.txt, which instruments fusetune_core. Seed inputs:
# seeds/tokenizer_json_fuzz/; run it with scripts/fuzz.sh SECONDS tokenizer_json_fuzz.
add_executable(tokenizer_json_fuzz ${CMAKE_CURRENT_LIST_DIR}/tokenizer_json_fuzz.cpp)
target_link_libraries(tokenizer_json_fuzz PRIVATE fusetune_core)
target_compile_options(tokenizer_json_fuzz PRIVATE -fsanitize=fuzzer,address -fno-omit-frame-pointer)
target_link_options(tokenizer_json_fuzz PRIVATE -fsanitize=fuzzer,address)
