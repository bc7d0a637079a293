# One CTest entry per TEST_CASE of a test_cuda_* suite ("suite/case"), registered when ctest
# starts (tests/CMakeLists.txt adds a call of weft_register_cuda_test_cases to the directory's
# TEST_INCLUDE_FILES; gtest_discover_tests' PRE_TEST mode works the same way).
#
# Why per case: a CUDA fault such as an illegal address is sticky, it breaks the context of the
# process for good, so in a suite run as one process every later case fails too and one fault
# hides whatever the cases after it would have shown. In its own process each case fails alone.
#
# Why at ctest time, not at build time: the suites list their cases only where a GPU is visible
# (without one they exit 77 before doctest starts, saying why). There the suite stays one entry,
# which CTest shows as skipped, as before: a CPU-only run keeps one line per suite.

# prefix: the entry's name before "/case"; executable: the suite; environment: the entries'
# ENVIRONMENT property (a list); filter: a doctest --test-case filter ("" for every case);
# labels: the entries' LABELS (a list, tests/CMakeLists.txt says which).
function(weft_register_cuda_test_cases prefix executable environment filter labels)
  set(listing "")
  set(rc "not built")
  set(only "")
  if(NOT filter STREQUAL "")
    set(only "--test-case=${filter}")
  endif()
  if(EXISTS "${executable}")
    execute_process(COMMAND "${executable}" --list-test-cases --no-colors=true ${only}
                    OUTPUT_VARIABLE listing ERROR_VARIABLE listing_errors RESULT_VARIABLE rc TIMEOUT 120)
  endif()
  set(cases "")
  if(rc EQUAL 0)
    # A list of lines: ';', '[' and ']' would split or glue CMake list elements, so they travel
    # as placeholders until each name is rebuilt.
    string(REPLACE ";" "<weft-semicolon>" listing "${listing}")
    string(REPLACE "[" "<weft-open>" listing "${listing}")
    string(REPLACE "]" "<weft-close>" listing "${listing}")
    string(REPLACE "\n" ";" lines "${listing}")
    # The names sit between the first two lines of '=' that follow "listing all test case names".
    set(section 0)
    foreach(line IN LISTS lines)
      if(line MATCHES "^=+$")
        math(EXPR section "${section} + 1")
      elseif(line MATCHES "listing all test case names")
        set(section 0)
      elseif(section EQUAL 1 AND NOT line STREQUAL "")
        list(APPEND cases "${line}")
      endif()
    endforeach()
  endif()

  if(cases STREQUAL "")
    # No GPU (77, the suite says why when it runs), not built, or a listing that failed: the whole
    # suite as one entry, which shows the reason.
    add_test("${prefix}" "${executable}" ${only})
    set_tests_properties("${prefix}" PROPERTIES ENVIRONMENT "${environment}" SKIP_RETURN_CODE 77
                         LABELS "${labels}")
    return()
  endif()

  foreach(case IN LISTS cases)
    string(REPLACE "<weft-semicolon>" ";" name "${case}")
    string(REPLACE "<weft-open>" "[" name "${name}")
    string(REPLACE "<weft-close>" "]" name "${name}")
    # doctest splits --test-case on commas unless they are escaped with a backslash.
    string(REPLACE "\\" "\\\\" filter "${name}")
    string(REPLACE "," "\\," filter "${filter}")
    add_test("${prefix}/${name}" "${executable}" "--test-case=${filter}")
    # A filter that matched nothing would pass silently: "test cases: 0 |" fails the entry.
    set_tests_properties("${prefix}/${name}" PROPERTIES ENVIRONMENT "${environment}" SKIP_RETURN_CODE 77
                         FAIL_REGULAR_EXPRESSION "test cases: *0 [|]" LABELS "${labels}")
  endforeach()
endfunction()
