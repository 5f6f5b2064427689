# SPDX-License-Identifier: BSD-3-Clause
# Finds Kokkos Kernels and provides the target Kokkos::kokkoskernels.
#
# 4.x installs export Kokkos::kokkoskernels from KokkosKernelsConfig.cmake.
# The Trilinos-packaged 3.4 (Debian 12) only sets variables, so we build the
# target from its header folder, its library and the BLAS it was built against.

find_package(KokkosKernels CONFIG QUIET NO_MODULE)
if(KokkosKernels_FOUND AND TARGET Kokkos::kokkoskernels)
  include(FindPackageHandleStandardArgs)
  find_package_handle_standard_args(KokkosKernels CONFIG_MODE)
  return()
endif()

find_path(KokkosKernels_INCLUDE_DIR KokkosBlas3_gemm.hpp PATH_SUFFIXES trilinos kokkos-kernels)
find_library(KokkosKernels_LIBRARY NAMES kokkoskernels trilinos_kokkoskernels)
find_package(BLAS QUIET)

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(KokkosKernels
  REQUIRED_VARS KokkosKernels_INCLUDE_DIR KokkosKernels_LIBRARY BLAS_FOUND)

if(KokkosKernels_FOUND AND NOT TARGET Kokkos::kokkoskernels)
  add_library(Kokkos::kokkoskernels INTERFACE IMPORTED)
  set_target_properties(Kokkos::kokkoskernels PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${KokkosKernels_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${KokkosKernels_LIBRARY};Kokkos::kokkos;${BLAS_LIBRARIES}")
endif()
mark_as_advanced(KokkosKernels_INCLUDE_DIR KokkosKernels_LIBRARY)
