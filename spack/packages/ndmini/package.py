# SPDX-License-Identifier: BSD-3-Clause
from spack.package import *


class Ndmini(CMakePackage, CudaPackage):
    """GPT-2 training mini-app that lays N-dimensional parallelism (data, fully
    sharded data, tensor, context, pipeline) onto an MPI Cartesian communicator,
    with kernels in Kokkos, GEMMs in Kokkos Kernels, GPU collectives in NCCL and
    sharded checkpoints in parallel HDF5.

    There is no public repository or release yet: the git URL is a placeholder.
    Build a checkout in an environment with 'spack develop --path <checkout>
    ndmini@main', or set git to your clone under 'packages: ndmini:
    package_attributes:' in packages.yaml.
    """

    homepage = "https://example.invalid/ndmini"  # placeholder: no public site yet
    git = "https://example.invalid/ndmini/ndmini.git"  # placeholder: no public repository yet

    license("BSD-3-Clause")

    version("main", branch="main")

    variant("openmp", default=False, description="Use the Kokkos OpenMP host backend")
    variant("nccl", default=False, description="NCCL backend for GPU collectives (needs +cuda)")
    variant("benchmarks", default=False, description="Build the Google Benchmark programs")

    depends_on("c", type="build")  # MPI's C component
    depends_on("cxx", type="build")
    depends_on("cmake@3.20:", type="build")

    depends_on("mpi")
    depends_on("hdf5+mpi")  # parallel HDF5: configure stops on a serial one
    depends_on("tomlplusplus")
    depends_on("cli11")
    depends_on("nlohmann-json@3:")
    depends_on("googletest", type="test")
    depends_on("benchmark", type=("build", "link"), when="+benchmarks")

    depends_on("kokkos@3.4:")
    depends_on("kokkos-kernels@3.4:")
    # Kokkos Kernels X.Y works only with Kokkos X.Y. The kokkos-kernels recipe pins that
    # for what Spack builds, but externals (e.g. Debian's Trilinos-packaged 3.4.01) carry
    # no dependency edges, so ndmini states the match for every series it knows.
    for _series in "3.4 3.5 3.6 3.7 4.0 4.1 4.2 4.3 4.4 4.5 4.6 4.7 5.0 5.1".split():
        _major, _minor = (int(_x) for _x in _series.split("."))
        _older = f":{_major}.{_minor - 1}" if _minor else f":{_major - 1}"
        conflicts(
            f"^kokkos-kernels@{_older},{_major}.{_minor + 1}:",
            when=f"^kokkos@{_series}",
            msg=f"Kokkos {_series} needs Kokkos Kernels {_series}",
        )

    depends_on("kokkos+openmp", when="+openmp")
    depends_on("kokkos-kernels+openmp", when="+openmp")
    depends_on("kokkos~cuda", when="~cuda")  # a CUDA Kokkos would need nvcc_wrapper here too

    conflicts("cuda_arch=none", when="+cuda", msg="+cuda needs cuda_arch=<compute capability>")
    # Device KOKKOS_LAMBDA needs kokkos+cuda_lambda: kokkos-kernels@4+cuda requires it and
    # Kokkos 5 always has it; Kokkos 3 with CUDA is not a supported combination.
    conflicts("+cuda", when="^kokkos@:3", msg="the CUDA build needs Kokkos 4 or newer")
    for _arch in CudaPackage.cuda_arch_values:
        with when(f"+cuda cuda_arch={_arch}"):
            depends_on(f"kokkos+cuda+wrapper cuda_arch={_arch}")
            depends_on(f"kokkos-kernels+cuda+cublas cuda_arch={_arch}")  # GEMM in cuBLAS
            depends_on(f"nccl+cuda cuda_arch={_arch}", when="+nccl")

    conflicts("+nccl", when="~cuda", msg="NCCL collectives need the CUDA build (+cuda)")

    sanity_check_is_file = [join_path("bin", "ndmini")]

    def cmake_args(self):
        spec = self.spec
        args = [
            self.define("NDMINI_ENABLE_TESTS", self.run_tests),
            self.define("BUILD_TESTING", self.run_tests),
            self.define_from_variant("NDMINI_ENABLE_BENCHMARKS", "benchmarks"),
            # ON or OFF, never AUTO: a Spack build must not pick up whatever NCCL is lying around
            self.define("NDMINI_ENABLE_NCCL", "ON" if spec.satisfies("+nccl") else "OFF"),
            # the library is not installed, so the installed executable must link it statically
            self.define("BUILD_SHARED_LIBS", False),
            self.define("MPI_C_COMPILER", spec["mpi"].mpicc),
            self.define("MPI_CXX_COMPILER", spec["mpi"].mpicxx),
        ]
        if spec.satisfies("+cuda"):
            # the same compiler Kokkos was built with: nvcc_wrapper around the host compiler
            wrapper = join_path(spec["kokkos-nvcc-wrapper"].prefix.bin, "nvcc_wrapper")
            args.append(self.define("CMAKE_CXX_COMPILER", wrapper))
            args.append(self.define("CUDAToolkit_ROOT", spec["cuda"].prefix))
        if spec.satisfies("+nccl"):
            # cmake/FindNCCL.cmake looks there first
            args.append(self.define("NCCL_ROOT", spec["nccl"].prefix))
        return args

    def check(self):
        """Run the CTest suite in the build tree (``spack install --test=root``).

        The MPI tests launch themselves through the mpiexec that CMake found."""
        ctest = Executable(self.spec["cmake"].prefix.bin.ctest)
        args = ["--output-on-failure"]
        if self.spec.satisfies("~cuda"):
            args.extend(["--label-exclude", "gpu"])  # tests labelled gpu need a device
        with working_dir(self.build_directory):
            ctest(*args)
