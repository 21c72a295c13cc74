# Run by ctest when it starts (a TEST_INCLUDE_FILES script written by
# gradnorm_add_scenario_tests, which sets executable, files, variants, labels, extra and
# prefix): lists the files' scenarios with the executable and adds one test per scenario x
# variant.
set(file_arguments "")
foreach(file IN LISTS files)
  list(APPEND file_arguments -f "${file}")
endforeach()
execute_process(COMMAND "${executable}" list --scenarios --names ${file_arguments}
                OUTPUT_VARIABLE names ERROR_VARIABLE error RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  # A test that fails and says why, rather than no tests at all.
  add_test("${prefix}scenario-files" "${executable}" list --scenarios --names ${file_arguments})
  return()
endif()
string(REPLACE "\n" ";" names "${names}")
foreach(name IN LISTS names)
  if(name STREQUAL "")
    continue()
  endif()
  # -s and -v take patterns: glob characters are escaped so a name selects itself alone.
  string(REGEX REPLACE "([][*?\\])" "\\\\\\1" name_pattern "${name}")
  foreach(variant IN LISTS variants)
    string(REGEX REPLACE "([][*?\\])" "\\\\\\1" variant_pattern "${variant}")
    set(test "${prefix}${name} x ${variant}")
    add_test("${test}" "${executable}" run -q ${file_arguments} -s "${name_pattern}" -v "${variant_pattern}" ${extra})
    set_tests_properties("${test}" PROPERTIES LABELS "gradnorm;${variant};${labels}")
  endforeach()
endforeach()
