# SPDX-License-Identifier: BSD-3-Clause
# Finds Kokkos and provides the target Kokkos::kokkos.
#
# A normal Kokkos install (4.x, 5.x, Spack) ships a working KokkosConfig.cmake:
# use it as is. Debian 12 packages Kokkos 3.4.01 inside Trilinos; its
# TriBITS-generated config has no usable Kokkos::kokkos target (the include
# folder it names does not exist), so we build the target from the headers
# under include/trilinos and the trilinos_kokkos* libraries instead.

find_package(Kokkos CONFIG QUIET NO_MODULE)

set(_ndmini_kokkos_config_ok FALSE)
if(Kokkos_FOUND AND TARGET Kokkos::kokkos)
  get_target_property(_inc Kokkos::kokkos INTERFACE_INCLUDE_DIRECTORIES)
  set(_ndmini_kokkos_config_ok TRUE)
  if(_inc)
    foreach(_dir IN LISTS _inc)
      if(NOT _dir MATCHES "\\$<" AND NOT EXISTS "${_dir}")
        set(_ndmini_kokkos_config_ok FALSE)
      endif()
    endforeach()
  endif()
endif()

if(_ndmini_kokkos_config_ok)
  include(FindPackageHandleStandardArgs)
  find_package_handle_standard_args(Kokkos CONFIG_MODE)
  set(NDMINI_KOKKOS_FLAVOUR "config package")
  return()
endif()

# Trilinos-packaged Kokkos (Debian 12): assemble the target by hand.
find_path(Kokkos_INCLUDE_DIR Kokkos_Core.hpp PATH_SUFFIXES trilinos kokkos)
find_library(Kokkos_CORE_LIBRARY NAMES kokkoscore trilinos_kokkoscore)
find_library(Kokkos_CONTAINERS_LIBRARY NAMES kokkoscontainers trilinos_kokkoscontainers)

if(Kokkos_INCLUDE_DIR AND EXISTS "${Kokkos_INCLUDE_DIR}/KokkosCore_config.h")
  file(STRINGS "${Kokkos_INCLUDE_DIR}/KokkosCore_config.h" _ver REGEX "#define KOKKOS_VERSION [0-9]+")
  string(REGEX REPLACE ".*KOKKOS_VERSION ([0-9]+).*" "\\1" _ver "${_ver}")
  if(_ver)
    math(EXPR _major "${_ver} / 10000")
    math(EXPR _minor "(${_ver} % 10000) / 100")
    math(EXPR _patch "${_ver} % 100")
    set(Kokkos_VERSION "${_major}.${_minor}.${_patch}")
  endif()
  file(STRINGS "${Kokkos_INCLUDE_DIR}/KokkosCore_config.h" _devs REGEX "#define KOKKOS_ENABLE_(SERIAL|OPENMP|CUDA|HIP|THREADS)$")
  set(Kokkos_DEVICES "")
  foreach(_d IN LISTS _devs)
    string(REGEX REPLACE ".*KOKKOS_ENABLE_([A-Z]+)" "\\1" _d "${_d}")
    list(APPEND Kokkos_DEVICES ${_d})
  endforeach()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Kokkos
  REQUIRED_VARS Kokkos_INCLUDE_DIR Kokkos_CORE_LIBRARY Kokkos_CONTAINERS_LIBRARY
  VERSION_VAR Kokkos_VERSION)

if(Kokkos_FOUND)
  if(NOT TARGET Kokkos::kokkos)
    add_library(Kokkos::kokkos INTERFACE IMPORTED)
  endif()
  # Overwrite (not append): a half-built target from the Trilinos config must not leak in.
  set_target_properties(Kokkos::kokkos PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${Kokkos_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${Kokkos_CONTAINERS_LIBRARY};${Kokkos_CORE_LIBRARY};${CMAKE_DL_LIBS}")
  set(NDMINI_KOKKOS_FLAVOUR "Trilinos package, target repaired")
endif()
mark_as_advanced(Kokkos_INCLUDE_DIR Kokkos_CORE_LIBRARY Kokkos_CONTAINERS_LIBRARY)
