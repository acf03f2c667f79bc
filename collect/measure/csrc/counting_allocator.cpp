// A CPU allocator that counts live bytes on every thread, for collect/cpu_alloc.py.
//
// The CPU has no max_memory_allocated. The profiler's memory events stand in badly: it reports a free only
// on a thread it follows, so a tensor whose last reference a gloo worker thread drops looks live for good,
// and how many do depends on how busy the machine is. This allocator wraps c10::alloc_cpu (the default
// CPU allocator's own routine) and keeps one atomic count of live bytes and its high-water mark, whichever
// thread allocates or frees: the CPU's max_memory_allocated.
#include <torch/extension.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <atomic>

namespace {
constexpr size_t kHeader = 64;  // keeps alloc_cpu's 64-byte alignment for the data after it
std::atomic<int64_t> live{0}, peak{0};

void update_peak(int64_t now) {
  int64_t prev = peak.load(std::memory_order_relaxed);
  while (now > prev && !peak.compare_exchange_weak(prev, now)) {}
}

void tracked_free(void* data) {
  if (data == nullptr) return;
  char* base = static_cast<char*>(data) - kHeader;
  live.fetch_sub(static_cast<int64_t>(*reinterpret_cast<size_t*>(base)));
  c10::free_cpu(base);
}

struct CountingAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) return {nullptr, nullptr, &tracked_free, c10::Device(c10::DeviceType::CPU)};
    char* base = static_cast<char*>(c10::alloc_cpu(nbytes + kHeader));
    *reinterpret_cast<size_t*>(base) = nbytes;
    update_peak(live.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes));
    void* data = base + kHeader;
    return {data, data, &tracked_free, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &tracked_free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
};

CountingAllocator allocator;
}  // namespace

void install() { c10::SetCPUAllocator(&allocator, /*priority=*/100); }
int64_t live_bytes() { return live.load(); }
int64_t peak_bytes() { return peak.load(); }
void reset_peak() { peak.store(live.load()); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &install);
  m.def("live_bytes", &live_bytes);
  m.def("peak_bytes", &peak_bytes);
  m.def("reset_peak", &reset_peak);
}
