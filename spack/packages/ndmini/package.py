# SPDX-License-Identifier: BSD-3-Clause
import os

from spack.package import *


class Ndmini(CMakePackage, CudaPackage):
    """GPT-2 training mini-app that lays N-dimensional parallelism (data, fully
    sharded data, tensor, context, pipeline) onto an MPI Cartesian communicator,
    with kernels in Kokkos, GEMMs in Kokkos Kernels (BLAS on the host, cuBLAS on
    CUDA), GPU collectives in NCCL and sharded checkpoints in parallel HDF5.

    The project has no public repository yet: `git` below is a placeholder. Point
    it at your clone (packages.yaml: `packages: ndmini: package_attributes: git:
    <url>`) or build a checkout with `spack develop --path <checkout> ndmini@main`.
    """

    homepage = "https://example.invalid/ndmini"  # placeholder: no public site yet
    git = "https://example.invalid/ndmini/ndmini.git"  # placeholder: no public repository yet

    # Placeholder handle: replace with the GitHub handles of the project's maintainers.
    maintainers("ndmini-maintainers")

    license("BSD-3-Clause")

    version("main", branch="main")
    # A release X.Y.Z is the commit of main tagged vX.Y.Z, whose CMakeLists.txt says
    # project(ndmini VERSION X.Y.Z). 0.1.0 is pinned by commit (to be tagged v0.1.0).
    version("0.1.0", commit="f9658605c6168e286e1d1db6ebee1125e01c40fc")

    # Kokkos' own device variants, same names and meaning: the backends ndmini's kernels
    # run on. Kokkos makes the most capable enabled one the default execution space
    # (Cuda, then OpenMP, then Serial), which is where ndmini runs.
    variant("serial", default=True, description="Kokkos Serial backend (one thread per rank)")
    variant("openmp", default=False, description="Kokkos OpenMP backend (threads in each rank)")
    variant("nccl", default=False, description="NCCL backend for GPU collectives (needs +cuda)")
    variant("benchmarks", default=False, description="Build the Google Benchmark programs")
    variant(
        "onednn",
        default=False,
        description="bf16 host matrix products through oneDNN (AMX, AVX512-BF16)",
    )

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

    # Exactly the Kokkos versions ndmini's ctest has passed on: 3.4.01 (Debian 12's Trilinos
    # package, as an external) and 4.6.01 (built by Spack, Serial and OpenMP). Add a version
    # here once `spack install --test=root` has passed on it.
    depends_on("kokkos@=3.4.01,=4.6.01")
    depends_on("kokkos-kernels@=3.4.01,=4.6.01")
    # Kokkos Kernels X.Y.Z goes with Kokkos X.Y.Z. The kokkos-kernels recipe pins that for what
    # Spack builds; externals carry no dependency edges, so ndmini states it too.
    for _kokkos, _other in (("4.6.01", "3.4.01"), ("3.4.01", "4.6.01")):
        conflicts(
            f"^kokkos@={_kokkos}",
            when=f"^kokkos-kernels@={_other}",
            msg=f"Kokkos {_kokkos} needs Kokkos Kernels {_kokkos}",
        )

    depends_on("kokkos+serial", when="+serial")
    depends_on("kokkos+openmp", when="+openmp")
    depends_on("kokkos-kernels+openmp", when="+openmp")
    # No Kokkos Kernels ETI is asked for: ndmini calls only GEMM, on float LayoutRight views,
    # which goes to the BLAS (cuBLAS) library through the TPL whatever the ETI; pre-built
    # kernels for other routines and scalars would only lengthen the Kokkos Kernels build.
    conflicts("~serial ~openmp", msg="ndmini needs a Kokkos host backend: +serial or +openmp")

    # Host matrix products go through Kokkos Kernels to BLAS; on CUDA to cuBLAS.
    depends_on("kokkos-kernels+blas", when="~cuda")
    depends_on("kokkos~cuda", when="~cuda")

    conflicts("cuda_arch=none", when="+cuda", msg="+cuda needs cuda_arch=<compute capability>")
    # Device KOKKOS_LAMBDA needs the CUDA lambda support of Kokkos 4 (always on in 5).
    conflicts("+cuda", when="^kokkos@:3", msg="the CUDA build needs Kokkos 4 or newer")
    # Older commits compile src/config (toml++) with nvcc, which fails.
    conflicts("+cuda", when="@:0.1.0", msg="the CUDA build needs ndmini after 0.1.0")
    for _arch in CudaPackage.cuda_arch_values:
        with when(f"+cuda cuda_arch={_arch}"):
            depends_on(f"kokkos+cuda+cuda_lambda+wrapper cuda_arch={_arch}")
            depends_on(f"kokkos-kernels+cuda+cublas cuda_arch={_arch}")
            depends_on(f"nccl+cuda cuda_arch={_arch}", when="+nccl")

    # ndmini compiles with Kokkos' nvcc_wrapper (CMAKE_CXX_COMPILER below). kokkos+wrapper takes
    # kokkos-nvcc-wrapper at any version, and the concretizer chose the newest (5.1.1) next to
    # Kokkos 4.6.01: pin it to the Kokkos version (one line per Kokkos allowed with +cuda; 4.6.01
    # is the only one). Spack's kokkos@4.6.01 conflicts with cuda@13 (CUDA 13 needs Kokkos 4.7.1),
    # so +cuda builds with a CUDA 12 toolkit (cuda@12.9 as concretized).
    depends_on("kokkos-nvcc-wrapper@=4.6.01", type="build", when="+cuda ^kokkos@=4.6.01")

    conflicts("+nccl", when="~cuda", msg="NCCL collectives need the CUDA build (+cuda)")

    # ndmini's oneDNN layer speaks the 2.x API (Debian 12 ships 2.6.3; Spack builds 2.7.3).
    depends_on("onednn@2.6:2", when="+onednn")
    conflicts("+onednn", when="+cuda", msg="oneDNN multiplies host memory; the CUDA build uses cuBLAS")

    sanity_check_is_file = [join_path("bin", "ndmini")]

    def cmake_args(self):
        spec = self.spec
        args = [
            # Spack picks the target (target=...): no -march=native in a Spack build.
            self.define("NDMINI_ENABLE_NATIVE", False),
            self.define("NDMINI_ENABLE_TESTS", self.run_tests),
            self.define("BUILD_TESTING", self.run_tests),
            self.define_from_variant("NDMINI_ENABLE_BENCHMARKS", "benchmarks"),
            # ON or OFF, never AUTO: a Spack build must not pick up whatever NCCL is lying around
            self.define_from_variant("NDMINI_ENABLE_NCCL", "nccl"),
            # ON or OFF, never AUTO, for the same reason
            self.define_from_variant("NDMINI_ENABLE_ONEDNN", "onednn"),
            # the library is not installed, so the installed executable must link it statically
            self.define("BUILD_SHARED_LIBS", False),
            # The compiler Kokkos was built with (nvcc_wrapper with +cuda); ndmini passes
            # its host-only sources (the deck reader) through to the host compiler.
            self.define("CMAKE_CXX_COMPILER", self["kokkos"].kokkos_cxx),
            self.define("MPI_C_COMPILER", spec["mpi"].mpicc),
            self.define("MPI_CXX_COMPILER", spec["mpi"].mpicxx),
        ]
        if spec.satisfies("+cuda"):
            args.append(self.define("CUDAToolkit_ROOT", spec["cuda"].prefix))
        if spec.satisfies("+onednn"):
            # cmake/FindoneDNN.cmake looks there first
            args.append(self.define("oneDNN_ROOT", spec["onednn"].prefix))
        if spec.satisfies("+nccl"):
            # cmake/FindNCCL.cmake looks there first
            args.append(self.define("NCCL_ROOT", spec["nccl"].prefix))
        return args

    def check(self):
        """Run the CTest suite in the build tree (``spack install --test=root``).

        The MPI tests launch themselves through the mpiexec that CMake found. Tests
        labelled ``gpu`` need a device; those labelled ``large`` run 8 ranks and are
        left out on a node with fewer cores (oversubscribed, they crawl); ``fault_long``
        (minutes of random kills) and ``perf`` (timings against a stored baseline) are
        never run here."""
        ctest = Executable(self.spec["cmake"].prefix.bin.ctest)
        skip = ["fault_long", "perf"] + ([] if self.spec.satisfies("+cuda") else ["gpu"])
        if len(os.sched_getaffinity(0)) < 8:
            skip.append("large")
        args = ["--output-on-failure"]
        if skip:
            args.extend(["--label-exclude", "^(" + "|".join(skip) + ")$"])
        with working_dir(self.build_directory):
            ctest(*args)
