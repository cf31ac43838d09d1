// CudaDriver's grants made apart from their mappings (Residency::Options::grant_apart): mappings
// without their access grant, the grant alone, and a stream's wait on a word of registered host
// memory that the granting thread counts up (cuStreamWaitValue64, GEQ). map_run is these two
// together.
#include <cuda.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "common/log.h"
#include "cuda_calls.h"
#include "cuda_driver.h"

namespace offload {

using cu::cu_ok;
using cu::CtxScope;
using cu::exec_api;

bool CudaDriver::map_run_ungranted(DevPtr va, const uint64_t* handles, const uint64_t* sizes, size_t n) {
  const cu::ExecApi* a = exec_api();
  CtxScope scope(a, context());
  if (!scope) return false;
  uint64_t off = 0;
  size_t i = 0;
  for (; i < n; off += sizes[i++])
    if (!cu_ok(a->map(va + off, sizes[i], 0, handles[i], 0), "cuMemMap")) break;
  if (i == n) return true;
  for (size_t j = 0, o = 0; j < i; o += sizes[j++]) cu_ok(a->unmap(va + o, sizes[j]), "cuMemUnmap");
  return false;
}

bool CudaDriver::grant(DevPtr va, uint64_t bytes) {
  const int dev = device();
  if (dev < 0) return false;
  const cu::ExecApi* a = exec_api();
  CtxScope scope(a, context());
  if (!scope) return false;
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = dev;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const bool closed = gate_close();
  const bool ok = cu_ok(a->set_access(va, bytes, &access, 1), "cuMemSetAccess");
  if (closed) gate_open();
  return ok;
}

std::atomic<uint64_t>* CudaDriver::grant_word() {
  std::call_once(word_once_, [this] {
    const cu::ExecApi* a = exec_api();
    const int dev = device();
    if (!a || dev < 0 || !a->wait_value64 || !a->host_register || !a->host_device_ptr || !a->device_attr) return;
    CtxScope scope(a, context());
    if (!scope) return;
    int can = 0;
    if (!cu_ok(a->device_attr(&can, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, dev), "cuDeviceGetAttribute") ||
        !can) {
      log().info("OFFLOAD_CAP_GRANT=apart: the device cannot wait on 64-bit values; grants stay with their mappings");
      return;
    }
    uint64_t dptr = 0;
    void* page = device_page(&dptr);
    if (!page) return;
    word_dev_ = dptr;
    word_ = new (page) std::atomic<uint64_t>(0);  // kept for the process's life: streams may wait on it
  });
  return word_;
}

void* CudaDriver::device_page(uint64_t* dev) {
  const cu::ExecApi* a = exec_api();
  void* page = std::aligned_alloc(4096, 4096);
  if (!page) return nullptr;
  std::memset(page, 0, 4096);
  CUdeviceptr dptr = 0;
  if (!cu_ok(a->host_register(page, 4096, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE),
             "cuMemHostRegister") ||
      !cu_ok(a->host_device_ptr(&dptr, page, 0), "cuMemHostGetDevicePointer")) {
    std::free(page);  // the registration, if made, goes with the process
    return nullptr;
  }
  *dev = dptr;
  return page;
}

bool CudaDriver::stream_wait_word(Stream s, uint64_t value) {
  if (!word_) return false;
  const cu::ExecApi* a = exec_api();
  CtxScope scope(a, context());
  return scope && cu_ok(a->wait_value64(reinterpret_cast<CUstream>(s), word_dev_, value, CU_STREAM_WAIT_VALUE_GEQ),
                        "cuStreamWaitValue64");
}

}  // namespace offload
