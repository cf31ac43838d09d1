// Where libcupti is looked for, and in what order: a pure function of OFFLOAD_CUPTI_LIB, the
// CUDA runtime the process loaded and CUDA_HOME, shared by the shim (which loads the first
// candidate that opens) and `offloadctl doctor` (which says which one that would be).
//
// CUPTI of the loaded runtime's major version comes first: PyTorch's profiler loads the CUPTI
// of its own CUDA, and one process should not hold two. The other supported major follows.
// Places, for each major: the loader's search (the bare soname), beside libcudart (toolkits,
// conda, and cu13 wheels, which put both in nvidia/cu13/lib), cu12 wheels' own package
// (nvidia/cuda_runtime/lib beside nvidia/cuda_cupti/lib), CUDA_HOME, /usr/local/cuda.
#pragma once

#include <string>
#include <vector>

namespace offload {

// The CUPTI majors the shim reads records of, the default first.
inline constexpr int kCuptiMajors[] = {13, 12};

struct CuptiSearch {
  std::string hint;         // OFFLOAD_CUPTI_LIB: tried first ("" if unset)
  std::string cudart_path;  // the libcudart the process loaded, as the loader names it ("" if none)
  std::string cuda_home;    // CUDA_HOME ("" if unset)
};

// The major version in a shared library's file name: 12 for "libcudart.so.12" or
// ".../libcudart.so.12.4.127"; 0 when the name carries none ("libcudart.so").
int so_major(const std::string& path);

// The CUPTI major to try first: the loaded runtime's when supported, else the default.
int preferred_cupti_major(const CuptiSearch& s);

// The paths to try, in order, without duplicates. Bare sonames ("libcupti.so.12") are for the
// loader's search path; every other entry is absolute (or as the hint gave it).
std::vector<std::string> cupti_candidates(const CuptiSearch& s);

// The first candidate that names an existing regular file ("" if none). Bare sonames are
// skipped: only the loader knows where they resolve.
std::string first_present(const std::vector<std::string>& candidates);

}  // namespace offload
