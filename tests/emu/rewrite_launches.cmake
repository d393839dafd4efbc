# cmake -DIN=<file.cu> -DOUT=<file.cpp> -P rewrite_launches.cmake
# Rewrites each kernel launch `k<<<grid, block, smem, stream>>>(args)` into
# `ct_emu_launch(k, grid, block, smem, stream)(args)` (tests/emu/emu_kernel.h)
# so g++ compiles the .cu file for the CPU emulator. A launch configuration
# holds no ';', which bounds the match to one statement.
file(READ "${IN}" src)
string(REGEX REPLACE "([A-Za-z_][A-Za-z_0-9]*)<<<([^;]*)>>>\\(" "ct_emu_launch(\\1, \\2)(" out "${src}")
string(FIND "${out}" "<<<" left)
if(NOT left EQUAL -1)
  message(FATAL_ERROR "${IN}: a kernel launch the rewrite did not recognise")
endif()
file(WRITE "${OUT}" "#line 1 \"${IN}\"\n${out}")
