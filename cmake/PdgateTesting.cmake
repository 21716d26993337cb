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
  gtest_discover_tests(${T_NAME}
    PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
    ENVIRONMENT "PDGATE_BUILD_DIR=${CMAKE_BINARY_DIR};PDGATE_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
    DISCOVERY_TIMEOUT 60)
endfunction()
