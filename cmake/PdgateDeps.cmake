# Every dependency comes from Debian 12's packages (scripts/install-deps.sh).
find_package(Boost 1.81 REQUIRED COMPONENTS url)
find_package(Threads REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(spdlog REQUIRED)
find_package(yaml-cpp REQUIRED)
# libcrypto's SHA-256 for conversation keys and history fingerprints;
# libssl for TLS to clients and engines (Asio's ssl::stream).
find_package(OpenSSL 3 REQUIRED COMPONENTS Crypto SSL)
find_package(PkgConfig REQUIRED)
# ZeroMQ for pdgate-sim's KV events (vLLM's publisher protocol); cppzmq is
# its header-only C++ binding, its config finds libzmq through pkg-config.
find_package(cppzmq REQUIRED)
pkg_check_modules(LUAJIT REQUIRED IMPORTED_TARGET luajit)
pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis)

# The gateway's allocator (PDGATE_MIMALLOC, CMakeLists.txt). Linking
# libmimalloc ahead of libc makes it the process's malloc/free/new/delete.
# A request makes ~60 allocations; with glibc's malloc they were a fifth
# of the gateway's instructions (its per-thread cache holds 7 blocks of a
# size, and large requests consolidate its fast bins). mimalloc took the
# one-hop request from ~50k to ~44k instructions with the same idle-stream
# memory (bench/README.md). Not with the sanitizers: ASan brings its own.
if(PDGATE_MIMALLOC AND NOT PDGATE_SANITIZE)
  find_library(PDGATE_MIMALLOC_LIBRARY NAMES mimalloc REQUIRED)
  message(STATUS "pdgate allocator: ${PDGATE_MIMALLOC_LIBRARY}")
else()
  message(STATUS "pdgate allocator: the C library's malloc")
endif()

# Asio and Beast, compiled once and shared by the gateway, the simulated
# engine and the tests, with the timed socket built directly on them
# (core/net/deadline_socket.hpp: both sides' connections use it).
add_library(pdgate_asio STATIC ${PROJECT_SOURCE_DIR}/core/base/asio_impl.cpp
                               ${PROJECT_SOURCE_DIR}/core/net/deadline_socket.cpp)
add_library(pdgate::asio ALIAS pdgate_asio)
target_include_directories(pdgate_asio PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(pdgate_asio PUBLIC pdgate::options Boost::headers Threads::Threads
                                          OpenSSL::SSL OpenSSL::Crypto)
