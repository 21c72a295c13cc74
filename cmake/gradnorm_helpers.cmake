# Warnings are errors in our own code only: LibTorch and other dependencies are SYSTEM.
function(gradnorm_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror)
endfunction()

# LibTorch as an interface target with SYSTEM includes and its C++ ABI setting.
if(NOT TARGET gradnorm_torch)
  add_library(gradnorm_torch INTERFACE)
  target_include_directories(gradnorm_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
  target_link_libraries(gradnorm_torch INTERFACE ${TORCH_LIBRARIES})
  separate_arguments(_gradnorm_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  target_compile_options(gradnorm_torch INTERFACE ${_gradnorm_torch_flags})
endif()

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
endfunction()
