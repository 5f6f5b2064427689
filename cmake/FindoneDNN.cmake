# SPDX-License-Identifier: BSD-3-Clause
# Finds oneDNN (the CPU matrix products: bf16 on AMX / AVX512-BF16, fp32) and
# provides the target DNNL::dnnl, oneDNN_VERSION and oneDNN_FOUND.
#
# oneDNN's own CMake package (dnnl-config.cmake) is used where it can load.
# Debian 12's libdnnl-dev was built with an OpenCL GPU runtime, so its package
# does find_package(OpenCL REQUIRED) and stops the whole configure when the
# OpenCL headers (ocl-icd-opencl-dev, only "recommended") are absent. ndmini
# uses the CPU engine only: without OpenCL it finds the header and library
# itself (looking in oneDNN_ROOT / DNNL_ROOT and the usual prefixes).

find_package(OpenCL QUIET)
if(OpenCL_FOUND)
  find_package(dnnl CONFIG QUIET)
endif()

if(dnnl_FOUND AND TARGET DNNL::dnnl)
  get_target_property(oneDNN_INCLUDE_DIR DNNL::dnnl INTERFACE_INCLUDE_DIRECTORIES)
  set(oneDNN_LIBRARY DNNL::dnnl)
  set(oneDNN_VERSION ${dnnl_VERSION})
else()
  set(_dnnl_hints $ENV{oneDNN_ROOT} $ENV{DNNL_ROOT} ${oneDNN_ROOT} ${DNNL_ROOT})
  find_path(oneDNN_INCLUDE_DIR oneapi/dnnl/dnnl.hpp HINTS ${_dnnl_hints} PATH_SUFFIXES include)
  find_library(oneDNN_LIBRARY dnnl HINTS ${_dnnl_hints} PATH_SUFFIXES lib lib64)
  if(oneDNN_INCLUDE_DIR AND EXISTS "${oneDNN_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h")
    file(STRINGS "${oneDNN_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h" _v REGEX "#define DNNL_VERSION_(MAJOR|MINOR|PATCH) +[0-9]+")
    foreach(_part MAJOR MINOR PATCH)
      string(REGEX REPLACE ".*DNNL_VERSION_${_part} +([0-9]+).*" "\\1" _d_${_part} "${_v}")
    endforeach()
    set(oneDNN_VERSION "${_d_MAJOR}.${_d_MINOR}.${_d_PATCH}")
  endif()
  mark_as_advanced(oneDNN_INCLUDE_DIR oneDNN_LIBRARY)
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(oneDNN REQUIRED_VARS oneDNN_LIBRARY oneDNN_INCLUDE_DIR VERSION_VAR oneDNN_VERSION)

if(oneDNN_FOUND AND NOT TARGET DNNL::dnnl)
  add_library(DNNL::dnnl UNKNOWN IMPORTED)
  set_target_properties(DNNL::dnnl PROPERTIES
    IMPORTED_LOCATION "${oneDNN_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${oneDNN_INCLUDE_DIR}")
endif()
