# llama-server and llama-bench compiled from llama.cpp's sources (the installed llama-cpp-python's
# sdist) and linked to the shared libraries that llama-cpp-python ships: the same libllama, ggml,
# mtmd and llama-common the in-process engine loads, so only the tools' own files are compiled.
# Written as CMakeLists.txt into the build folder by pytest_llmperf/engines/servers.py, which
# passes: LLAMA_SRC (vendor/llama.cpp of the sdist), SHIPPED_LIB_DIR (llama_cpp/lib of the
# wheel), COMMON_LIB (the wheel's libllama-common), LLAMA_OPENSSL and LLAMA_SUBPROCESS (how
# that libllama-common was configured: the headers the tools include must agree with it).
cmake_minimum_required(VERSION 3.14)
project(llmperf_llama_tools C CXX)

foreach(var LLAMA_SRC SHIPPED_LIB_DIR COMMON_LIB LLAMA_OPENSSL LLAMA_SUBPROCESS)
    if(NOT DEFINED ${var})
        message(FATAL_ERROR "llmperf: ${var} is not given")
    endif()
endforeach()

set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
# The tools' own libraries (server-context, llama-server-impl, llama-bench-impl) are static: the
# binaries load nothing of this build, only the shipped libraries.
set(BUILD_SHARED_LIBS OFF)
# The server is started with --no-webui: no UI assets (and no download of them).
set(LLAMA_BUILD_UI OFF)
set(LLAMA_USE_PREBUILT_UI OFF)
list(APPEND CMAKE_MODULE_PATH ${LLAMA_SRC}/cmake)
include(${LLAMA_SRC}/cmake/license.cmake)
# llama.cpp's cmake/common.cmake adds warning flags only; the tools build without them.
function(llama_add_compile_flags)
endfunction()
find_package(Threads REQUIRED)
# The tools' CMakeLists name llama.cpp's root as PROJECT_SOURCE_DIR.
set(PROJECT_SOURCE_DIR ${LLAMA_SRC})

# The binaries find the shipped libraries where they are installed (absolute RUNPATH): the
# build folder's name carries their location and contents, so another install builds anew.
get_filename_component(COMMON_LIB_DIR ${COMMON_LIB} DIRECTORY)
set(CMAKE_SKIP_BUILD_RPATH OFF)
set(CMAKE_BUILD_RPATH ${SHIPPED_LIB_DIR} ${COMMON_LIB_DIR})

function(llmperf_shipped name file)
    if(NOT EXISTS ${file})
        message(FATAL_ERROR "llmperf: ${file} is missing")
    endif()
    add_library(${name} SHARED IMPORTED GLOBAL)
    set_target_properties(${name} PROPERTIES IMPORTED_LOCATION ${file})
endfunction()

llmperf_shipped(ggml-base ${SHIPPED_LIB_DIR}/libggml-base.so)
llmperf_shipped(ggml ${SHIPPED_LIB_DIR}/libggml.so)
llmperf_shipped(llama ${SHIPPED_LIB_DIR}/libllama.so)
llmperf_shipped(mtmd ${SHIPPED_LIB_DIR}/libmtmd.so)
llmperf_shipped(llama-common ${COMMON_LIB})
set_target_properties(ggml-base PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES ${LLAMA_SRC}/ggml/include
    INTERFACE_COMPILE_DEFINITIONS GGML_SHARED)
set_target_properties(ggml PROPERTIES INTERFACE_LINK_LIBRARIES ggml-base)
set_target_properties(llama PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES ${LLAMA_SRC}/include
    INTERFACE_LINK_LIBRARIES "ggml;ggml-base"
    INTERFACE_COMPILE_DEFINITIONS LLAMA_SHARED)
set_target_properties(mtmd PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES ${LLAMA_SRC}/tools/mtmd
    INTERFACE_LINK_LIBRARIES llama)
set(COMMON_DEFINITIONS "")
if(LLAMA_SUBPROCESS)
    list(APPEND COMMON_DEFINITIONS LLAMA_SUBPROCESS)
endif()
set_target_properties(llama-common PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${LLAMA_SRC}/common;${LLAMA_SRC}/vendor"
    INTERFACE_LINK_LIBRARIES "llama;Threads::Threads"
    INTERFACE_COMPILE_DEFINITIONS "${COMMON_DEFINITIONS}"
    INTERFACE_COMPILE_FEATURES cxx_std_17)

# cpp-httplib: libllama-common contains it (compiled by llama.cpp's own CMake for it) and exports
# its functions; the tools take them from there, with the header configured the same way.
add_library(cpp-httplib INTERFACE)
target_include_directories(cpp-httplib INTERFACE ${LLAMA_SRC}/vendor)
if(LLAMA_OPENSSL)
    find_package(OpenSSL)
    if(NOT OpenSSL_FOUND)
        message(FATAL_ERROR "llmperf: the shipped libllama-common uses OpenSSL, whose headers are "
                            "not installed here (apt-get install libssl-dev)")
    endif()
    target_compile_definitions(cpp-httplib INTERFACE CPPHTTPLIB_OPENSSL_SUPPORT)
    target_link_libraries(cpp-httplib INTERFACE OpenSSL::SSL OpenSSL::Crypto)
endif()

add_subdirectory(${LLAMA_SRC}/tools/ui tools/ui)
add_subdirectory(${LLAMA_SRC}/tools/server tools/server)
add_subdirectory(${LLAMA_SRC}/tools/llama-bench tools/llama-bench)
