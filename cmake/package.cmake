# What `cmake --install` (and `make install PREFIX=...`) puts in place:
# the ctrain command, libctrain.so (soname libctrain.so.MAJOR) and a
# static libctrain.a, the headers, ctrain.pc for pkg-config and a CMake
# package (find_package(ctrain) -> ctrain::ctrain).
#
# Both installed libraries export the public API's ct_ names only: the
# shared one through a version script (cmake/ctrain.map), the static one by
# linking every object into one (ld -r) and making every other global
# local (objcopy), so a program's own cpu_add or cuda_open never meets
# ours. The tests, benchmarks and the command link the build's internal
# archive (target ctrain), which keeps the internal names they test.
include(GNUInstallDirs)

# One compile serves both archives and the shared library; without
# semantic interposition the calls inside the library stay direct.
set_target_properties(ctrain_core PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_compile_options(ctrain_core PRIVATE $<$<C_COMPILER_ID:GNU>:-fno-semantic-interposition>)

set(ctrain_objects $<TARGET_OBJECTS:ctrain_core>)
if(CTRAIN_HAVE_CUDA)
  list(APPEND ctrain_objects $<TARGET_OBJECTS:ctrain_cuda>)
endif()

add_library(ctrain_shared SHARED ${ctrain_objects})
set_target_properties(ctrain_shared PROPERTIES OUTPUT_NAME ctrain EXPORT_NAME ctrain VERSION ${PROJECT_VERSION}
                      SOVERSION ${PROJECT_VERSION_MAJOR} LINKER_LANGUAGE C
                      LINK_DEPENDS ${PROJECT_SOURCE_DIR}/cmake/ctrain.map)
target_link_options(ctrain_shared PRIVATE -Wl,--version-script=${PROJECT_SOURCE_DIR}/cmake/ctrain.map
                    -Wl,--no-undefined)
# The dependencies ctrain_core carries, privately: a user of the .so links
# -lctrain alone.
target_link_libraries(ctrain_shared PRIVATE $<TARGET_PROPERTY:ctrain_core,INTERFACE_LINK_LIBRARIES>)
if(CTRAIN_HAVE_CUDA)
  target_link_libraries(ctrain_shared PRIVATE CUDA::cudart ${CUDNN_LIBRARY} ${CMAKE_DL_LIBS})
endif()
target_include_directories(ctrain_shared INTERFACE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                           $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

set(ctrain_public_dir ${PROJECT_BINARY_DIR}/public)
set(ctrain_public_a ${ctrain_public_dir}/libctrain.a)
add_custom_command(OUTPUT ${ctrain_public_a}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${ctrain_public_dir}
  COMMAND ${CMAKE_LINKER} -r -o ${ctrain_public_dir}/ctrain.o ${ctrain_objects}
  COMMAND ${CMAKE_OBJCOPY} --wildcard --keep-global-symbol=ct_* ${ctrain_public_dir}/ctrain.o
  COMMAND ${CMAKE_COMMAND} -E rm -f ${ctrain_public_a}
  COMMAND ${CMAKE_AR} rcs ${ctrain_public_a} ${ctrain_public_dir}/ctrain.o
  DEPENDS ${ctrain_objects}
  COMMAND_EXPAND_LISTS VERBATIM
  COMMENT "libctrain.a for installing: one object, ct_ names global")
add_custom_target(ctrain_public_static ALL DEPENDS ${ctrain_public_a})
# The objects' own targets first: a file dependency alone does not order
# a parallel build.
add_dependencies(ctrain_public_static ctrain_core)
if(CTRAIN_HAVE_CUDA)
  add_dependencies(ctrain_public_static ctrain_cuda)
endif()

# Libs.private of ctrain.pc: what a static link against libctrain.a needs.
set(CTRAIN_PC_PRIVATE "-lz -lm -lpthread ${OpenMP_C_FLAGS}")
if(CTRAIN_HAVE_DNNL)
  string(APPEND CTRAIN_PC_PRIVATE " -ldnnl")
endif()
if(PNG_FOUND)
  string(APPEND CTRAIN_PC_PRIVATE " -lpng")
endif()
if(JPEG_FOUND)
  string(APPEND CTRAIN_PC_PRIVATE " -ljpeg")
endif()
if(MPI_C_FOUND)
  foreach(l ${MPI_C_LIBRARIES})
    string(APPEND CTRAIN_PC_PRIVATE " ${l}")
  endforeach()
endif()
if(CTRAIN_HAVE_CUDA)
  string(APPEND CTRAIN_PC_PRIVATE " ${CUDA_cudart_LIBRARY} ${CUDNN_LIBRARY} -ldl -lstdc++")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/ctrain.pc.in ${PROJECT_BINARY_DIR}/ctrain.pc @ONLY)

include(CMakePackageConfigHelpers)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ctrainConfigVersion.cmake COMPATIBILITY SameMajorVersion)

install(TARGETS ctrain_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS ctrain_shared EXPORT ctrainTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${ctrain_public_a} DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ctrain DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_BINARY_DIR}/ctrain.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
install(EXPORT ctrainTargets NAMESPACE ctrain:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ctrain)
install(FILES ${PROJECT_SOURCE_DIR}/cmake/ctrainConfig.cmake.in DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ctrain
        RENAME ctrainConfig.cmake)
install(FILES ${PROJECT_BINARY_DIR}/ctrainConfigVersion.cmake DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ctrain)

# `cpack -G DEB` (from the build directory): a .deb of the same install.
# Its Depends name the Debian packages of the libraries this build found;
# a build with the CUDA backend also needs the CUDA runtime and cuDNN of
# the toolkit it was built with, which Debian does not package.
set(CPACK_PACKAGE_NAME ctrain)
set(CPACK_PACKAGE_VENDOR "ctrain")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Neural-network training in C on CPUs and NVIDIA GPUs")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "ctrain developers <ctrain@localhost>")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(ctrain_deb_depends "libc6, libgomp1, zlib1g")
if(CTRAIN_HAVE_DNNL)
  string(APPEND ctrain_deb_depends ", libdnnl2")
endif()
if(PNG_FOUND)
  string(APPEND ctrain_deb_depends ", libpng16-16")
endif()
if(JPEG_FOUND)
  string(APPEND ctrain_deb_depends ", libjpeg62-turbo")
endif()
if(MPI_C_FOUND)
  string(APPEND ctrain_deb_depends ", libopenmpi3")
endif()
set(CPACK_DEBIAN_PACKAGE_DEPENDS ${ctrain_deb_depends})
include(CPack)
