# SPDX-License-Identifier: BSD-3-Clause
# Finds NCCL (nccl.h, libnccl) and provides the target NCCL::nccl.
# Looks in NCCL_ROOT / NCCL_HOME and beside the CUDA toolkit.

find_package(CUDAToolkit QUIET)
set(_nccl_hints $ENV{NCCL_ROOT} $ENV{NCCL_HOME} ${NCCL_ROOT})
if(CUDAToolkit_FOUND)
  list(APPEND _nccl_hints "${CUDAToolkit_LIBRARY_ROOT}" "${CUDAToolkit_TARGET_DIR}")
endif()

find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY nccl HINTS ${_nccl_hints} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _v REGEX "#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*NCCL_${_part} +([0-9]+).*" "\\1" _n_${_part} "${_v}")
  endforeach()
  set(NCCL_VERSION "${_n_MAJOR}.${_n_MINOR}.${_n_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_INCLUDE_DIR NCCL_LIBRARY CUDAToolkit_FOUND
  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES CUDA::cudart)
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
