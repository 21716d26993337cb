# A unity build compiles a target's sources eight at a time, each batch as
# one translation unit: the Asio, Beast, JSON and GoogleTest templates every
# source instantiates are parsed, instantiated and optimised once per batch
# instead of once per source. It applies where the generated code's speed
# does not matter: the tests (cmake/PdgateTesting.cmake), and everything in
# the sanitizer build. pdgate and pdgate-sim themselves are never built this
# way in a release build: in one big translation unit GCC 12 inlines less
# (std::string appends in the request path stayed calls), and callgrind
# counted 6.7% more instructions per request. A one-file edit recompiles
# its batch, so scripts/build.sh turns this on only for a tree it
# configures afresh.
if(PDGATE_UNITY_BUILD)
  set(CMAKE_UNITY_BUILD_BATCH_SIZE 8)
  if(PDGATE_SANITIZE)
    set(CMAKE_UNITY_BUILD ON)
  endif()
endif()

# One interface target carries the project's warning and sanitizer flags;
# every pdgate target links it instead of repeating flags.
add_library(pdgate_options INTERFACE)
add_library(pdgate::options ALIAS pdgate_options)
target_compile_options(pdgate_options INTERFACE -Wall -Wextra -Werror)
# GCC 12 reports a false positive on every Asio coroutine frame (Asio's
# frame allocator pairs its own operator new/delete; GCC cannot see it).
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  target_compile_options(pdgate_options INTERFACE -Wno-mismatched-new-delete)
  # At -O3 (Release) GCC 12 reports -Wrestrict false positives inside
  # libstdc++'s own string concatenation (GCC bug 105329).
  target_compile_options(pdgate_options INTERFACE -Wno-error=restrict)
  # In a unity batch every source but the batch file counts as an included
  # file, and GCC then flags each coroutine frame that holds a type from an
  # anonymous namespace; within one batch that is exactly what is meant.
  # Only targets compiled in batches drop the warning.
  target_compile_options(pdgate_options INTERFACE
    $<$<BOOL:$<TARGET_PROPERTY:UNITY_BUILD>>:-Wno-subobject-linkage>)
endif()
# Asio and Beast are compiled once (core/base/asio_impl.cpp) rather than in every
# translation unit: this roughly halves build time on a 2-core machine.
target_compile_definitions(pdgate_options INTERFACE
  BOOST_ASIO_SEPARATE_COMPILATION
  BOOST_BEAST_SEPARATE_COMPILATION
  BOOST_ASIO_NO_DEPRECATED
  BOOST_ASIO_DISABLE_BOOST_COROUTINE
  # Coroutine frames and handlers straight from malloc (glibc's per-thread
  # cache), not from Asio's cache of freed blocks: that cache hands out the
  # first block big enough, so an idle stream's small frames sat in blocks
  # freed by routing's big ones (massif showed frames of 100-250 bytes in
  # blocks of 330-670). Without it a request costs no more CPU (bench/).
  BOOST_ASIO_RECYCLING_ALLOCATOR_CACHE_SIZE=0
  # ...and through operator new rather than aligned_alloc: Asio asks for
  # the default alignment (16 bytes, what operator new gives) for every
  # frame and handler pdgate has, and mimalloc's aligned path cost ~100
  # instructions a call against ~30, ~24 calls a request (bench/README.md).
  # With both disabled Asio's aligned_new falls back to operator new, which
  # ignores a larger alignment: a handler type declared alignas(32) or more
  # would need these two lines removed (pdgate declares none).
  BOOST_ASIO_DISABLE_STD_ALIGNED_ALLOC
  BOOST_ASIO_DISABLE_BOOST_ALIGN)
if(PDGATE_SANITIZE)
  # With sanitizer instrumentation GCC 12 reports -Wmaybe-uninitialized
  # inside Beast's own code (asio_impl.cpp); the warning is not actionable
  # there, and the sanitizers check for the real thing at run time.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(pdgate_options INTERFACE -Wno-maybe-uninitialized)
  endif()
  # -O1 -g1 (after the build type's flags, so they win): the sanitizer
  # build exists to run the tests, and at -O2 -g it took most of CI's time
  # compiling; -g1 still gives function names and lines in reports.
  # Process drivers (see below) are not instrumented: the code they test
  # runs in the pdgate, pdgate-sim and redis-server processes they start,
  # and instrumenting their own sockets and assertions doubled their
  # compile time for nothing. They still link the sanitizer runtime.
  target_compile_options(pdgate_options INTERFACE
    $<$<NOT:$<BOOL:$<TARGET_PROPERTY:PDGATE_PROCESS_DRIVER>>>:-fsanitize=address,undefined;-fno-sanitize-recover=undefined>
    -fno-omit-frame-pointer -O1 -g1)
  target_link_options(pdgate_options INTERFACE -fsanitize=address,undefined)
  # For the few tests whose conditions the sanitizers cannot run under.
  target_compile_definitions(pdgate_options INTERFACE PDGATE_SANITIZED=1)
else()
  # A process driver is test code that links no pdgate library: it starts
  # pdgate, pdgate-sim or redis-server as processes and checks them over
  # sockets (cmake/PdgateTesting.cmake sets the property). Its own
  # optimisation level changes nothing the tests measure, and -O1 -g1
  # (what the sanitizer build uses for everything) compiles it in about
  # two thirds of the time -O2 -g takes.
  target_compile_options(pdgate_options INTERFACE
    $<$<BOOL:$<TARGET_PROPERTY:PDGATE_PROCESS_DRIVER>>:-O1;-g1>)
endif()
