// An NVTX tool for the tests (NVTX_INJECTION64_PATH names it): records the domains, registered
// strings, ranges (message and payload) and stream names it is given, for fake_nvtx_log().
#include <nvtx3/nvToolsExt.h>
#include <nvtx3/nvToolsExtCuda.h>

#include <cstdint>
#include <mutex>
#include <string>

namespace {
std::mutex mu;
std::string log_text;
void note(const std::string& s) {
  std::lock_guard l(mu);
  log_text += s + "\n";
}
int depth = 0;

nvtxDomainHandle_t domain_create(const char* name) {
  note(std::string("domain ") + name);
  return reinterpret_cast<nvtxDomainHandle_t>(new std::string(name));
}
nvtxStringHandle_t register_string(nvtxDomainHandle_t, const char* s) {
  return reinterpret_cast<nvtxStringHandle_t>(new std::string(s));
}
int range_push_ex(nvtxDomainHandle_t d, const nvtxEventAttributes_t* a) {
  std::string msg = a->messageType == NVTX_MESSAGE_TYPE_REGISTERED
                        ? *reinterpret_cast<const std::string*>(a->message.registered)
                        : "?";
  std::string payload = a->payloadType == NVTX_PAYLOAD_TYPE_UNSIGNED_INT64 ? std::to_string(a->payload.ullValue) : "-";
  note("push " + *reinterpret_cast<const std::string*>(d) + " " + msg + " " + payload);
  return depth++;
}
int range_pop(nvtxDomainHandle_t d) {
  note("pop " + *reinterpret_cast<const std::string*>(d));
  return --depth;
}
void name_cu_stream(CUstream s, const char* name) {
  note("stream " + std::to_string(reinterpret_cast<uintptr_t>(s)) + " " + name);
}

template <typename F>
void set(NvtxFunctionTable table, unsigned size, unsigned id, F f) {
  if (id < size && table[id]) *table[id] = reinterpret_cast<NvtxFunctionPointer>(f);
}
}  // namespace

extern "C" __attribute__((visibility("default"))) const char* fake_nvtx_log() { return log_text.c_str(); }

extern "C" __attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get) {
  auto cb = static_cast<const NvtxExportTableCallbacks*>(get(NVTX_ETID_CALLBACKS));
  if (!cb) return 0;
  NvtxFunctionTable t = nullptr;
  unsigned n = 0;
  if (!cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &t, &n)) return 0;
  set(t, n, NVTX_CBID_CORE2_DomainCreateA, &domain_create);
  set(t, n, NVTX_CBID_CORE2_DomainRegisterStringA, &register_string);
  set(t, n, NVTX_CBID_CORE2_DomainRangePushEx, &range_push_ex);
  set(t, n, NVTX_CBID_CORE2_DomainRangePop, &range_pop);
  if (!cb->GetModuleFunctionTable(NVTX_CB_MODULE_CUDA, &t, &n)) return 0;
  set(t, n, NVTX_CBID_CUDA_NameCuStreamA, &name_cu_stream);
  return 1;
}
