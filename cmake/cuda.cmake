# The CUDA backend (src/backend/cuda: .c host code and .cu kernels) is
# built whenever nvcc is found, so CI compiles and links it even on machines
# without a GPU; -DCTRAIN_WITH_CUDA=OFF leaves it out. The objects go into
# libctrain; without a GPU (or driver) at run time, ct_device_open("cuda")
# fails with CT_ERR_NO_DEVICE and nothing else changes.
#
# cuDNN and NCCL are searched in, in order: CUDNN_ROOT / NCCL_ROOT (CMake or
# environment variables), the CUDA toolkit, system paths, and the
# nvidia-cudnn-cu* / nvidia-nccl-cu* Python wheels' layout
# (site-packages/nvidia/{cudnn,nccl}/{include,lib}, or nvidia/cu13/ as the
# CUDA 13 wheels lay out some packages) under CTRAIN_NVIDIA_WHEELS
# or the site-packages of the python3 on PATH.
set(CTRAIN_HAVE_CUDA OFF)
file(GLOB CTRAIN_CUDA_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/backend/cuda/*.cu
     ${PROJECT_SOURCE_DIR}/src/backend/cuda/*.c)
if(CTRAIN_WITH_CUDA AND CTRAIN_CUDA_SOURCES)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # Hopper (H100/H200) SASS plus compute_90 PTX only: one arch keeps nvcc
    # time small on the 2-core CI machine. Override with
    # -DCMAKE_CUDA_ARCHITECTURES=80;90 etc.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    # One runtime for everything: the shared cudart that cuBLASLt and cuDNN
    # also load.
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)

    set(ctrain_wheel_dirs "")
    if(DEFINED CTRAIN_NVIDIA_WHEELS)
      list(APPEND ctrain_wheel_dirs ${CTRAIN_NVIDIA_WHEELS})
    endif()
    find_program(CTRAIN_PY3 NAMES python3)
    if(CTRAIN_PY3)
      execute_process(COMMAND ${CTRAIN_PY3} -c "import site,sys; print(';'.join(site.getsitepackages()+[site.getusersitepackages()]))"
                      OUTPUT_VARIABLE ctrain_site OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      foreach(sp ${ctrain_site})
        list(APPEND ctrain_wheel_dirs ${sp}/nvidia)
      endforeach()
    endif()
    set(ctrain_cudnn_hints ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR})
    foreach(w ${ctrain_wheel_dirs})
      list(APPEND ctrain_cudnn_hints ${w}/cudnn ${w}/cu13)
    endforeach()
    find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${ctrain_cudnn_hints} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
    # The wheels ship libcudnn.so.9 without the unversioned link name.
    find_library(CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 HINTS ${ctrain_cudnn_hints}
                 PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)

    if(CUDNN_INCLUDE_DIR AND CUDNN_LIBRARY AND TARGET CUDA::cublasLt)
      set(CTRAIN_HAVE_CUDA ON)
      # A separate object library: the directory-wide -Wall -Wextra (and the
      # sanitizer flags) are host-compiler options nvcc does not take, so
      # this target's options are set here for each language.
      add_library(ctrain_cuda OBJECT ${CTRAIN_CUDA_SOURCES})
      set_property(TARGET ctrain_cuda PROPERTY COMPILE_OPTIONS "")
      target_compile_options(ctrain_cuda PRIVATE
        $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra>
        $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
      if(CTRAIN_SANITIZE)
        target_compile_options(ctrain_cuda PRIVATE $<$<COMPILE_LANGUAGE:C>:-fsanitize=address,undefined -fno-omit-frame-pointer>)
      endif()
      target_include_directories(ctrain_cuda PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src
                                 ${CUDNN_INCLUDE_DIR})
      # cuBLASLt is loaded when a CUDA device opens, not linked
      # (src/backend/cuda/cuda_lt.h: linking it costs every process ~150 MB
      # of RSS); the directory found here is the loader's last resort.
      get_filename_component(ctrain_cublaslt_dir "${CUDA_cublasLt_LIBRARY}" DIRECTORY)
      target_compile_definitions(ctrain_cuda PRIVATE CTRAIN_CUBLASLT_DIR="${ctrain_cublaslt_dir}")
      target_link_libraries(ctrain_cuda PRIVATE CUDA::cudart)
      set_target_properties(ctrain_cuda PROPERTIES POSITION_INDEPENDENT_CODE ON)
      target_sources(ctrain PRIVATE $<TARGET_OBJECTS:ctrain_cuda>)
      # ctrain was created before CUDA was enabled, so it missed the default.
      set_target_properties(ctrain PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
      target_compile_definitions(ctrain_core PRIVATE CTRAIN_HAVE_CUDA)
      # Runtime API only (never CUDA::cuda_driver): the library loads
      # without libcuda.so and reports "no CUDA driver" when asked for a GPU.
      target_link_libraries(ctrain PUBLIC CUDA::cudart ${CUDNN_LIBRARY} ${CMAKE_DL_LIBS})
      message(STATUS "ctrain: cuDNN ${CUDNN_LIBRARY}, CUDA archs ${CMAKE_CUDA_ARCHITECTURES}")
    else()
      message(WARNING "ctrain: nvcc found but cuDNN (cudnn.h / libcudnn) or cuBLASLt not: CUDA backend disabled. "
                      "Set CUDNN_ROOT to the directory holding include/cudnn.h and lib/libcudnn.so.")
    endif()

    # NCCL's header, for the GPU communicator (cuda_coll.c); the library
    # itself is loaded at run time by a process that trains over several
    # GPUs (libnccl.so.2, or CTRAIN_NCCL_PATH), never linked.
    set(ctrain_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR})
    foreach(w ${ctrain_wheel_dirs})
      list(APPEND ctrain_nccl_hints ${w}/nccl ${w}/cu13)
    endforeach()
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${ctrain_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
    if(CTRAIN_HAVE_CUDA AND NCCL_INCLUDE_DIR)
      target_include_directories(ctrain_cuda PRIVATE ${NCCL_INCLUDE_DIR})
      target_compile_definitions(ctrain_cuda PRIVATE CTRAIN_HAVE_NCCL)
      message(STATUS "ctrain: NCCL header ${NCCL_INCLUDE_DIR}: DDP over GPUs built (libnccl.so.2 loaded at run time)")
    else()
      message(STATUS "ctrain: nccl.h not found (NCCL_ROOT): DDP over GPUs left out")
    endif()
  endif()
endif()
message(STATUS "ctrain: CUDA backend ${CTRAIN_HAVE_CUDA}")
