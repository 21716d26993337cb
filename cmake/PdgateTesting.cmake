find_package(GTest REQUIRED)
include(GoogleTest)

# pdgate_add_test(NAME name SOURCES a.cpp b.cpp LIBS lib... [LABELS l...])
# One GoogleTest executable; each TEST() becomes its own ctest entry so CI
# output counts every case.
function(pdgate_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE pdgate::options GTest::gtest GTest::gtest_main ${T_LIBS})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  # gtest_discover_tests flattens PROPERTIES into one list, so a property
  # can carry a single value only: the first label is used, and the
  # binaries find the build and source trees through compile definitions
  # (see tests/integration/harness.cpp) instead of ENVIRONMENT.
  list(GET T_LABELS 0 label)
  # A test that links none of the gateway's or the sim's libraries only
  # drives processes (cmake/PdgateOptions.cmake): no sanitizer
  # instrumentation of its own, and -O1 -g1.
  set(driver ON)
  foreach(lib IN LISTS T_LIBS)
    if(lib MATCHES "^pdgate::|^pdgate_(logic|core|plugins|policies|sim)")
      set(driver OFF)
    endif()
  endforeach()
  set_target_properties(${T_NAME} PROPERTIES PDGATE_PROCESS_DRIVER ${driver})
  # Test code compiles in unity batches when the tree asks for it
  # (cmake/PdgateOptions.cmake).
  if(PDGATE_UNITY_BUILD)
    set_target_properties(${T_NAME} PROPERTIES UNITY_BUILD ON)
  endif()
  # Line tables only in the RelWithDebInfo build scripts/build.sh makes
  # (after the build type's -g, so this wins): a failing test still reports
  # file and line, and full debug info took a quarter of the compile time
  # (core/upstream/health.cpp: 39.5 s at -O2 -g, 30.1 s at -O2 -g1). A Debug tree
  # keeps full debug info for stepping through a test.
  if(NOT PDGATE_SANITIZE)
    target_compile_options(${T_NAME} PRIVATE $<$<CONFIG:RelWithDebInfo>:-g1>)
  endif()
  target_compile_definitions(${T_NAME} PRIVATE
    PDGATE_DEFAULT_BUILD_DIR="${CMAKE_BINARY_DIR}"
    PDGATE_DEFAULT_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  gtest_discover_tests(${T_NAME}
    PROPERTIES LABELS ${label} TIMEOUT ${T_TIMEOUT}
    DISCOVERY_TIMEOUT 60)
endfunction()
