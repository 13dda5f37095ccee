// libtier._libtier: the Python binding of the C API (tier/tier.h, libtier_c).
//
// Buffers are taken by pointer (numpy arrays, torch tensors, __array_interface__,
// __cuda_array_interface__, Region, (ptr, nbytes)); nothing is copied through Python objects.
// Arguments are converted while the GIL is held; every call into the library that moves bytes
// or may wait runs with the GIL released. A failing call raises libtier._errors.error_for(code,
// tier_last_error()) (read on the same thread, right after the call).
//
// Lifetimes: each object holds its C handle in a Handle (below), so close() may run on any
// thread while other threads are inside calls: they finish, calls that begin later raise
// BadState, and the C handle is closed only once no thread holds it. A Worker holds its Store and
// Dsv4Layout, a Scheduler its Worker, both here (shared_ptr) and in the C library (references,
// tier.h "Lifetimes"): closing an object a dependent still uses frees nothing it needs.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "_docs.h"
#include "tier/tier.h"

namespace py = pybind11;

namespace {

// The docstring of `name` (e.g. "Store.save"): the stub's signature and docstring, generated from
// __init__.pyi by gen_docs.py. A name the stub does not document fails the import, naming it.
const char* doc(const char* name) {
  for (const auto& d : libtier_docs::kDocs)
    if (std::strcmp(d.name, name) == 0) return d.text;
  throw std::runtime_error(std::string("libtier: __init__.pyi documents no ") + name);
}

py::object errors_module() {
  static py::object* mod = new py::object(py::module_::import("libtier._errors"));
  return *mod;
}

// Text from the library as a str: bytes that are not UTF-8 (a path or name from the environment)
// become U+FFFD rather than a UnicodeDecodeError in place of the real result or error.
py::str text_of(std::string_view s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (!o) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

[[noreturn]] void raise_code(int code, const std::string& message) {
  py::object err = errors_module().attr("error_for")(code, text_of(message));
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(err.ptr())), err.ptr());
  throw py::error_already_set();
}
[[noreturn]] void raise_invalid(const std::string& message) {
  raise_code(TIER_INVALID_ARGUMENT, message);
}

// An extra key (docs/keys.md): None (none), bytes, or str (its UTF-8 bytes).
std::string extra_key_bytes(py::handle extra) {
  if (extra.is_none()) return {};
  if (py::isinstance<py::str>(extra)) return extra.cast<std::string>();
  if (py::isinstance<py::bytes>(extra)) return extra.cast<std::string>();
  raise_invalid("an extra key is bytes or str");
}
// Raises for a failing status; reads the message on this thread (the GIL may have been released
// around the call, the thread is the same).
void check(int rc) {
  if (rc != TIER_OK) raise_code(rc, tier_last_error());
}

// A DeprecationWarning naming the old spelling and the new one (raises when warnings are errors).
void deprecated(const char* old_name, const char* new_name) {
  const std::string text = std::string(old_name) + " is deprecated; use " + new_name;
  if (PyErr_WarnEx(PyExc_DeprecationWarning, text.c_str(), 1) != 0) throw py::error_already_set();
}

// Code(code), from a table of the members made once (an enum call per item cost more than a
// 64 KiB copy's tenth in a batch of small loads). Called with the GIL held; never freed, like
// the module above.
py::object py_code(int code) {
  static const std::vector<py::object>* members = [] {  // indexed by value
    auto* v = new std::vector<py::object>;
    for (py::handle m : errors_module().attr("Code")) {
      const auto value = m.cast<std::size_t>();
      if (v->size() <= value) v->resize(value + 1);
      (*v)[value] = py::reinterpret_borrow<py::object>(m);
    }
    return v;
  }();
  if (code >= 0 && static_cast<std::size_t>(code) < members->size() &&
      (*members)[static_cast<std::size_t>(code)])
    return (*members)[static_cast<std::size_t>(code)];
  return errors_module().attr("Code")(code);
}

// ---- log ----------------------------------------------------------------------------------

// libtier's messages on their way to Python's logging (python/libtier/_log.py): the library's
// sink queues them on whatever thread logs, never taking the GIL; _log.py's thread takes them
// with the GIL released (_take_logs) and logs them under the GIL.
struct LogQueue {
  static constexpr std::size_t kMax = 4096;  // beyond: dropped, and counted
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<int, std::string>> messages;
  std::uint64_t queued = 0, taken = 0, dropped = 0;
  bool closed = false;
};
std::atomic<LogQueue*> g_logs{new LogQueue};  // replaced after a fork, never freed

void queue_log(void*, int level, const char* message) {
  LogQueue& q = *g_logs.load();
  {
    std::lock_guard<std::mutex> lock(q.mu);
    if (q.closed) return;
    if (q.messages.size() >= LogQueue::kMax) {
      ++q.dropped;
      return;
    }
    q.messages.emplace_back(level, message);
    ++q.queued;
  }
  q.cv.notify_one();
}

// (messages, dropped since the last call, closed), waiting up to `timeout` seconds for one.
py::tuple take_logs(double timeout) {
  LogQueue& q = *g_logs.load();
  std::deque<std::pair<int, std::string>> out;
  std::uint64_t dropped = 0;
  bool closed = false;
  {
    py::gil_scoped_release nogil;
    std::unique_lock<std::mutex> lock(q.mu);
    q.cv.wait_for(lock, std::chrono::duration<double>(timeout),
                  [&] { return q.closed || !q.messages.empty() || q.dropped > 0; });
    out.swap(q.messages);
    q.taken += out.size();
    std::swap(dropped, q.dropped);
    closed = q.closed;
  }
  py::list messages;
  for (auto& [level, text] : out) {  // a message is not trusted to be UTF-8
    PyObject* str =
        PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "replace");
    if (str == nullptr) throw py::error_already_set();
    messages.append(py::make_tuple(level, py::reinterpret_steal<py::str>(str)));
  }
  return py::make_tuple(messages, dropped, closed);
}

// A C handle and the calls that hold it. use() (GIL held) hands the handle to one call, or raises
// BadState once close began; take() (GIL held) marks the handle closed and returns it (null when
// closed already) after every call that holds it has returned, waiting for them without the GIL.
// The caller of take() then closes the C handle: no thread can be passing it to the library.
template <class H>
class Handle {
 public:
  class Use {
   public:
    Use(Handle* h, H* p) : h_(h), p_(p) {}
    Use(Use&& o) noexcept : h_(std::exchange(o.h_, nullptr)), p_(o.p_) {}
    Use(const Use&) = delete;
    ~Use() {
      if (h_) h_->leave();
    }
    H* get() const { return p_; }

   private:
    Handle* h_;
    H* p_;
  };

  explicit Handle(const char* what) : what_(what) {}
  void set(H* p) { p_ = p; }
  bool closed() const {
    std::lock_guard<std::mutex> lock(mu_);
    return p_ == nullptr;
  }
  Use use() {
    H* p;
    {
      std::lock_guard<std::mutex> lock(mu_);
      p = p_;
      if (p) ++calls_;
    }
    if (!p) raise_code(TIER_BAD_STATE, std::string("the ") + what_ + " is closed");
    return Use(this, p);
  }
  H* take() {
    H* p;
    bool busy;
    {
      std::lock_guard<std::mutex> lock(mu_);
      p = std::exchange(p_, nullptr);
      busy = calls_ > 0;
    }
    if (busy) {
      // Without the GIL (the calls may need it to return); mu_ is never held while the GIL is
      // taken, so the lock below is released before `nogil` takes the GIL back.
      py::gil_scoped_release nogil;
      std::unique_lock<std::mutex> lock(mu_);
      idle_.wait(lock, [&] { return calls_ == 0; });
    }
    return p;
  }

 private:
  void leave() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--calls_ == 0) idle_.notify_all();
  }
  const char* what_;
  mutable std::mutex mu_;
  std::condition_variable idle_;
  H* p_ = nullptr;
  std::size_t calls_ = 0;
};

// A timeout in seconds (None: -1, no limit) as milliseconds for the C API; InvalidArgument for
// a negative or NaN one, and anything above a year is a year.
std::int64_t timeout_ms(std::optional<double> seconds) {
  if (!seconds) return -1;
  if (std::isnan(*seconds) || *seconds < 0)
    raise_invalid("timeout: expected seconds >= 0 or None, got " + std::to_string(*seconds));
  return static_cast<std::int64_t>(std::min(*seconds, 365.0 * 86400.0) * 1000.0);
}

// ---- keys ---------------------------------------------------------------------------------

tier_key to_key(py::handle h) {
  tier_key k{};
  if (py::isinstance<py::str>(h)) {
    // The str's own UTF-8 (kept in the str, NUL-terminated): no copy per key of a batch.
    Py_ssize_t n = 0;
    const char* p = PyUnicode_AsUTF8AndSize(h.ptr(), &n);
    if (p == nullptr) {
      PyErr_Clear();
      raise_invalid("a key str is not valid UTF-8");
    }
    if (std::memchr(p, 0, static_cast<std::size_t>(n)) != nullptr)
      raise_invalid("a key str holds a NUL character");
    check(tier_key_from_hex(p, &k));
  } else if (PyBytes_Check(h.ptr())) {  // read in place: no copy per key of a batch
    const Py_ssize_t n = PyBytes_GET_SIZE(h.ptr());
    if (n != 16) raise_invalid("a key in bytes is 16 bytes, got " + std::to_string(n));
    std::memcpy(k.bytes, PyBytes_AS_STRING(h.ptr()), 16);
  } else {
    raise_invalid("a key is 32 hex digits (str) or 16 bytes");
  }
  return k;
}
std::vector<tier_key> to_keys(py::handle seq) {
  std::vector<tier_key> out;
  if (!PyList_Check(seq.ptr()) && !PyTuple_Check(seq.ptr())) {  // any other iterable
    for (py::handle h : seq) out.push_back(to_key(h));
    return out;
  }
  // A list or tuple, the common case: its items read in place, without the iterator protocol.
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
  PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
  out.resize(static_cast<std::size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = to_key(items[i]);
  return out;
}
std::string hex(const tier_key& k) {
  char buf[33];
  tier_key_to_hex(&k, buf);
  return buf;
}
// JSON text of a Python object (a profile, identity or config dict). What json.dumps cannot
// write (a set, NaN, nesting past the interpreter's recursion limit) is InvalidArgument.
std::string dumps(py::handle obj) {
  try {
    return py::module_::import("json")
        .attr("dumps")(obj, py::arg("allow_nan") = false)
        .cast<std::string>();
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError) && !e.matches(PyExc_ValueError) &&
        !e.matches(PyExc_RecursionError))
      throw;
    raise_invalid(std::string("not JSON: ") + e.what());
  }
}
tier_key namespace_of(py::handle ns) {
  if (ns.is_none()) return tier_key{};
  if (py::isinstance<py::dict>(ns)) {
    tier_key k;
    check(tier_namespace_id(dumps(ns).c_str(), &k));
    return k;
  }
  return to_key(ns);
}
// A Python int in [0, max] (a size, pointer or count from the caller); InvalidArgument for
// anything else (a negative number, one of more than 64 bits, not an int), naming `what`.
std::uint64_t to_u64(py::handle h, const char* what, std::uint64_t max = UINT64_MAX) {
  if (!py::isinstance<py::int_>(h)) raise_invalid(std::string(what) + ": expected an int");
  int overflow = 0;
  const long long sv = PyLong_AsLongLongAndOverflow(h.ptr(), &overflow);
  if (overflow < 0 || (overflow == 0 && sv < 0))
    raise_invalid(std::string(what) + ": expected a non-negative int");
  unsigned long long v = static_cast<unsigned long long>(sv);
  if (overflow > 0) {
    v = PyLong_AsUnsignedLongLong(h.ptr());
    if (PyErr_Occurred()) {
      PyErr_Clear();
      raise_invalid(std::string(what) + ": more than 64 bits");
    }
  }
  if (v > max) raise_invalid(std::string(what) + ": " + std::to_string(v) + " is too large");
  return v;
}

// Token ids or block ids (`what` names them): a sequence of ints or a 1-D numpy array of an
// integer dtype, each in [0, 2^32). Anything that is not an integer is refused with TypeError, a
// float array too (it is never truncated: 0.5 is not token 0); an integer out of range with
// InvalidArgument.
std::vector<std::uint32_t> to_u32(py::handle seq, const char* what) {
  auto out_of_range = [&](const std::string& v, std::size_t i) {
    raise_invalid(std::string(what) + "[" + std::to_string(i) + "] = " + v +
                  " is not in [0, 2^32)");
  };
  std::vector<std::uint32_t> out;
  if (py::isinstance<py::array>(seq)) {
    auto a = py::reinterpret_borrow<py::array>(seq);
    const char kind = a.dtype().kind();
    if (kind != 'i' && kind != 'u')
      throw py::type_error(std::string(what) + ": an array of integers is needed, got dtype " +
                           py::str(a.dtype()).cast<std::string>());
    if (a.ndim() > 1) raise_invalid(std::string(what) + ": a 1-D array is needed");
    if (kind == 'u') {
      auto u = py::array_t<std::uint64_t, py::array::c_style | py::array::forcecast>::ensure(a);
      for (py::ssize_t i = 0; i < u.size(); ++i) {
        if (u.data()[i] > 0xffffffffULL) out_of_range(std::to_string(u.data()[i]), i);
        out.push_back(static_cast<std::uint32_t>(u.data()[i]));
      }
    } else {
      auto v = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(a);
      for (py::ssize_t i = 0; i < v.size(); ++i) {
        if (v.data()[i] < 0 || v.data()[i] > 0xffffffffLL) out_of_range(std::to_string(v.data()[i]), i);
        out.push_back(static_cast<std::uint32_t>(v.data()[i]));
      }
    }
    return out;
  }
  if (!py::isinstance<py::iterable>(seq) || py::isinstance<py::str>(seq) ||
      py::isinstance<py::bytes>(seq))
    throw py::type_error(std::string(what) + ": a sequence of integers is needed, got " +
                         py::str(py::type::handle_of(seq).attr("__name__")).cast<std::string>());
  std::size_t i = 0;
  for (py::handle h : seq) {
    // int and what implements __index__ (numpy's integer scalars); never bool, float or str.
    if (PyBool_Check(h.ptr()) || !PyIndex_Check(h.ptr()))
      throw py::type_error(std::string(what) + "[" + std::to_string(i) +
                           "]: an integer is needed, got " +
                           py::str(py::type::handle_of(h).attr("__name__")).cast<std::string>() +
                           " " + py::repr(h).cast<std::string>());
    py::int_ v = py::reinterpret_steal<py::int_>(PyNumber_Index(h.ptr()));
    if (!v) throw py::error_already_set();
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (overflow != 0 || x < 0 || x > 0xffffffffLL) out_of_range(py::repr(h).cast<std::string>(), i);
    out.push_back(static_cast<std::uint32_t>(x));
    ++i;
  }
  return out;
}

// ---- buffers ------------------------------------------------------------------------------

struct Region {
  std::uintptr_t ptr = 0;
  std::size_t nbytes = 0;
  int kind = TIER_MEMORY_HOST;
  int device = -1;
  tier_region c() const {
    return tier_region{reinterpret_cast<void*>(ptr), nbytes, kind, kind == TIER_MEMORY_DEVICE ? device : -1};
  }
};

// The item size of an array interface typestr ("<f8", "|u1": byte order, kind, then the size in
// decimal digits), 1 to 2^16.
std::size_t itemsize_of(py::handle typestr, const char* what) {
  if (!py::isinstance<py::str>(typestr))
    raise_invalid(std::string(what) + ": typestr is not a str");
  const std::string t = typestr.cast<std::string>();
  std::size_t n = 0;
  bool ok = t.size() >= 3 && t.size() <= 7;
  for (std::size_t i = 2; ok && i < t.size(); ++i) {
    ok = t[i] >= '0' && t[i] <= '9';
    n = n * 10 + static_cast<std::size_t>(t[i] - '0');
  }
  if (!ok || n == 0 || n > 65536) raise_invalid(std::string(what) + ": bad typestr '" + t + "'");
  return n;
}

// A tuple of a dict entry (an array interface's "data", "shape", "strides").
py::tuple tuple_entry(py::dict ai, const char* key, const char* what) {
  if (!ai.contains(key) || !py::isinstance<py::tuple>(ai[key]))
    raise_invalid(std::string(what) + ": the array interface has no tuple \"" + key + "\"");
  return ai[key];
}

// A C-contiguous array interface (numpy's or CUDA's) as a region; every number is checked (a
// forged shape or typestr whose product wraps is an error, not a small region).
tier_region from_interface(py::handle iface, int kind, int device, bool writable,
                           const char* what) {
  if (!py::isinstance<py::dict>(iface))
    raise_invalid(std::string(what) + ": the array interface is not a dict");
  py::dict ai = py::reinterpret_borrow<py::dict>(iface);
  py::tuple data = tuple_entry(ai, "data", what);
  if (data.size() != 2) raise_invalid(std::string(what) + ": \"data\" is not (ptr, read_only)");
  const auto ptr = to_u64(data[0], "array interface data pointer", UINTPTR_MAX);
  const bool readonly = py::bool_(data[1]);
  if (writable && readonly) raise_invalid(std::string(what) + ": read-only buffer for a load");
  py::tuple shape = tuple_entry(ai, "shape", what);
  const std::size_t itemsize = itemsize_of(
      ai.contains("typestr") ? py::handle(ai["typestr"]) : py::handle(py::none()), what);
  std::size_t bytes = itemsize;
  for (py::handle d : shape)
    if (__builtin_mul_overflow(bytes, to_u64(d, "array interface shape"), &bytes))
      raise_invalid(std::string(what) + ": the array's size does not fit in 64 bits");
  if (ai.contains("strides") && !ai["strides"].is_none()) {
    std::size_t expect = itemsize;
    py::tuple strides = tuple_entry(ai, "strides", what);
    if (strides.size() != shape.size())
      raise_invalid(std::string(what) + ": strides and shape differ in length");
    for (std::size_t i = shape.size(); i-- > 0;) {
      const auto extent = to_u64(shape[i], "array interface shape");
      if (extent > 1 && to_u64(strides[i], "array interface strides") != expect)
        raise_invalid(std::string(what) + ": the array is not C-contiguous");
      if (__builtin_mul_overflow(expect, extent, &expect)) expect = 0;  // bytes overflowed above
    }
  }
  return tier_region{reinterpret_cast<void*>(ptr), bytes, kind, device};
}

int device_of(py::handle obj) {
  if (py::hasattr(obj, "device")) {
    py::object d = obj.attr("device");
    if (py::hasattr(d, "index") && !d.attr("index").is_none()) return d.attr("index").cast<int>();
    if (py::isinstance<py::int_>(d)) return d.cast<int>();
  }
  return 0;  // the current device of the caller's CUDA context
}

// Reads libtier.Region objects. The class is looked up once, when this is made: a batch makes
// one for all its regions (py::isinstance<Region> and py::cast look it up on every call, which
// was a third of converting a list of regions). Other buffers are told apart by a type check
// alone (the caster's load would raise and format an AttributeError for each). Also remembers
// the last type found to be a torch tensor, so that a batch of tensors probes for their methods
// once. Needs the GIL, like every use of `obj`.
class RegionCaster {
 public:
  RegionCaster() : type_(py::type::of<Region>()) {}
  // The Region `obj` is (or derives from), or null. A subtype test of its type: isinstance()
  // would first look __instancecheck__ up on pybind11's metaclass, for every buffer of a batch.
  const Region* get(py::handle obj) {
    if (!PyType_IsSubtype(Py_TYPE(obj.ptr()), reinterpret_cast<PyTypeObject*>(type_.ptr())) ||
        !caster_.load(obj, false))
      return nullptr;
    return &py::detail::cast_op<const Region&>(caster_);
  }
  // Whether `obj` has torch.Tensor's methods (data_ptr and is_cuda; only tensors do).
  bool torch_like(py::handle obj);

 private:
  py::type type_;
  py::detail::make_caster<Region> caster_;
  PyTypeObject* torch_type_ = nullptr;  // a type seen to be torch-like
};

// The names of the torch.Tensor methods and attributes a region is read from, interned once (a
// lookup by a C string makes a str every time).
struct TorchNames {
  PyObject *data_ptr, *is_cuda, *is_contiguous, *numel, *element_size, *is_pinned, *get_device;
};
const TorchNames& torch_names() {
  static const TorchNames names = [] {
    auto intern = [](const char* s) {
      PyObject* p = PyUnicode_InternFromString(s);
      if (p == nullptr) throw py::error_already_set();
      return p;  // kept for the life of the process
    };
    return TorchNames{intern("data_ptr"), intern("is_cuda"),      intern("is_contiguous"),
                      intern("numel"),    intern("element_size"), intern("is_pinned"),
                      intern("get_device")};
  }();
  return names;
}

bool RegionCaster::torch_like(py::handle obj) {
  if (Py_TYPE(obj.ptr()) == torch_type_) return true;
  const TorchNames& n = torch_names();
  if (PyObject_HasAttr(obj.ptr(), n.data_ptr) != 1 || PyObject_HasAttr(obj.ptr(), n.is_cuda) != 1)
    return false;
  torch_type_ = Py_TYPE(obj.ptr());
  return true;
}

// obj.name() without arguments, by vectorcall (no bound method made).
py::object call_method(py::handle obj, PyObject* name) {
  PyObject* args[] = {obj.ptr()};
  PyObject* r = PyObject_VectorcallMethod(name, args, 1, nullptr);
  if (r == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(r);
}
// A torch tensor as a region: six lookups (is_pinned for a CPU tensor, get_device for a CUDA one).
tier_region from_tensor(py::handle obj) {
  const TorchNames& n = torch_names();
  if (!py::bool_(call_method(obj, n.is_contiguous)))
    raise_invalid("buffer: the tensor is not contiguous");
  const auto ptr = to_u64(call_method(obj, n.data_ptr), "tensor data_ptr", UINTPTR_MAX);
  std::size_t bytes = 0;
  if (__builtin_mul_overflow(to_u64(call_method(obj, n.numel), "tensor numel"),
                             to_u64(call_method(obj, n.element_size), "tensor element_size"),
                             &bytes))
    raise_invalid("buffer: the tensor's size does not fit in 64 bits");
  if (py::bool_(obj.attr(py::handle(n.is_cuda)))) {
    const auto device = call_method(obj, n.get_device).cast<int>();
    return tier_region{reinterpret_cast<void*>(ptr), bytes, TIER_MEMORY_DEVICE, device};
  }
  const bool pinned = py::bool_(call_method(obj, n.is_pinned));
  return tier_region{reinterpret_cast<void*>(ptr), bytes,
                     pinned ? TIER_MEMORY_PINNED : TIER_MEMORY_HOST, -1};
}

// One buffer as a region (the accepted forms are listed in __init__.pyi).
tier_region to_region(py::handle obj, bool writable, RegionCaster& regions) {
  if (const Region* r = regions.get(obj)) return r->c();
  if (py::isinstance<py::array>(obj)) {
    auto a = py::reinterpret_borrow<py::array>(obj);
    if (!(a.flags() & py::array::c_style)) raise_invalid("buffer: the array is not C-contiguous");
    if (writable && !a.writeable()) raise_invalid("buffer: read-only array for a load");
    return tier_region{const_cast<void*>(a.data()), static_cast<std::size_t>(a.nbytes()),
                       TIER_MEMORY_HOST, -1};
  }
  if (regions.torch_like(obj)) return from_tensor(obj);
  if (py::hasattr(obj, "__cuda_array_interface__"))
    return from_interface(obj.attr("__cuda_array_interface__"), TIER_MEMORY_DEVICE, device_of(obj),
                          writable, "buffer");
  if (py::hasattr(obj, "__array_interface__"))
    return from_interface(obj.attr("__array_interface__"), TIER_MEMORY_HOST, -1, writable,
                          "buffer");
  if (py::isinstance<py::tuple>(obj) && py::len(obj) == 2) {
    py::tuple t = py::reinterpret_borrow<py::tuple>(obj);
    return tier_region{reinterpret_cast<void*>(to_u64(t[0], "buffer pointer", UINTPTR_MAX)),
                       to_u64(t[1], "buffer size", SIZE_MAX), TIER_MEMORY_HOST, -1};
  }
  raise_invalid("buffer: expected a numpy array, a torch tensor, an object with "
                "__array_interface__ or __cuda_array_interface__, a Region or (ptr, nbytes)");
}

tier_region to_region(py::handle obj, bool writable) {
  RegionCaster regions;
  return to_region(obj, writable, regions);
}

// A batch in C form: the items point into `regions`, which must not reallocate afterwards.
struct Batch {
  std::vector<tier_key> keys;
  std::vector<tier_region> regions;
  std::vector<tier_item> items;
};

// One buffer, or a scatter/gather list: a list, or a tuple other than (ptr, nbytes).
bool is_single_buffer(py::handle b) {
  if (py::isinstance<py::list>(b)) return false;
  if (!py::isinstance<py::tuple>(b)) return true;
  auto t = py::reinterpret_borrow<py::tuple>(b);
  return t.size() == 2 && py::isinstance<py::int_>(t[0]) && py::isinstance<py::int_>(t[1]);
}

Batch make_batch(py::handle keys, py::handle buffers, bool writable) {
  Batch b;
  b.keys = to_keys(keys);
  std::vector<std::size_t> first{0};
  first.reserve(b.keys.size() + 1);
  b.regions.reserve(b.keys.size());  // one per buffer, the common case
  b.items.reserve(b.keys.size());
  std::size_t n = 0;
  RegionCaster regions;
  for (py::handle buf : buffers) {
    if (is_single_buffer(buf)) {
      b.regions.push_back(to_region(buf, writable, regions));
    } else {
      for (py::handle part : buf) b.regions.push_back(to_region(part, writable, regions));
    }
    first.push_back(b.regions.size());
    ++n;
  }
  if (n != b.keys.size())
    raise_invalid(std::to_string(b.keys.size()) + " keys for " + std::to_string(n) + " buffers");
  for (std::size_t i = 0; i < n; ++i)
    b.items.push_back(tier_item{b.keys[i], b.regions.data() + first[i], first[i + 1] - first[i]});
  return b;
}

py::list codes_list(const std::int32_t* codes, std::size_t n) {
  py::list out(n);  // sized once: no append, no regrowth
  for (std::size_t i = 0; i < n; ++i)
    PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), py_code(codes[i]).release().ptr());
  return out;
}

py::object json_loads(char* text) {
  py::str s = text_of(text);
  tier_free(text);
  return py::module_::import("json").attr("loads")(s);
}
py::str take_string(char* text) {
  py::str s = text_of(text);
  tier_free(text);
  return s;
}

// ---- Store --------------------------------------------------------------------------------

struct ObjectStat {
  int tier = -1;
  std::string tier_name;
  std::uint64_t nbytes = 0, stored_bytes = 0;
};

struct Completion {
  std::uint64_t ticket = 0;
  std::string op;
  py::list codes;
  std::vector<int> tiers;
  bool ok = true;
};

class Registration;

class Store {
 public:
  static std::shared_ptr<Store> open(py::object profile, py::object ns, std::uint32_t rank) {
    tier_key k = namespace_of(ns);
    auto s = std::make_shared<Store>();
    tier_store* h = nullptr;
    int rc;
    if (py::isinstance<py::dict>(profile)) {
      std::string text = dumps(profile);
      py::gil_scoped_release nogil;
      rc = tier_store_open_json(text.c_str(), &k, rank, &h);
    } else {
      // os.fsencode: a path that is not UTF-8 reaches the file system as its bytes.
      std::string text =
          py::bytes(py::module_::import("os").attr("fsencode")(profile)).cast<std::string>();
      const bool inline_json = text.find_first_not_of(" \t\r\n") != std::string::npos &&
                               text[text.find_first_not_of(" \t\r\n")] == '{';
      py::gil_scoped_release nogil;
      rc = inline_json ? tier_store_open_json(text.c_str(), &k, rank, &h)
                       : tier_store_open(text.c_str(), &k, rank, &h);
    }
    check(rc);
    s->h_.set(h);
    s->ns_ = hex(k);
    s->rank_ = rank;
    return s;
  }
  ~Store() { close(); }

  // Any thread, also while others are inside calls (they finish first).
  void close() {
    tier_store* h = h_.take();
    if (!h) return;
    {
      py::gil_scoped_release nogil;
      tier_store_close(h);
    }
    std::map<std::uint64_t, py::object> buffers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      buffers.swap(pending_);
    }
  }
  bool closed() const { return h_.closed(); }
  Handle<tier_store>::Use handle() const { return h_.use(); }
  const std::string& ns() const { return ns_; }
  std::uint32_t rank() const { return rank_; }
  py::list tier_names() const {
    py::list out;
    auto use = handle();
    tier_store* h = use.get();
    for (std::size_t i = 0; i < tier_store_tier_count(h); ++i)
      out.append(text_of(tier_store_tier_name(h, i)));
    return out;
  }

  std::size_t lookup_prefix(py::handle keys) {
    auto k = to_keys(keys);
    auto use = handle();
    tier_store* h = use.get();
    std::size_t n = 0;
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = tier_store_lookup_prefix(h, k.data(), k.size(), &n);
    }
    check(rc);
    return n;
  }
  std::vector<std::optional<ObjectStat>> stat(py::handle keys) {
    auto k = to_keys(keys);
    auto use = handle();
    tier_store* h = use.get();
    std::vector<tier_object_stat> st(k.size());
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = tier_store_stat(h, k.data(), k.size(), st.data());
    }
    check(rc);
    std::vector<std::optional<ObjectStat>> out;
    for (const tier_object_stat& x : st) {
      if (x.tier < 0) {
        out.emplace_back();
        continue;
      }
      out.push_back(ObjectStat{x.tier, tier_store_tier_name(h, static_cast<std::size_t>(x.tier)),
                               x.payload_bytes, x.stored_bytes});
    }
    return out;
  }
  std::optional<std::string> metrics_endpoint() const {
    std::string e = tier_store_metrics_endpoint(handle().get());
    if (e.empty()) return std::nullopt;
    return e;
  }
  std::vector<bool> exists(py::handle keys) {
    auto k = to_keys(keys);
    auto use = handle();
    tier_store* h = use.get();
    std::vector<std::uint8_t> out(k.size());
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = tier_store_exists(h, k.data(), k.size(), out.data());
    }
    check(rc);
    return std::vector<bool>(out.begin(), out.end());
  }
  py::list save(py::handle keys, py::handle buffers) {
    Batch b = make_batch(keys, buffers, false);
    std::vector<std::int32_t> codes(b.items.size());
    auto use = handle();
    tier_store* h = use.get();
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = tier_store_save(h, b.items.data(), b.items.size(), codes.data());
    }
    check(rc);
    return codes_list(codes.data(), codes.size());
  }
  py::list load(py::handle keys, py::handle buffers) {
    return load_with_tiers(keys, buffers)[0];
  }
  py::tuple load_with_tiers(py::handle keys, py::handle buffers) {
    Batch b = make_batch(keys, buffers, true);
    std::vector<std::int32_t> codes(b.items.size()), tiers(b.items.size());
    auto use = handle();
    tier_store* h = use.get();
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = tier_store_load(h, b.items.data(), b.items.size(), codes.data(), tiers.data());
    }
    check(rc);
    return py::make_tuple(codes_list(codes.data(), codes.size()),
                          std::vector<int>(tiers.begin(), tiers.end()));
  }
  std::uint64_t submit(py::handle keys, py::handle buffers, bool load) {
    Batch b = make_batch(keys, buffers, load);
    auto use = handle();
    tier_store* h = use.get();
    std::uint64_t ticket = 0;
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = load ? tier_store_submit_load(h, b.items.data(), b.items.size(), &ticket)
                : tier_store_submit_save(h, b.items.data(), b.items.size(), &ticket);
    }
    check(rc);
    // The buffers stay referenced until the completion is handed out (unless another thread
    // took it while the GIL was released above).
    std::lock_guard<std::mutex> lock(mu_);
    if (taken_early_.erase(ticket) == 0)
      pending_[ticket] = py::reinterpret_borrow<py::object>(buffers);
    return ticket;
  }
  Completion convert(tier_completion* c) {
    Completion out;
    out.ticket = tier_completion_ticket(c);
    out.op = tier_completion_op(c) == TIER_OP_LOAD ? "load" : "save";
    const std::size_t n = tier_completion_count(c);
    const std::int32_t* codes = tier_completion_codes(c);
    out.codes = codes_list(codes, n);
    out.ok = tier_completion_status(c) == TIER_OK;
    for (std::size_t i = 0; i < n; ++i) out.ok = out.ok && codes[i] == TIER_OK;
    if (const std::int32_t* t = tier_completion_tiers(c)) out.tiers.assign(t, t + n);
    tier_completion_free(c);
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_.erase(out.ticket) == 0) taken_early_.insert(out.ticket);
    return out;
  }
  std::vector<Completion> poll() {
    std::vector<Completion> out;
    for (;;) {
      tier_completion* c = nullptr;
      check(tier_store_poll(handle().get(), &c));
      if (!c) return out;
      out.push_back(convert(c));
    }
  }
  Completion wait(std::optional<std::uint64_t> ticket, std::optional<double> timeout) {
    auto use = handle();
    tier_store* h = use.get();
    tier_completion* c = nullptr;
    const std::int64_t ms = timeout_ms(timeout);
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = tier_store_wait(h, ticket.value_or(0), ms, &c);
    }
    check(rc);
    return convert(c);
  }
  py::list remove(py::handle keys) {
    auto k = to_keys(keys);
    auto use = handle();
    tier_store* h = use.get();
    std::vector<std::int32_t> codes(k.size());
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = tier_store_remove(h, k.data(), k.size(), codes.data());
    }
    check(rc);
    return codes_list(codes.data(), codes.size());
  }
  std::uint64_t clear() {
    auto use = handle();
    tier_store* h = use.get();
    std::uint64_t removed = 0;
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = tier_store_clear(h, nullptr, &removed);
    }
    check(rc);
    return removed;
  }
  void progress() {
    auto use = handle();
    tier_store* h = use.get();
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = tier_store_progress(h);
    }
    check(rc);
  }
  void flush(std::optional<double> timeout) {
    const std::int64_t ms = timeout_ms(timeout);
    auto use = handle();
    tier_store* h = use.get();
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = tier_store_flush(h, ms);
    }
    check(rc);
  }
  py::object metrics() {
    char* text = nullptr;
    check(tier_store_metrics_json(handle().get(), &text));
    return json_loads(text);
  }
  py::str metrics_prometheus() {
    char* text = nullptr;
    check(tier_store_metrics_prometheus(handle().get(), &text));
    return take_string(text);
  }

 private:
  mutable Handle<tier_store> h_{"store"};
  std::string ns_;
  std::uint32_t rank_ = 0;
  std::mutex mu_;  // guards pending_ and taken_early_ (completions may be taken by any thread)
  std::map<std::uint64_t, py::object> pending_;  // ticket -> the batch's buffers
  std::set<std::uint64_t> taken_early_;          // completed before submit() recorded them
};

class Registration {
 public:
  Registration(std::shared_ptr<Store> store, py::object buffer, std::optional<int> kind,
               std::optional<int> device)
      : store_(std::move(store)), buffer_(std::move(buffer)) {
    tier_region r = to_region(buffer_, false);
    if (kind) r.kind = *kind;
    if (device) r.device = *device;
    region_ = Region{reinterpret_cast<std::uintptr_t>(r.ptr), r.bytes, r.kind, r.device};
    auto use = store_->handle();
    int rc;
    {
      // Device memory prepares its GPU's copy resources (a few ms the first time): without the GIL.
      py::gil_scoped_release nogil;
      rc = tier_memory_register(use.get(), r.ptr, r.bytes, r.kind, r.device, &h_);
    }
    check(rc);
  }
  ~Registration() { tier_memory_release(h_); }
  void release() {
    if (!h_) return;
    tier_memory* h = h_;
    h_ = nullptr;
    check(tier_memory_release(h));
  }
  const Region& region() const { return region_; }

 private:
  std::shared_ptr<Store> store_;
  py::object buffer_;
  tier_memory* h_ = nullptr;
  Region region_;
};

// ---- engine -------------------------------------------------------------------------------

struct Boundary {
  std::uint64_t tokens = 0;
  std::string key;
};
std::optional<Boundary> boundary(int has, const tier_boundary& b) {
  if (!has) return std::nullopt;
  return Boundary{b.tokens, hex(b.key)};
}
struct MatchResult {
  std::uint64_t tokens = 0;
  bool park = false;
  std::uint64_t page_hit = 0;
  std::optional<Boundary> slot;
};
struct LoadDecision {
  std::string action, reason;
  std::uint64_t load_start = 0, load_end = 0, handoff_tokens = 0;
};
struct LoadOp {
  std::uint64_t request = 0, generation = 0, page_start = 0, page_end = 0;
  std::vector<std::string> chunk_keys;
  std::vector<std::uint32_t> block_ids;
  std::optional<Boundary> slot;
  int slot_group = -1;
  std::uint64_t lease = 0;
};
struct SaveOp {
  std::uint64_t request = 0, generation = 0, page_start = 0, page_end = 0;
  std::vector<std::string> chunk_keys;
  std::vector<std::uint32_t> block_ids;
  std::optional<Boundary> slot;
  int slot_group = -1;
  std::vector<std::string> prefix_keys;
};
struct OpReport {
  std::string channel;
  std::uint64_t request = 0, generation = 0;
  std::uint32_t rank = 0;
  bool ok = false;
  std::string reason;  // tier_outcome_name(outcome): "" when ok
  int outcome = 0;     // TIER_OUTCOME_*
};

// The outcome a report's reason names ("" is OK), or -1.
int outcome_of(const std::string& reason) {
  for (int i = 0; i < 64; ++i) {
    const char* name = tier_outcome_name(i);
    if (std::strcmp(name, "unknown") == 0) break;
    if (reason == name) return i;
  }
  return -1;
}
struct StepEvents {
  std::vector<std::uint64_t> loaded, load_failed, freeable;
};

const char* const kChannels[] = {"load", "page_save", "slot_save"};
const char* const kActions[] = {"none", "load", "recompute", "handoff"};

std::vector<std::string> hexes(const tier_key* k, std::size_t n) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < n; ++i) out.push_back(hex(k[i]));
  return out;
}

// A bytes-like object's memory (bytes, bytearray, memoryview, a 1-D uint8 array): contiguous
// bytes, read while the object is referenced by the caller.
py::buffer_info contiguous_bytes(py::buffer data) {
  py::buffer_info info = data.request();
  if (info.ndim != 1 || info.itemsize != 1 || info.strides[0] != 1)
    raise_invalid("data: expected contiguous bytes (bytes, bytearray, memoryview)");
  return info;
}

struct StepPlan {
  std::shared_ptr<tier_plan> plan;
  std::uint64_t step() const { return tier_plan_step(plan.get()); }
  bool has_work() const {
    return tier_plan_load_count(plan.get()) + tier_plan_save_count(plan.get()) > 0;
  }
  std::vector<LoadOp> loads() const {
    std::vector<LoadOp> out;
    for (std::size_t i = 0; i < tier_plan_load_count(plan.get()); ++i) {
      tier_load_op op;
      check(tier_plan_load(plan.get(), i, &op));
      out.push_back(LoadOp{op.request, op.generation, op.page_start, op.page_end,
                           hexes(op.chunk_keys, op.chunk_count),
                           std::vector<std::uint32_t>(op.block_ids, op.block_ids + op.block_count),
                           boundary(op.has_slot, op.slot), op.slot_group,
                           tier_plan_load_lease(plan.get(), i)});
    }
    return out;
  }
  std::vector<SaveOp> saves() const {
    std::vector<SaveOp> out;
    for (std::size_t i = 0; i < tier_plan_save_count(plan.get()); ++i) {
      tier_save_op op;
      check(tier_plan_save(plan.get(), i, &op));
      out.push_back(SaveOp{op.request, op.generation, op.page_start, op.page_end,
                           hexes(op.chunk_keys, op.chunk_count),
                           std::vector<std::uint32_t>(op.block_ids, op.block_ids + op.block_count),
                           boundary(op.has_slot, op.slot), op.slot_group,
                           hexes(op.prefix_keys, op.prefix_count)});
    }
    return out;
  }
  // The plan as one wire message (docs/engine.md "Wire format").
  py::bytes encode() const {
    std::uint8_t* out = nullptr;
    std::size_t n = 0;
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = tier_plan_encode(plan.get(), &out, &n);
    }
    check(rc);
    py::bytes b(reinterpret_cast<const char*>(out), n);
    tier_free(out);
    return b;
  }
  static StepPlan decode(py::buffer data) {
    py::buffer_info info = contiguous_bytes(data);
    tier_plan* p = nullptr;
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = tier_plan_decode(info.ptr, static_cast<std::size_t>(info.size), &p);
    }
    check(rc);
    return StepPlan{std::shared_ptr<tier_plan>(p, tier_plan_free)};
  }
};

tier_op_report to_c_report(const OpReport& r) {
  int ch = -1;
  for (int i = 0; i < 3; ++i)
    if (r.channel == kChannels[i]) ch = i;
  if (ch < 0) raise_invalid("unknown channel '" + r.channel + "'");
  return tier_op_report{ch, r.rank, r.request, r.generation, r.ok ? 1 : 0, r.outcome,
                        r.reason.c_str()};
}

// Reports as one wire message, and back.
py::bytes encode_reports(py::iterable reports) {
  std::vector<OpReport> in;
  for (py::handle r : reports) in.push_back(r.cast<OpReport>());
  std::vector<tier_op_report> c;
  for (const OpReport& r : in) c.push_back(to_c_report(r));
  std::uint8_t* out = nullptr;
  std::size_t n = 0;
  check(tier_reports_encode(c.data(), c.size(), &out, &n));
  py::bytes b(reinterpret_cast<const char*>(out), n);
  tier_free(out);
  return b;
}
std::vector<OpReport> decode_reports(py::buffer data) {
  py::buffer_info info = contiguous_bytes(data);
  tier_reports* r = nullptr;
  check(tier_reports_decode(info.ptr, static_cast<std::size_t>(info.size), &r));
  std::size_t n = 0;
  const tier_op_report* c = tier_reports_get(r, &n);
  std::vector<OpReport> out;
  for (std::size_t i = 0; i < n; ++i)
    out.push_back(OpReport{kChannels[c[i].channel], c[i].request, c[i].generation, c[i].rank,
                           c[i].ok != 0, c[i].reason, c[i].outcome});
  tier_reports_free(r);
  return out;
}

class Dsv4Layout {
 public:
  Dsv4Layout(py::object geometry, py::handle page_ns, std::uint32_t tp_size,
             std::uint32_t tp_rank, const std::string& memory, int device) {
    std::string geo = py::isinstance<py::str>(geometry) ? geometry.cast<std::string>()
                                                         : dumps(geometry);
    tier_key ns = to_key(page_ns);
    py::dict options;
    options["memory"] = memory;
    options["device"] = device;
    std::string opts = dumps(options);
    tier_dsv4_layout* h = nullptr;
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = tier_dsv4_layout_create(geo.c_str(), &ns, tp_size, tp_rank, opts.c_str(), &h);
    }
    check(rc);
    h_.set(h);
  }
  ~Dsv4Layout() { close(); }
  // The layout's memory stays while a Worker made over it lives (the regions handed out before
  // stay valid as long); any thread.
  void close() {
    if (tier_dsv4_layout* h = h_.take()) tier_dsv4_layout_destroy(h);
  }
  Handle<tier_dsv4_layout>::Use handle() const { return h_.use(); }
  std::vector<Region> page_regions(py::handle block_ids) const {
    auto ids = to_u32(block_ids, "block_ids");
    auto use = handle();
    std::size_t n = 0;
    check(tier_dsv4_layout_page_regions(use.get(), ids.data(), ids.size(), nullptr, 0, &n));
    std::vector<tier_region> r(n);
    check(tier_dsv4_layout_page_regions(use.get(), ids.data(), ids.size(), r.data(), n, &n));
    return convert(r);
  }
  std::vector<Region> slot_regions(int group) const {
    auto use = handle();
    std::size_t n = 0;
    check(tier_dsv4_layout_slot_regions(use.get(), group, nullptr, 0, &n));
    std::vector<tier_region> r(n);
    check(tier_dsv4_layout_slot_regions(use.get(), group, r.data(), n, &n));
    return convert(r);
  }

 private:
  static std::vector<Region> convert(const std::vector<tier_region>& r) {
    std::vector<Region> out;
    for (const tier_region& x : r)
      out.push_back(Region{reinterpret_cast<std::uintptr_t>(x.ptr), x.bytes, x.kind, x.device});
    return out;
  }
  mutable Handle<tier_dsv4_layout> h_{"layout"};
};

std::string config_text(py::handle config) { return config.is_none() ? "{}" : dumps(config); }

class Worker {
 public:
  Worker(py::object config, std::uint32_t rank, std::shared_ptr<Store> store,
         std::shared_ptr<Dsv4Layout> layout, py::handle page_ns)
      : store_(std::move(store)), layout_(std::move(layout)), rank_(rank) {
    std::string cfg = config_text(config);
    tier_key ns = to_key(page_ns);
    tier_worker* h = nullptr;
    check(tier_worker_create(cfg.c_str(), &ns, rank, store_->handle().get(),
                             layout_->handle().get(), &h));
    h_.set(h);
  }
  ~Worker() { close(); }
  // The C worker stays while a Scheduler made over it lives; any thread.
  void close() {
    if (tier_worker* h = h_.take()) {
      py::gil_scoped_release nogil;
      tier_worker_destroy(h);
    }
  }
  Handle<tier_worker>::Use handle() const { return h_.use(); }
  std::uint32_t rank() const { return rank_; }
  void submit(const StepPlan& plan, std::uintptr_t stream, std::uintptr_t event) {
    auto use = handle();
    tier_worker* h = use.get();
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = tier_worker_submit_after(h, plan.plan.get(), reinterpret_cast<void*>(stream),
                                    reinterpret_cast<void*>(event));
    }
    check(rc);
  }
  std::size_t progress(std::optional<std::size_t> max_saves) {
    auto use = handle();
    tier_worker* h = use.get();
    std::size_t done = 0;
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = tier_worker_progress(h, max_saves.value_or(SIZE_MAX), &done);
    }
    check(rc);
    return done;
  }
  std::vector<OpReport> take_reports() {
    std::vector<OpReport> out;
    tier_op_report buf[64];
    for (;;) {
      std::size_t n = 0;
      check(tier_worker_take_reports(handle().get(), buf, 64, &n));
      for (std::size_t i = 0; i < n; ++i)
        out.push_back(OpReport{kChannels[buf[i].channel], buf[i].request, buf[i].generation,
                               buf[i].rank, buf[i].ok != 0, buf[i].reason, buf[i].outcome});
      if (n < 64) return out;
    }
  }
  std::size_t queued_saves() const { return tier_worker_queued_saves(handle().get()); }
  std::size_t queued_loads() const { return tier_worker_queued_loads(handle().get()); }
  void release_lease(std::uint64_t lease) { check(tier_worker_release_lease(handle().get(), lease)); }
  py::object metrics() {
    char* text = nullptr;
    check(tier_worker_metrics_json(handle().get(), &text));
    return json_loads(text);
  }

 private:
  std::shared_ptr<Store> store_;
  std::shared_ptr<Dsv4Layout> layout_;
  mutable Handle<tier_worker> h_{"worker"};
  std::uint32_t rank_;
};

// The C handles of `ws`, each held by a use in `uses` while the caller passes them on.
std::vector<tier_worker*> worker_handles(const std::vector<std::shared_ptr<Worker>>& ws,
                                         std::vector<Handle<tier_worker>::Use>& uses) {
  std::vector<tier_worker*> out;
  for (const auto& w : ws) {
    uses.push_back(w->handle());
    out.push_back(uses.back().get());
  }
  return out;
}

class Scheduler {
 public:
  Scheduler(py::object config, std::shared_ptr<Worker> view, py::handle page_ns)
      : view_(std::move(view)) {
    std::string cfg = config_text(config);
    tier_key ns = to_key(page_ns);
    tier_scheduler* h = nullptr;
    check(tier_scheduler_create(cfg.c_str(), &ns, view_->handle().get(), &h));
    h_.set(h);
  }
  ~Scheduler() { close(); }
  // Any thread, also while others are inside calls (they finish first).
  void close() {
    if (tier_scheduler* h = h_.take()) {
      py::gil_scoped_release nogil;
      tier_scheduler_destroy(h);
    }
  }
  Handle<tier_scheduler>::Use handle() const { return h_.use(); }
  std::uint64_t add_request(std::uint64_t id, py::handle prompt, py::object extra_key) {
    auto p = to_u32(prompt, "prompt");
    const std::string extra = extra_key_bytes(extra_key);
    std::uint64_t h = 0;
    check(tier_scheduler_add_request_extra(handle().get(), id, p.data(), p.size(), extra.data(),
                                           extra.size(), &h));
    return h;
  }
  std::uint32_t epoch() { return tier_scheduler_epoch(handle().get()); }
  MatchResult lookup(std::uint64_t h) {
    tier_match m;
    auto use = handle();
    tier_scheduler* s = use.get();
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = tier_scheduler_lookup(s, h, &m);
    }
    check(rc);
    return MatchResult{m.tokens, m.park != 0, m.page_hit, boundary(m.has_slot, m.slot)};
  }
  LoadDecision after_alloc(std::uint64_t h, std::uint64_t local, py::handle blocks, int group) {
    auto b = to_u32(blocks, "blocks");
    tier_load_decision d;
    auto use = handle();
    tier_scheduler* s = use.get();
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = tier_scheduler_after_alloc(s, h, local, b.data(), b.size(), group, &d);
    }
    check(rc);
    return LoadDecision{kActions[d.action], d.reason, d.load_start, d.load_end, d.handoff_tokens};
  }
  void set_blocks(std::uint64_t h, py::handle blocks) {
    auto b = to_u32(blocks, "blocks");
    check(tier_scheduler_set_blocks(handle().get(), h, b.data(), b.size()));
  }
  std::uint64_t cut_prefill_chunk(std::uint64_t h, std::uint64_t start, std::uint64_t len) {
    std::uint64_t out = 0;
    check(tier_scheduler_cut_prefill_chunk(handle().get(), h, start, len, &out));
    return out;
  }
  void on_computed(std::uint64_t h, std::uint64_t tokens) {
    check(tier_scheduler_on_computed(handle().get(), h, tokens));
  }
  StepPlan build_step() {
    tier_plan* p = nullptr;
    auto use = handle();
    tier_scheduler* s = use.get();
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = tier_scheduler_build_step(s, &p);
    }
    check(rc);
    return StepPlan{std::shared_ptr<tier_plan>(p, tier_plan_free)};
  }
  StepEvents process(py::iterable reports) {
    std::vector<OpReport> in;
    for (py::handle r : reports) in.push_back(r.cast<OpReport>());
    std::vector<tier_op_report> c;
    for (const OpReport& r : in) c.push_back(to_c_report(r));
    tier_events* ev = nullptr;
    auto use = handle();
    tier_scheduler* s = use.get();
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = tier_scheduler_process(s, c.data(), c.size(), &ev);
    }
    check(rc);
    StepEvents out;
    std::size_t n = 0;
    const std::uint64_t* p = tier_events_loaded(ev, &n);
    out.loaded.assign(p, p + n);
    p = tier_events_load_failed(ev, &n);
    out.load_failed.assign(p, p + n);
    p = tier_events_freeable(ev, &n);
    out.freeable.assign(p, p + n);
    tier_events_free(ev);
    return out;
  }
  bool should_defer_free(std::uint64_t h) {
    std::int32_t out = 0;
    check(tier_scheduler_should_defer_free(handle().get(), h, &out));
    return out != 0;
  }
  bool finish(std::uint64_t h) {
    std::int32_t out = 0;
    check(tier_scheduler_finish(handle().get(), h, &out));
    return out != 0;
  }
  std::uint64_t loads_pending() { return tier_scheduler_loads_pending(handle().get()); }
  std::uint64_t saves_pending() { return tier_scheduler_saves_pending(handle().get()); }
  py::object metrics(const std::vector<std::shared_ptr<Worker>>& workers) {
    std::vector<Handle<tier_worker>::Use> uses;
    auto ws = worker_handles(workers, uses);
    char* text = nullptr;
    check(tier_engine_metrics_json(handle().get(), ws.data(), ws.size(), &text));
    return json_loads(text);
  }
  py::str metrics_prometheus(const std::vector<std::shared_ptr<Worker>>& workers) {
    std::vector<Handle<tier_worker>::Use> uses;
    auto ws = worker_handles(workers, uses);
    char* text = nullptr;
    check(tier_engine_metrics_prometheus(handle().get(), ws.data(), ws.size(), &text));
    return take_string(text);
  }

 private:
  std::shared_ptr<Worker> view_;
  mutable Handle<tier_scheduler> h_{"scheduler"};
};

// ---- sizing -------------------------------------------------------------------------------

class MissRatioCurve {
 public:
  MissRatioCurve(tier_curve* c, std::uint64_t block_bytes) : c_(c, tier_curve_free), block_bytes_(block_bytes) {}
  std::uint64_t requests() const { return tier_curve_requests(c_.get()); }
  std::uint64_t blocks() const { return tier_curve_blocks(c_.get()); }
  std::uint64_t tracked_blocks() const { return tier_curve_tracked_blocks(c_.get()); }
  bool exact() const { return tier_curve_sample_rate(c_.get()) == 1.0; }
  double sample_rate() const { return tier_curve_sample_rate(c_.get()); }
  std::uint64_t block_bytes() const { return block_bytes_; }
  std::uint64_t image_bytes() const { return block_bytes_ + kHeaderBytes; }
  std::uint64_t saturation() const { return tier_curve_saturation(c_.get()); }
  double max_hit_ratio() const { return hit_ratio(saturation()); }
  std::optional<std::pair<std::uint64_t, double>> knee() const {
    std::uint64_t b = 0;
    double r = 0;
    if (!tier_curve_knee(c_.get(), &b, &r)) return std::nullopt;
    return std::make_pair(b, r);
  }
  double hit_ratio(std::uint64_t blocks) const { return tier_curve_hit_ratio(c_.get(), blocks); }
  double error(std::uint64_t blocks) const { return tier_curve_error(c_.get(), blocks); }
  std::uint64_t capacity_bytes(std::uint64_t blocks) const {
    const std::uint64_t per = image_bytes();
    return blocks > UINT64_MAX / per ? UINT64_MAX : blocks * per;
  }
  std::vector<std::pair<std::uint64_t, double>> steps() const {
    std::size_t n = 0;
    check(tier_curve_steps(c_.get(), nullptr, nullptr, 0, &n));
    std::vector<std::uint64_t> b(n);
    std::vector<double> r(n);
    check(tier_curve_steps(c_.get(), b.data(), r.data(), n, &n));
    std::vector<std::pair<std::uint64_t, double>> out;
    for (std::size_t i = 0; i < n; ++i) out.emplace_back(b[i], r[i]);
    return out;
  }

 private:
  static constexpr std::uint64_t kHeaderBytes = 96;  // docs/object-format.md
  std::shared_ptr<tier_curve> c_;
  std::uint64_t block_bytes_;
};

MissRatioCurve miss_ratio_curve(py::object trace, std::uint64_t block_bytes, double sample,
                                std::uint64_t max_tracked) {
  if (block_bytes == 0) raise_invalid("block_bytes must be > 0");
  const std::string path = py::str(py::module_::import("os").attr("fspath")(trace));
  tier_curve* c = nullptr;
  int rc;
  {
    py::gil_scoped_release nogil;
    rc = tier_curve_from_trace(path.c_str(), sample, max_tracked, &c);
  }
  check(rc);
  return MissRatioCurve(c, block_bytes);
}

}  // namespace

PYBIND11_MODULE(_libtier, m) {
  // Each docstring starts with the stub's own signature line (gen_docs.py), not pybind11's.
  py::options options;
  options.disable_function_signatures();
  m.doc() = "libtier's C API (tier/tier.h) as Python objects; see libtier/__init__.pyi.";
  if (tier_abi_version() != TIER_C_ABI_VERSION)
    throw std::runtime_error("libtier_c ABI " + std::to_string(tier_abi_version()) +
                             ", the extension was built for " +
                             std::to_string(TIER_C_ABI_VERSION));
  m.attr("ABI_VERSION") = TIER_C_ABI_VERSION;

  // The log's plumbing, for python/libtier/_log.py (not public).
  m.def("_take_logs", &take_logs, py::arg("timeout"));
  m.def("_log_counts", [] {
    LogQueue& q = *g_logs.load();
    std::lock_guard<std::mutex> lock(q.mu);
    return py::make_tuple(q.queued, q.taken);
  });
  m.def("_log_route", [] { tier_log_set_sink(queue_log, nullptr); });
  m.def("_log_close", [] {
    tier_log_set_sink(nullptr, nullptr);
    LogQueue& q = *g_logs.load();
    {
      std::lock_guard<std::mutex> lock(q.mu);
      q.closed = true;
    }
    q.cv.notify_all();
  });
  m.def("_log_after_fork", [] { g_logs.store(new LogQueue); });
  m.def("_set_log_level", [](int level) { check(tier_log_set_level(level)); });
  m.def("_log_level", &tier_log_level);
  m.def("abi_version", &tier_abi_version, doc("abi_version"));
  m.def("version", [] { return std::string(tier_version()); }, doc("version"));

  py::object int_enum = py::module_::import("enum").attr("IntEnum");
  py::dict kinds;
  kinds["HOST"] = static_cast<int>(TIER_MEMORY_HOST);
  kinds["PINNED"] = static_cast<int>(TIER_MEMORY_PINNED);
  kinds["DEVICE"] = static_cast<int>(TIER_MEMORY_DEVICE);
  kinds["SHM"] = static_cast<int>(TIER_MEMORY_SHM);
  py::object memory_kind = int_enum("MemoryKind", kinds, py::arg("module") = "libtier");
  memory_kind.attr("__doc__") = doc("MemoryKind");
  m.attr("MemoryKind") = memory_kind;

  py::class_<Region>(m, "Region", doc("Region"))
      .def(py::init([](py::handle ptr, py::handle nbytes, py::handle kind, py::handle device) {
             const auto k = static_cast<int>(to_u64(kind, "kind (a MemoryKind)", TIER_MEMORY_SHM));
             // -1 (no device) or an ordinal
             const bool no_device =
                 py::isinstance<py::int_>(device) && device.cast<py::int_>().equal(py::int_(-1));
             const int d = no_device ? -1 : static_cast<int>(to_u64(device, "device", INT32_MAX));
             return Region{to_u64(ptr, "ptr", UINTPTR_MAX), to_u64(nbytes, "nbytes", SIZE_MAX), k,
                           d};
           }),
           py::arg("ptr"), py::arg("nbytes"), py::arg("kind") = static_cast<int>(TIER_MEMORY_HOST),
           py::arg("device") = -1, doc("Region.__init__"))
      .def_property_readonly("ptr", [](const Region& r) { return r.ptr; }, doc("Region.ptr"))
      .def_property_readonly("nbytes", [](const Region& r) { return r.nbytes; },
                             doc("Region.nbytes"))
      .def_property_readonly("kind",
                             [memory_kind](const Region& r) { return memory_kind(r.kind); },
                             doc("Region.kind"))
      .def_property_readonly("device", [](const Region& r) { return r.device; },
                             doc("Region.device"))
      .def("__repr__", [](const Region& r) {
        return "Region(ptr=" + std::to_string(r.ptr) + ", nbytes=" + std::to_string(r.nbytes) +
               ", kind=" + std::to_string(r.kind) + ", device=" + std::to_string(r.device) + ")";
      });
  m.def("region_of", [](py::handle b) {
    tier_region r = to_region(b, false);
    return Region{reinterpret_cast<std::uintptr_t>(r.ptr), r.bytes, r.kind, r.device};
  }, py::arg("buffer"), doc("region_of"));

  m.def("namespace_id", [](py::object identity) {
    std::string text = py::isinstance<py::str>(identity) ? identity.cast<std::string>()
                                                          : dumps(identity);
    tier_key k;
    check(tier_namespace_id(text.c_str(), &k));
    return hex(k);
  }, py::arg("identity"), doc("namespace_id"));
  m.def("chunk_keys", [](py::object ns, py::handle tokens, std::size_t chunk, bool partial,
                         py::object extra_key) {
    tier_key k = py::isinstance<py::dict>(ns) ? namespace_of(ns) : to_key(ns);
    auto t = to_u32(tokens, "tokens");
    const std::string extra = extra_key_bytes(extra_key);
    std::size_t n = 0;
    check(tier_chunk_keys_extra(&k, t.data(), t.size(), chunk, partial, extra.data(),
                                extra.size(), nullptr, 0, &n));
    std::vector<tier_key> out(n);
    check(tier_chunk_keys_extra(&k, t.data(), t.size(), chunk, partial, extra.data(),
                                extra.size(), out.data(), n, &n));
    return hexes(out.data(), n);
  }, py::arg("namespace"), py::arg("tokens"), py::arg("chunk"), py::arg("include_partial") = false,
     py::arg("extra_key") = py::none(), doc("chunk_keys"));
  m.def("encode_reports", &encode_reports, py::arg("reports"), doc("encode_reports"));
  m.def("decode_reports", &decode_reports, py::arg("data"), doc("decode_reports"));
  m.def("external_key", [](py::object name) {
    std::string b = py::isinstance<py::str>(name) ? name.cast<std::string>()
                                                   : py::bytes(name).cast<std::string>();
    tier_key k;
    tier_external_key(b.data(), b.size(), &k);
    return hex(k);
  }, py::arg("name"), doc("external_key"));

  py::class_<Completion>(m, "Completion", doc("Completion"))
      .def_readonly("ticket", &Completion::ticket, doc("Completion.ticket"))
      .def_readonly("op", &Completion::op, doc("Completion.op"))
      .def_readonly("codes", &Completion::codes, doc("Completion.codes"))
      .def_readonly("tiers", &Completion::tiers, doc("Completion.tiers"))
      .def_readonly("ok", &Completion::ok, doc("Completion.ok"));

  py::class_<ObjectStat>(m, "ObjectStat", doc("ObjectStat"))
      .def_readonly("tier", &ObjectStat::tier, doc("ObjectStat.tier"))
      .def_readonly("tier_name", &ObjectStat::tier_name, doc("ObjectStat.tier_name"))
      .def_readonly("nbytes", &ObjectStat::nbytes, doc("ObjectStat.nbytes"))
      .def_readonly("stored_bytes", &ObjectStat::stored_bytes, doc("ObjectStat.stored_bytes"))
      .def("__repr__", [](const ObjectStat& o) {
        return "ObjectStat(tier=" + std::to_string(o.tier) + ", tier_name='" + o.tier_name +
               "', nbytes=" + std::to_string(o.nbytes) +
               ", stored_bytes=" + std::to_string(o.stored_bytes) + ")";
      });

  py::class_<Store, std::shared_ptr<Store>>(m, "Store", doc("Store"))
      .def_static("open", &Store::open, py::arg("profile"), py::kw_only(),
                  py::arg("namespace") = py::none(), py::arg("rank") = 0, doc("Store.open"))
      .def("close", &Store::close, doc("Store.close"))
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](Store& s, py::args) { s.close(); })
      .def_property_readonly("closed", &Store::closed, doc("Store.closed"))
      .def_property_readonly("namespace", &Store::ns, doc("Store.namespace"))
      .def_property_readonly("rank", &Store::rank, doc("Store.rank"))
      .def_property_readonly("tier_names", &Store::tier_names, doc("Store.tier_names"))
      .def_property_readonly("metrics_endpoint", &Store::metrics_endpoint,
                             doc("Store.metrics_endpoint"))
      .def("lookup_prefix", &Store::lookup_prefix, py::arg("keys"), doc("Store.lookup_prefix"))
      .def("exists", &Store::exists, py::arg("keys"), doc("Store.exists"))
      .def("stat", &Store::stat, py::arg("keys"), doc("Store.stat"))
      .def("save", &Store::save, py::arg("keys"), py::arg("buffers"), doc("Store.save"))
      .def("load", &Store::load, py::arg("keys"), py::arg("buffers"), doc("Store.load"))
      .def("load_with_tiers", &Store::load_with_tiers, py::arg("keys"), py::arg("buffers"),
           doc("Store.load_with_tiers"))
      .def("save_async", [](Store& s, py::handle k, py::handle b) { return s.submit(k, b, false); },
           py::arg("keys"), py::arg("buffers"), doc("Store.save_async"))
      .def("load_async", [](Store& s, py::handle k, py::handle b) { return s.submit(k, b, true); },
           py::arg("keys"), py::arg("buffers"), doc("Store.load_async"))
      .def("poll", &Store::poll, doc("Store.poll"))
      .def("wait", &Store::wait, py::arg("ticket") = py::none(), py::arg("timeout") = py::none(),
           doc("Store.wait"))
      .def("remove", &Store::remove, py::arg("keys"), doc("Store.remove"))
      .def("clear", &Store::clear, doc("Store.clear"))
      .def("progress", &Store::progress, doc("Store.progress"))
      .def("flush", &Store::flush, py::arg("timeout") = py::none(), doc("Store.flush"))
      .def("register",
           [](std::shared_ptr<Store> s, py::object buffer, std::optional<int> kind,
              std::optional<int> device) {
             return std::make_shared<Registration>(std::move(s), std::move(buffer), kind, device);
           },
           py::arg("buffer"), py::arg("kind") = py::none(), py::arg("device") = py::none(),
           doc("Store.register"))
      .def("metrics", &Store::metrics, doc("Store.metrics"))
      .def("metrics_prometheus", &Store::metrics_prometheus, doc("Store.metrics_prometheus"));

  py::class_<Registration, std::shared_ptr<Registration>>(m, "Registration", doc("Registration"))
      .def_property_readonly("region", &Registration::region, doc("Registration.region"))
      .def("release", &Registration::release, doc("Registration.release"))
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](Registration& r, py::args) { r.release(); });

  py::class_<Boundary>(m, "Boundary", doc("Boundary"))
      .def_readonly("tokens", &Boundary::tokens)
      .def_readonly("key", &Boundary::key);
  py::class_<MatchResult>(m, "MatchResult", doc("MatchResult"))
      .def_readonly("tokens", &MatchResult::tokens)
      .def_readonly("park", &MatchResult::park)
      .def_readonly("page_hit", &MatchResult::page_hit)
      .def_readonly("slot", &MatchResult::slot);
  py::class_<LoadDecision>(m, "LoadDecision", doc("LoadDecision"))
      .def_readonly("action", &LoadDecision::action)
      .def_readonly("reason", &LoadDecision::reason)
      .def_readonly("load_start", &LoadDecision::load_start)
      .def_readonly("load_end", &LoadDecision::load_end)
      .def_readonly("handoff_tokens", &LoadDecision::handoff_tokens);
  py::class_<LoadOp>(m, "LoadOp", doc("LoadOp"))
      .def_readonly("request", &LoadOp::request)
      .def_readonly("generation", &LoadOp::generation)
      .def_readonly("page_start", &LoadOp::page_start)
      .def_readonly("page_end", &LoadOp::page_end)
      // Deprecated names of page_start/page_end (0.1.0), kept for one release (CHANGELOG.md).
      .def_property_readonly("hbm_tokens",
                             [](const LoadOp& o) {
                               deprecated("LoadOp.hbm_tokens", "LoadOp.page_start");
                               return o.page_start;
                             })
      .def_property_readonly("lmc_tokens",
                             [](const LoadOp& o) {
                               deprecated("LoadOp.lmc_tokens", "LoadOp.page_end");
                               return o.page_end;
                             })
      .def_readonly("chunk_keys", &LoadOp::chunk_keys)
      .def_readonly("block_ids", &LoadOp::block_ids)
      .def_readonly("slot", &LoadOp::slot)
      .def_readonly("slot_group", &LoadOp::slot_group)
      .def_readonly("lease", &LoadOp::lease);
  py::class_<SaveOp>(m, "SaveOp", doc("SaveOp"))
      .def_readonly("request", &SaveOp::request)
      .def_readonly("generation", &SaveOp::generation)
      .def_readonly("page_start", &SaveOp::page_start)
      .def_readonly("page_end", &SaveOp::page_end)
      .def_readonly("chunk_keys", &SaveOp::chunk_keys)
      .def_readonly("block_ids", &SaveOp::block_ids)
      .def_readonly("slot", &SaveOp::slot)
      .def_readonly("slot_group", &SaveOp::slot_group)
      .def_readonly("prefix_keys", &SaveOp::prefix_keys);
  py::class_<StepPlan>(m, "StepPlan", doc("StepPlan"))
      .def_property_readonly("step", &StepPlan::step, doc("StepPlan.step"))
      .def_property_readonly("has_work", &StepPlan::has_work, doc("StepPlan.has_work"))
      .def_property_readonly("loads", &StepPlan::loads, doc("StepPlan.loads"))
      .def_property_readonly("saves", &StepPlan::saves, doc("StepPlan.saves"))
      .def("encode", &StepPlan::encode, doc("StepPlan.encode"))
      .def_static("decode", &StepPlan::decode, py::arg("data"), doc("StepPlan.decode"));
  py::class_<OpReport>(m, "OpReport", doc("OpReport"))
      .def(py::init([](std::string channel, std::uint64_t request, std::uint64_t generation,
                       std::uint32_t rank, bool ok, std::string reason) {
             // A failed report names its outcome by its stable reason string.
             const int outcome = outcome_of(reason);
             if (outcome < 0) raise_invalid("unknown report reason '" + reason + "'");
             if (ok != (outcome == 0))
               raise_invalid(ok ? "an ok report has no reason"
                                : "a failed report needs its reason (docs/engine.md)");
             return OpReport{std::move(channel), request, generation, rank, ok, std::move(reason),
                             outcome};
           }),
           py::arg("channel"), py::arg("request"), py::arg("generation"), py::arg("rank"),
           py::arg("ok"), py::arg("reason") = "", doc("OpReport.__init__"))
      .def_readonly("channel", &OpReport::channel)
      .def_readonly("request", &OpReport::request)
      .def_readonly("generation", &OpReport::generation)
      .def_readonly("rank", &OpReport::rank)
      .def_readonly("ok", &OpReport::ok)
      .def_readonly("reason", &OpReport::reason)
      .def_readonly("outcome", &OpReport::outcome);
  py::class_<StepEvents>(m, "StepEvents", doc("StepEvents"))
      .def_readonly("loaded", &StepEvents::loaded)
      .def_readonly("load_failed", &StepEvents::load_failed)
      .def_readonly("freeable", &StepEvents::freeable);

  py::class_<Dsv4Layout, std::shared_ptr<Dsv4Layout>>(m, "Dsv4Layout", doc("Dsv4Layout"))
      .def_static("create",
                  [](py::object geometry, py::object ns, std::uint32_t tp_size,
                     std::uint32_t tp_rank, const std::string& memory, int device) {
                    return std::make_shared<Dsv4Layout>(geometry, ns, tp_size, tp_rank, memory,
                                                        device);
                  },
                  py::arg("geometry"), py::arg("page_namespace"), py::arg("tp_size") = 1,
                  py::arg("tp_rank") = 0, py::arg("memory") = "host", py::arg("device") = 0,
                  doc("Dsv4Layout.create"))
      .def_property_readonly(
          "block_tokens",
          [](const Dsv4Layout& l) { return tier_dsv4_layout_block_tokens(l.handle().get()); },
          doc("Dsv4Layout.block_tokens"))
      .def_property_readonly(
          "page_bytes_per_block",
          [](const Dsv4Layout& l) { return tier_dsv4_layout_page_bytes_per_block(l.handle().get()); },
          doc("Dsv4Layout.page_bytes_per_block"))
      .def_property_readonly(
          "slot_bytes",
          [](const Dsv4Layout& l) { return tier_dsv4_layout_slot_bytes(l.handle().get()); },
          doc("Dsv4Layout.slot_bytes"))
      .def("page_regions", &Dsv4Layout::page_regions, py::arg("block_ids"),
           doc("Dsv4Layout.page_regions"))
      .def("slot_regions", &Dsv4Layout::slot_regions, py::arg("group"),
           doc("Dsv4Layout.slot_regions"))
      .def("close", &Dsv4Layout::close, doc("Dsv4Layout.close"));

  py::class_<Worker, std::shared_ptr<Worker>>(m, "Worker", doc("Worker"))
      .def_static("create",
                  [](py::object config, std::uint32_t rank, std::shared_ptr<Store> store,
                     std::shared_ptr<Dsv4Layout> layout, py::object ns) {
                    return std::make_shared<Worker>(config, rank, std::move(store),
                                                    std::move(layout), ns);
                  },
                  py::arg("config"), py::arg("rank"), py::arg("store"), py::arg("layout"),
                  py::arg("page_namespace"), doc("Worker.create"))
      .def_property_readonly("rank", &Worker::rank, doc("Worker.rank"))
      .def("submit", &Worker::submit, py::arg("plan"), py::arg("stream") = 0,
           py::arg("event") = 0, doc("Worker.submit"))
      .def("progress", &Worker::progress, py::arg("max_saves") = py::none(),
           doc("Worker.progress"))
      .def("take_reports", &Worker::take_reports, doc("Worker.take_reports"))
      .def_property_readonly("queued_saves", &Worker::queued_saves, doc("Worker.queued_saves"))
      .def_property_readonly("queued_loads", &Worker::queued_loads, doc("Worker.queued_loads"))
      .def("release_lease", &Worker::release_lease, py::arg("lease"), doc("Worker.release_lease"))
      .def("metrics", &Worker::metrics, doc("Worker.metrics"))
      .def("close", &Worker::close, doc("Worker.close"));

  py::class_<Scheduler, std::shared_ptr<Scheduler>>(m, "Scheduler", doc("Scheduler"))
      .def_static("create",
                  [](py::object config, std::shared_ptr<Worker> view, py::object ns) {
                    return std::make_shared<Scheduler>(config, std::move(view), ns);
                  },
                  py::arg("config"), py::arg("view"), py::arg("page_namespace"),
                  doc("Scheduler.create"))
      .def("add_request", &Scheduler::add_request, py::arg("request_id"), py::arg("prompt"),
           py::arg("extra_key") = py::none(), doc("Scheduler.add_request"))
      .def_property_readonly("epoch", &Scheduler::epoch, doc("Scheduler.epoch"))
      .def("lookup", &Scheduler::lookup, py::arg("handle"), doc("Scheduler.lookup"))
      .def("after_alloc", &Scheduler::after_alloc, py::arg("handle"), py::arg("local_tokens"),
           py::arg("blocks"), py::arg("group") = -1, doc("Scheduler.after_alloc"))
      // The keyword's deprecated name (0.1.0), kept for one release (CHANGELOG.md).
      .def(
          "after_alloc",
          [](Scheduler& s, std::uint64_t h, std::uint64_t local, py::handle blocks, int group) {
            deprecated("Scheduler.after_alloc(hbm_tokens=...)", "local_tokens=");
            return s.after_alloc(h, local, blocks, group);
          },
          py::arg("handle"), py::arg("hbm_tokens"), py::arg("blocks"), py::arg("group") = -1)
      .def("set_blocks", &Scheduler::set_blocks, py::arg("handle"), py::arg("blocks"),
           doc("Scheduler.set_blocks"))
      .def("cut_prefill_chunk", &Scheduler::cut_prefill_chunk, py::arg("handle"),
           py::arg("start"), py::arg("length"), doc("Scheduler.cut_prefill_chunk"))
      .def("on_computed", &Scheduler::on_computed, py::arg("handle"),
           py::arg("computed_tokens"), doc("Scheduler.on_computed"))
      .def("build_step", &Scheduler::build_step, doc("Scheduler.build_step"))
      .def("process", &Scheduler::process, py::arg("reports"), doc("Scheduler.process"))
      .def("should_defer_free", &Scheduler::should_defer_free, py::arg("handle"),
           doc("Scheduler.should_defer_free"))
      .def("finish", &Scheduler::finish, py::arg("handle"), doc("Scheduler.finish"))
      .def_property_readonly("loads_pending", &Scheduler::loads_pending,
                             doc("Scheduler.loads_pending"))
      .def_property_readonly("saves_pending", &Scheduler::saves_pending,
                             doc("Scheduler.saves_pending"))
      .def("metrics", &Scheduler::metrics,
           py::arg("workers") = std::vector<std::shared_ptr<Worker>>{}, doc("Scheduler.metrics"))
      .def("metrics_prometheus", &Scheduler::metrics_prometheus,
           py::arg("workers") = std::vector<std::shared_ptr<Worker>>{},
           doc("Scheduler.metrics_prometheus"))
      .def("close", &Scheduler::close, doc("Scheduler.close"));

  py::class_<MissRatioCurve>(m, "MissRatioCurve", doc("MissRatioCurve"))
      .def_property_readonly("requests", &MissRatioCurve::requests, doc("MissRatioCurve.requests"))
      .def_property_readonly("blocks", &MissRatioCurve::blocks, doc("MissRatioCurve.blocks"))
      .def_property_readonly("tracked_blocks", &MissRatioCurve::tracked_blocks,
                             doc("MissRatioCurve.tracked_blocks"))
      .def_property_readonly("exact", &MissRatioCurve::exact, doc("MissRatioCurve.exact"))
      .def_property_readonly("sample_rate", &MissRatioCurve::sample_rate,
                             doc("MissRatioCurve.sample_rate"))
      .def_property_readonly("block_bytes", &MissRatioCurve::block_bytes,
                             doc("MissRatioCurve.block_bytes"))
      .def_property_readonly("image_bytes", &MissRatioCurve::image_bytes,
                             doc("MissRatioCurve.image_bytes"))
      .def_property_readonly("saturation", &MissRatioCurve::saturation,
                             doc("MissRatioCurve.saturation"))
      .def_property_readonly("max_hit_ratio", &MissRatioCurve::max_hit_ratio,
                             doc("MissRatioCurve.max_hit_ratio"))
      .def_property_readonly("knee", &MissRatioCurve::knee, doc("MissRatioCurve.knee"))
      .def("hit_ratio", &MissRatioCurve::hit_ratio, py::arg("blocks"),
           doc("MissRatioCurve.hit_ratio"))
      .def("miss_ratio", [](const MissRatioCurve& c, std::uint64_t b) { return 1.0 - c.hit_ratio(b); },
           py::arg("blocks"), doc("MissRatioCurve.miss_ratio"))
      .def("error", &MissRatioCurve::error, py::arg("blocks"), doc("MissRatioCurve.error"))
      .def("capacity_bytes", &MissRatioCurve::capacity_bytes, py::arg("blocks"),
           doc("MissRatioCurve.capacity_bytes"))
      .def("steps", &MissRatioCurve::steps, doc("MissRatioCurve.steps"));
  m.def("miss_ratio_curve", &miss_ratio_curve, py::arg("trace"), py::kw_only(),
        py::arg("block_bytes") = 65536, py::arg("sample") = 1.0,
        py::arg("max_tracked") = std::uint64_t{1} << 25, doc("miss_ratio_curve"));
}
