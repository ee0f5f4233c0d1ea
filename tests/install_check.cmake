# ctest's install_downstream: installs the build to a fresh prefix and uses it the way a user
# would, so that a missing header, export, RPATH or pkg-config field fails here and not for them.
# Arguments: BUILD_DIR, SOURCE_DIR, WORK_DIR, GENERATOR, CXX_COMPILER, BUILD_TYPE.
cmake_minimum_required(VERSION 3.25)

function(run)
  cmake_parse_arguments(R "" "OUTPUT" "COMMAND" ${ARGN})
  execute_process(COMMAND ${R_COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    string(JOIN " " cmd ${R_COMMAND})
    message(FATAL_ERROR "failed (${rc}): ${cmd}\n${out}")
  endif()
  if(R_OUTPUT)
    set(${R_OUTPUT} "${out}" PARENT_SCOPE)
  endif()
endfunction()

set(prefix ${WORK_DIR}/prefix)
if(NOT BUILD_TYPE)
  set(BUILD_TYPE Release)
endif()
file(REMOVE_RECURSE ${WORK_DIR})
# The installed binaries must find liblstm through their RPATH alone, never the build tree's.
unset(ENV{LD_LIBRARY_PATH})

run(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix} OUTPUT out)
foreach(bench bench_cpu_lstm bench_gpu_lstm)
  if(EXISTS ${prefix}/bin/${bench})
    message(FATAL_ERROR "benchmark ${bench} installed into bin/")
  endif()
endforeach()

run(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/downstream -B ${WORK_DIR}/build -G "${GENERATOR}"
            -DCMAKE_BUILD_TYPE=${BUILD_TYPE} -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
            -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
run(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(COMMAND ${WORK_DIR}/build/downstream OUTPUT out)
message(STATUS "downstream: ${out}")
if(NOT out MATCHES "downstream h_n=0\\.[0-9]+ expected=")
  message(FATAL_ERROR "unexpected downstream output: ${out}")
endif()

run(COMMAND ${prefix}/bin/lstm info OUTPUT out)
string(REGEX MATCH "[^\n]*\n?[^\n]*" first "${out}")
message(STATUS "installed lstm info: ${first}")

find_program(PKG_CONFIG pkg-config REQUIRED)
file(GLOB pc_dirs ${prefix}/*/pkgconfig ${prefix}/*/*/pkgconfig)
string(JOIN ":" pc_path ${pc_dirs})
set(ENV{PKG_CONFIG_PATH} "${pc_path}")
run(COMMAND ${PKG_CONFIG} --cflags --libs lstm OUTPUT out)
string(STRIP "${out}" flags)
message(STATUS "pkg-config --cflags --libs lstm: ${flags}")
# The .pc file is relocatable (paths relative to itself): check where its paths lead, not how
# they are spelled.
separate_arguments(flags UNIX_COMMAND "${flags}")
set(found_header OFF)
set(found_lib OFF)
foreach(f ${flags})
  # Nested ifs: ${CMAKE_MATCH_1} in the condition that sets it would expand to the last match.
  if(f MATCHES "^-I(.*)")
    set(dir "${CMAKE_MATCH_1}")
    if(EXISTS "${dir}/lstm/lstm.hpp")
      file(REAL_PATH "${dir}" dir)
      file(REAL_PATH "${prefix}/include" want)
      if(dir STREQUAL want)
        set(found_header ON)
      endif()
    endif()
  elseif(f MATCHES "^-L(.*)")
    set(dir "${CMAKE_MATCH_1}")
    if(EXISTS "${dir}/liblstm.so" OR EXISTS "${dir}/liblstm.a")
      set(found_lib ON)
      set(libdir "${dir}")
    endif()
  endif()
endforeach()
if(NOT found_header OR NOT found_lib OR NOT "-llstm" IN_LIST flags)
  message(FATAL_ERROR "pkg-config's flags do not lead to ${prefix}'s headers and liblstm.so")
endif()
# The same program built by hand from pkg-config's flags alone (a static liblstm would need
# --static and its private libraries; the default build is shared).
if(NOT EXISTS "${libdir}/liblstm.so")
  return()
endif()
run(COMMAND ${CXX_COMPILER} -std=c++20 ${SOURCE_DIR}/tests/downstream/main.cpp ${flags} -o ${WORK_DIR}/pc_downstream)
run(COMMAND ${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${libdir} ${WORK_DIR}/pc_downstream OUTPUT out)
message(STATUS "pkg-config downstream: ${out}")
