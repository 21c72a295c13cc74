# Warnings are errors in our own code only: LibTorch and other dependencies are SYSTEM.
function(gradnorm_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror)
endfunction()

# A library per top-level folder: gradnorm::<name>, public headers in <name>/include.
function(gradnorm_add_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(gradnorm_${name} ${ARG_SOURCES})
  add_library(gradnorm::${name} ALIAS gradnorm_${name})
  target_include_directories(gradnorm_${name} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:include>)
  target_link_libraries(gradnorm_${name} PUBLIC ${ARG_DEPS})
  gradnorm_warnings(gradnorm_${name})
  # Batches of up to 8 files (CMake's default) keep both cores of a 2-core build busy.
  set_target_properties(gradnorm_${name} PROPERTIES UNITY_BUILD ${GRADNORM_UNITY_BUILD})
endfunction()
