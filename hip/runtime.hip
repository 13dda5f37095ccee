// Owners and helpers of gpu.hpp over the portability layer (gpu_runtime.hpp).
#include <utility>

#include "gpu.hpp"
#include "gpu_runtime.hpp"

namespace tier::gpu {
namespace {

rt::StreamHandle stream_of(const Stream& s) { return static_cast<rt::StreamHandle>(s.handle()); }

}  // namespace

std::string_view api_name() noexcept { return rt::kApi; }

int device_count() noexcept {
  int n = 0;
  if (rt::get_device_count(&n) != rt::kSuccess) {
    (void)rt::clear_last_error();
    return 0;
  }
  return n;
}

int device_of(const void* p) noexcept {
  if (p == nullptr || device_count() == 0) return -1;
  return rt::device_of_pointer(p);
}

std::optional<DeviceAllocation> device_allocation_of(const void* p) noexcept {
  const int device = device_of(p);
  if (device < 0) return std::nullopt;
  DeviceAllocation a;
  a.device = device;
  DeviceGuard guard(device);  // the driver's query needs the device's context current
  void* base = nullptr;
  std::size_t size = 0;
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  if (guard.status() && rt::address_range(p, &base, &size) &&
      reinterpret_cast<std::uintptr_t>(base) <= at &&
      at - reinterpret_cast<std::uintptr_t>(base) < size) {
    a.base = static_cast<const std::byte*>(base);
    a.size = size;
  }
  return a;
}

Result<DeviceInfo> device_info(int device) noexcept {
  if (device < 0 || device >= device_count())
    return Status::invalid("no GPU with ordinal " + std::to_string(device));
  DeviceGuard guard(device);
  TIER_RETURN_IF_ERROR(guard.status());
  DeviceInfo info;
  info.ordinal = device;
  char name[256] = {};
  TIER_GPU_TRY(rt::device_name(name, sizeof(name), device));
  info.name = name;
  TIER_GPU_TRY(rt::multiprocessors(&info.multiprocessors, device));
  TIER_GPU_TRY(rt::mem_info(&info.free_bytes, &info.total_bytes));
  return info;
}

DeviceGuard::DeviceGuard(int device) noexcept
    : status_(rt::rt_status(rt::get_device(&previous_), "get_device", __FILE__, __LINE__)) {
  if (!status_.is_ok() || previous_ == device) {
    previous_ = -1;  // nothing to restore
    return;
  }
  Status set = rt::rt_status(rt::set_device(device), "set_device", __FILE__, __LINE__);
  if (!set.is_ok()) {
    previous_ = -1;
    std::swap(status_, set);
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) (void)rt::set_device(previous_);
}

Result<Stream> Stream::create(int device) noexcept {
  DeviceGuard guard(device);
  TIER_RETURN_IF_ERROR(guard.status());
  rt::StreamHandle s = nullptr;
  TIER_GPU_TRY(rt::stream_create(&s));
  return Stream(s, device);
}

Stream& Stream::operator=(Stream&& o) noexcept {
  std::swap(handle_, o.handle_);
  std::swap(device_, o.device_);
  std::swap(owned_, o.owned_);
  return *this;
}

Stream::~Stream() {
  if (handle_ == nullptr || !owned_) return;
  DeviceGuard guard(device_);
  (void)rt::stream_destroy(static_cast<rt::StreamHandle>(handle_));
}

Status Stream::synchronize() const noexcept {
  TIER_GPU_TRY(rt::stream_synchronize(static_cast<rt::StreamHandle>(handle_)));
  return Status::ok();
}

Result<Event> Event::create(int device) noexcept {
  DeviceGuard guard(device);
  TIER_RETURN_IF_ERROR(guard.status());
  rt::EventHandle e = nullptr;
  TIER_GPU_TRY(rt::event_create(&e));
  return Event(e, device);
}

Event& Event::operator=(Event&& o) noexcept {
  std::swap(handle_, o.handle_);
  std::swap(device_, o.device_);
  return *this;
}

Event::~Event() {
  if (handle_ == nullptr) return;
  DeviceGuard guard(device_);
  (void)rt::event_destroy(static_cast<rt::EventHandle>(handle_));
}

Status Event::record(const Stream& s) noexcept {
  TIER_GPU_TRY(rt::event_record(static_cast<rt::EventHandle>(handle_), stream_of(s)));
  return Status::ok();
}

Result<bool> Event::done() const noexcept {
  rt::Error e = rt::event_query(static_cast<rt::EventHandle>(handle_));
  if (e == rt::kSuccess) return true;
  if (e == rt::kNotReady) return false;
  (void)rt::clear_last_error();
  return rt::rt_status(e, "event_query", __FILE__, __LINE__);
}

namespace {
thread_local bool fail_syncs = false;  // testing::fail_event_syncs_on_this_thread
}  // namespace

void testing::fail_event_syncs_on_this_thread(bool on) noexcept { fail_syncs = on; }

Status Event::synchronize() const noexcept {
  TIER_GPU_TRY(rt::event_synchronize(static_cast<rt::EventHandle>(handle_)));
  if (fail_syncs) return Status(Code::kDeviceError, "event synchronize: injected failure (test)");
  return Status::ok();
}

Result<DeviceBuffer> DeviceBuffer::allocate(int device, std::size_t bytes) noexcept {
  DeviceGuard guard(device);
  TIER_RETURN_IF_ERROR(guard.status());
  void* p = nullptr;
  rt::Error e = rt::device_malloc(&p, bytes == 0 ? 1 : bytes);
  if (e != rt::kSuccess) {
    (void)rt::clear_last_error();
    return Status(Code::kNoSpace, "device_malloc(" + std::to_string(bytes) + " bytes) on GPU " +
                                      std::to_string(device) + ": " + rt::error_string(e));
  }
  DeviceBuffer b;
  b.data_ = static_cast<std::byte*>(p);
  b.size_ = bytes;
  b.device_ = device;
  return std::move(b);
}

void DeviceBuffer::swap(DeviceBuffer& o) noexcept {
  std::swap(data_, o.data_);
  std::swap(size_, o.size_);
  std::swap(device_, o.device_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  swap(o);
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ == nullptr) return;
  DeviceGuard guard(device_);
  (void)rt::device_free(data_);
}

Result<PinnedBuffer> PinnedBuffer::allocate(std::size_t bytes) noexcept {
  void* p = nullptr;
  rt::Error e = rt::host_alloc_mapped(&p, bytes == 0 ? 1 : bytes);
  if (e != rt::kSuccess) {
    (void)rt::clear_last_error();
    return Status(Code::kNoSpace, "host_alloc_mapped(" + std::to_string(bytes) +
                                      " bytes): " + rt::error_string(e));
  }
  PinnedBuffer b;
  b.data_ = static_cast<std::byte*>(p);
  b.size_ = bytes;
  return std::move(b);
}

void PinnedBuffer::swap(PinnedBuffer& o) noexcept {
  std::swap(data_, o.data_);
  std::swap(size_, o.size_);
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  swap(o);
  return *this;
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) (void)rt::host_free(data_);
}

Result<PinnedRegistration> PinnedRegistration::register_host(std::span<std::byte> memory) noexcept {
  if (memory.empty()) return Status::invalid("cannot register an empty host range");
  TIER_GPU_TRY(rt::host_register_mapped(memory.data(), memory.size()));
  PinnedRegistration r;
  r.data_ = memory.data();
  r.size_ = memory.size();
  return std::move(r);
}

PinnedRegistration& PinnedRegistration::operator=(PinnedRegistration&& o) noexcept {
  std::swap(data_, o.data_);
  std::swap(size_, o.size_);
  return *this;
}

PinnedRegistration::~PinnedRegistration() {
  if (data_ != nullptr) (void)rt::host_unregister(data_);
}

Status copy_async(Region dst, Region src, const Stream& s) noexcept {
  if (dst.data == nullptr || src.data == nullptr) return Status::invalid("copy of an empty region");
  std::size_t n = dst.size < src.size ? dst.size : src.size;
  if (n == 0) return Status::ok();
  TIER_GPU_TRY(rt::memcpy_async(dst.data, src.data, n, stream_of(s)));
  return Status::ok();
}

Status stream_wait_event(const Stream& s, void* event) noexcept {
  if (s.handle() == nullptr || event == nullptr)
    return Status::invalid("stream_wait_event: null handle");
  TIER_GPU_TRY(rt::stream_wait_event(stream_of(s), static_cast<rt::EventHandle>(event)));
  return Status::ok();
}

Status stream_wait_event(void* stream, const Event& event) noexcept {
  if (stream == nullptr || event.handle() == nullptr)
    return Status::invalid("stream_wait_event: null handle");
  TIER_GPU_TRY(rt::stream_wait_event(static_cast<rt::StreamHandle>(stream),
                                     static_cast<rt::EventHandle>(event.handle())));
  return Status::ok();
}

Status record_on(const Event& event, void* stream) noexcept {
  if (stream == nullptr || event.handle() == nullptr) return Status::invalid("record_on: null handle");
  TIER_GPU_TRY(rt::event_record(static_cast<rt::EventHandle>(event.handle()),
                                static_cast<rt::StreamHandle>(stream)));
  return Status::ok();
}

Status fill_async(Region dst, std::uint8_t value, void* stream) noexcept {
  if (dst.data == nullptr || stream == nullptr) return Status::invalid("fill_async: null pointer");
  TIER_GPU_TRY(rt::memset_async(dst.data, value, dst.size, static_cast<rt::StreamHandle>(stream)));
  return Status::ok();
}

bool is_mapped_pinned(const void* p) noexcept { return rt::mapped_device_pointer(p) != nullptr; }

std::string_view image_path_name(ImagePath p) noexcept {
  switch (p) {
    case ImagePath::kAuto:
      return "auto";
    case ImagePath::kZeroCopy:
      return "zero_copy";
    case ImagePath::kStaged:
      return "staged";
  }
  return "?";
}

}  // namespace tier::gpu
