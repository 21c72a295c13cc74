# gradnorm_add_scenario_tests: a project's scenario files as ctest tests, one per
# scenario x variant, run by the project's own gradnorm executable (a gradnorm::cli
# executable with the project's steps registered, or the installed gradnorm).
#
#   gradnorm_add_scenario_tests(
#     COMMAND   my-gradnorm                  # an executable target, or a path
#     FILES     scenarios/ragged.toml ...    # TOML scenario files (relative to this folder)
#     VARIANTS  own/token-sum baseline       # the variants to judge each scenario with
#     [LABELS   normalisation ...]           # extra ctest labels (always: gradnorm, the variant)
#     [PREFIX   "gradnorm:"]                 # test names: PREFIX SCENARIO x VARIANT
#     [ARGS     --timeout 120 ...])          # more arguments for every gradnorm run
#
# The scenarios are read from the files when ctest starts (the executable lists them), so a
# file edited later needs no re-configure. Each test runs `gradnorm run -q -f FILE... -s
# SCENARIO -v VARIANT` and passes when the row is as expected (exit 0). `ctest -L gradnorm`
# selects them all, `ctest -L own/token-sum` one variant's.
set(_gradnorm_scenario_tests_dir "${CMAKE_CURRENT_LIST_DIR}")
function(gradnorm_add_scenario_tests)
  cmake_parse_arguments(ARG "" "COMMAND;PREFIX" "FILES;VARIANTS;LABELS;ARGS" ${ARGN})
  if(NOT ARG_COMMAND OR NOT ARG_FILES OR NOT ARG_VARIANTS)
    message(FATAL_ERROR "gradnorm_add_scenario_tests needs COMMAND, FILES and VARIANTS")
  endif()
  if(NOT DEFINED ARG_PREFIX)
    set(ARG_PREFIX "gradnorm:")
  endif()
  set(files "")
  foreach(file IN LISTS ARG_FILES)
    get_filename_component(absolute "${file}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
    if(NOT EXISTS "${absolute}")
      message(FATAL_ERROR "gradnorm_add_scenario_tests: no scenario file ${absolute}")
    endif()
    list(APPEND files "${absolute}")
  endforeach()
  if(TARGET ${ARG_COMMAND})
    set(executable "$<TARGET_FILE:${ARG_COMMAND}>")
  else()
    set(executable "${ARG_COMMAND}")
  endif()
  get_property(counter GLOBAL PROPERTY gradnorm_scenario_tests_counter)
  math(EXPR counter "${counter} + 1")
  set_property(GLOBAL PROPERTY gradnorm_scenario_tests_counter ${counter})
  set(script "${CMAKE_CURRENT_BINARY_DIR}/gradnorm_scenario_tests_${counter}.cmake")
  file(GENERATE OUTPUT "${script}" CONTENT "set(executable [==[${executable}]==])
set(files [==[${files}]==])
set(variants [==[${ARG_VARIANTS}]==])
set(labels [==[${ARG_LABELS}]==])
set(extra [==[${ARG_ARGS}]==])
set(prefix [==[${ARG_PREFIX}]==])
include([==[${_gradnorm_scenario_tests_dir}/gradnormScenarioTestsDiscover.cmake]==])
")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${script}")
endfunction()
