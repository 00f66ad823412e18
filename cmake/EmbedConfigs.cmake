# Embeds configs/**/*.yaml into a target (fusetune_core) so that `fusetune cp` and
# `fusetune run --config NAME` work from any directory without the source tree. The generated
# .cpp (a byte array per file, see embed_configs_gen.cmake) is rebuilt when a config changes,
# and the glob is re-checked at build time when one is added or removed.
function(fusetune_embed_configs target)
  set(_root ${PROJECT_SOURCE_DIR}/configs)
  file(GLOB_RECURSE _configs CONFIGURE_DEPENDS ${_root}/*.yaml)
  set(_gen ${PROJECT_SOURCE_DIR}/cmake/embed_configs_gen.cmake)
  set(_out ${CMAKE_CURRENT_BINARY_DIR}/generated/embedded_configs.cpp)
  add_custom_command(
    OUTPUT ${_out}
    COMMAND ${CMAKE_COMMAND} -DROOT=${_root} -DOUT=${_out} -P ${_gen}
    DEPENDS ${_configs} ${_gen}
    COMMENT "Embedding built-in configs"
    VERBATIM)
  target_sources(${target} PRIVATE ${_out})
endfunction()
