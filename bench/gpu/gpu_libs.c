/* SPDX-License-Identifier: BSD-3-Clause
 * The libraries a GPU bundle does not carry (bench/gpu/bundle.sh): cuBLAS, cuBLASLt and NCCL come
 * from the GPU machine (the CUDA toolkit's lib64, or pip's nvidia/<name>/lib folders). This finds
 * each one, prints where it was found and its version, and compares the version with the one the
 * bundle was built with. Plain C with dlopen and the libraries' own version calls (none needs a GPU),
 * so it runs before anything that links them and builds without the CUDA headers.
 *
 * Usage: gpu_libs [--expect NAME=VERSION]... [--only-dirs] [DIR...]
 *          looks in each DIR first (in order), then where the dynamic loader looks (unless --only-dirs);
 *          NAME is cublas, cublasLt or nccl; VERSION is MAJOR.MINOR.PATCH.
 *        gpu_libs --devices [DIR...]
 *          the number of CUDA devices, through libcudart's cudaGetDeviceCount (exit 77 when none).
 * Exit status: 0 every library found, with the major version it was built with (another minor or
 * patch is reported, not fatal); 2 a library missing, unloadable, or of another major version
 * (the message says which and where it looked); 77 (--devices) no CUDA device. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { kMissing = 2, kNoDevice = 77, kMaxDirs = 64 };

struct Library {
  const char* name;   /* as --expect names it */
  const char* soname; /* the file the binaries' DT_NEEDED names */
  const char* expect; /* MAJOR.MINOR.PATCH from --expect, or NULL */
  char version[32];
  char path[4096];
};

static const char* dirs[kMaxDirs];
static int ndirs = 0;
static int only_dirs = 0;

/* open_library: the first DIR/soname that loads, else the loader's own search; NULL when none. */
static void* open_library(const char* soname, char* path, size_t path_size) {
  char candidate[4096];
  for (int i = 0; i < ndirs; ++i) {
    snprintf(candidate, sizeof candidate, "%s/%s", dirs[i], soname);
    void* h = dlopen(candidate, RTLD_NOW | RTLD_GLOBAL);
    if (h) {
      snprintf(path, path_size, "%s", candidate);
      return h;
    }
  }
  if (only_dirs) return NULL;
  void* h = dlopen(soname, RTLD_NOW | RTLD_GLOBAL);
  if (h) {
    struct link_map* map = NULL;
    if (dlinfo(h, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name) {
      snprintf(path, path_size, "%s", map->l_name);
    } else {
      snprintf(path, path_size, "%s (the loader's search)", soname);
    }
  }
  return h;
}

static void print_search(const char* soname) {
  fprintf(stderr, "gpu_libs: %s not found; looked in:", soname);
  for (int i = 0; i < ndirs; ++i) fprintf(stderr, " %s", dirs[i]);
  if (!only_dirs)
    fprintf(stderr, "%sthe loader's default search (LD_LIBRARY_PATH, ld.so.cache)", ndirs ? " and " : " ");
  fprintf(stderr, "\n");
}

/* version_of: the library's version as MAJOR.MINOR.PATCH, from its own query; 0 on success. */
static int version_of(struct Library* lib, void* h) {
  if (strcmp(lib->name, "cublas") == 0) {
    /* cublasGetProperty(libraryPropertyType, int*): MAJOR_VERSION 0, MINOR_VERSION 1, PATCH_LEVEL 2. */
    int (*get)(int, int*) = (int (*)(int, int*))dlsym(h, "cublasGetProperty");
    int v[3] = {0, 0, 0};
    if (!get) return 1;
    for (int i = 0; i < 3; ++i)
      if (get(i, &v[i]) != 0) return 1;
    snprintf(lib->version, sizeof lib->version, "%d.%d.%d", v[0], v[1], v[2]);
  } else if (strcmp(lib->name, "cublasLt") == 0) {
    /* cublasLtGetVersion(): MAJOR * 10000 + MINOR * 100 + PATCH. */
    size_t (*get)(void) = (size_t(*)(void))dlsym(h, "cublasLtGetVersion");
    if (!get) return 1;
    size_t v = get();
    snprintf(lib->version, sizeof lib->version, "%zu.%zu.%zu", v / 10000, v / 100 % 100, v % 100);
  } else {
    /* ncclGetVersion(int*): MAJOR * 10000 + MINOR * 100 + PATCH since NCCL 2.9. */
    int (*get)(int*) = (int (*)(int*))dlsym(h, "ncclGetVersion");
    int v = 0;
    if (!get || get(&v) != 0) return 1;
    if (v >= 10000) {
      snprintf(lib->version, sizeof lib->version, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    } else {
      snprintf(lib->version, sizeof lib->version, "%d.%d.%d", v / 1000, v / 100 % 10, v % 100);
    }
  }
  return 0;
}

static int major_of(const char* version) { return atoi(version); }

static int count_devices(void) {
  char path[4096] = "";
  /* Without the driver, the runtime's answer ("driver version is insufficient") misleads. */
  if (!dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL)) {
    printf("gpu_libs: no CUDA device: no NVIDIA driver (libcuda.so.1: %s)\n", dlerror());
    return kNoDevice;
  }
  void* h = open_library("libcudart.so.13", path, sizeof path);
  if (!h) {
    print_search("libcudart.so.13");
    return kMissing;
  }
  int (*count)(int*) = (int (*)(int*))dlsym(h, "cudaGetDeviceCount");
  const char* (*error_string)(int) = (const char* (*)(int))dlsym(h, "cudaGetErrorString");
  int n = 0;
  int rc = count ? count(&n) : -1;
  if (rc != 0) {
    printf("gpu_libs: no CUDA device: cudaGetDeviceCount failed (%s; %s)\n",
           rc < 0 ? "no such symbol" : (error_string ? error_string(rc) : "error"), path);
    return kNoDevice;
  }
  printf("gpu_libs: %d CUDA device(s) (cudaGetDeviceCount, %s)\n", n, path);
  return n > 0 ? 0 : kNoDevice;
}

int main(int argc, char** argv) {
  struct Library libs[] = {
      {"cublas", "libcublas.so.13", NULL, "", ""},
      {"cublasLt", "libcublasLt.so.13", NULL, "", ""},
      {"nccl", "libnccl.so.2", NULL, "", ""},
  };
  const int nlibs = (int)(sizeof libs / sizeof libs[0]);
  int devices = 0;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--devices") == 0) {
      devices = 1;
    } else if (strcmp(argv[i], "--only-dirs") == 0) {
      only_dirs = 1;
    } else if (strcmp(argv[i], "--expect") == 0 && i + 1 < argc) {
      const char* spec = argv[++i];
      const char* eq = strchr(spec, '=');
      int known = 0;
      for (int j = 0; eq && j < nlibs; ++j) {
        if (strlen(libs[j].name) == (size_t)(eq - spec) && strncmp(spec, libs[j].name, (size_t)(eq - spec)) == 0) {
          libs[j].expect = eq + 1;
          known = 1;
        }
      }
      if (!known) {
        fprintf(stderr, "gpu_libs: --expect takes cublas=V, cublasLt=V or nccl=V (got %s)\n", spec);
        return kMissing;
      }
    } else if (strcmp(argv[i], "--help") == 0) {
      printf(
          "usage: gpu_libs [--expect NAME=VERSION]... [--only-dirs] [DIR...]\n"
          "       gpu_libs --devices [DIR...]\n");
      return 0;
    } else if (argv[i][0] == '-') {
      fprintf(stderr, "gpu_libs: unknown option %s (see --help)\n", argv[i]);
      return kMissing;
    } else if (ndirs < kMaxDirs) {
      dirs[ndirs++] = argv[i];
    }
  }
  if (devices) return count_devices();

  int status = 0;
  for (int j = 0; j < nlibs; ++j) {
    struct Library* lib = &libs[j];
    void* h = open_library(lib->soname, lib->path, sizeof lib->path);
    if (!h) {
      print_search(lib->soname);
      fprintf(stderr, "gpu_libs: (last loader error: %s)\n", dlerror());
      status = kMissing;
      continue;
    }
    if (version_of(lib, h) != 0) {
      fprintf(stderr, "gpu_libs: %s at %s: its version query failed\n", lib->soname, lib->path);
      status = kMissing;
      continue;
    }
    printf("gpu_libs: %-9s %-8s %s", lib->name, lib->version, lib->path);
    if (lib->expect && strcmp(lib->expect, lib->version) != 0) {
      if (major_of(lib->expect) != major_of(lib->version)) {
        printf("  MAJOR VERSION DIFFERS: the bundle was built with %s\n", lib->expect);
        status = kMissing;
      } else {
        printf("  (the bundle was built with %s: same major version, used as found)\n", lib->expect);
      }
    } else {
      printf("%s\n", lib->expect ? "  (as built)" : "");
    }
  }
  if (status != 0) {
    fprintf(stderr,
            "gpu_libs: cuBLAS, cuBLASLt and NCCL must come from this machine: the CUDA toolkit's lib64 or "
            "pip's nvidia-cublas and nvidia-nccl-cu13 (nvidia/*/lib); set NDMINI_GPU_LIB_PATH to their folder\n");
  }
  return status;
}
