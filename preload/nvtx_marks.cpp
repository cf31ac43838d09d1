#include "nvtx_marks.h"

#include <cuda.h>
#include <nvtx3/nvToolsExt.h>
#include <nvtx3/nvToolsExtCuda.h>

namespace offload::nvtx {
namespace {

// The domain and its two registered strings, made once: a registered string costs the tool
// no copy per range.
struct Names {
  nvtxDomainHandle_t domain = nullptr;
  nvtxStringHandle_t evict = nullptr, reload = nullptr;
  Names() {
    domain = nvtxDomainCreateA("liboffload");
    evict = nvtxDomainRegisterStringA(domain, "liboffload evict");
    reload = nvtxDomainRegisterStringA(domain, "liboffload reload");
  }
};
const Names& names() {
  static const Names n;
  return n;
}

}  // namespace

Range::Range(Move m, uint64_t bytes) {
  const Names& n = names();
  if (!n.domain) return;  // no tool attached
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.colorType = NVTX_COLOR_ARGB;
  a.color = m == Move::Evict ? 0xffd9822bu : 0xff2b7bd9u;
  a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
  a.message.registered = m == Move::Evict ? n.evict : n.reload;
  a.payloadType = NVTX_PAYLOAD_TYPE_UNSIGNED_INT64;
  a.payload.ullValue = bytes;
  open_ = nvtxDomainRangePushEx(n.domain, &a) >= 0;
}

Range::~Range() {
  if (open_) nvtxDomainRangePop(names().domain);
}

void name_stream(uint64_t stream, const char* name) {
  nvtxNameCuStreamA(reinterpret_cast<CUstream>(stream), name);
}

}  // namespace offload::nvtx
