// An eager test device on PyTorch's PrivateUse1 key, for fastai_xla's tests (tests/eager_tpu.py builds it, loads it and
// names it `tpu`). Its memory is the host's, but its tensors are a device's: their device is `tpu:0`, an op on them
// runs here, and an op mixing them with a host tensor (other than a 0-dim scalar) is refused, as CUDA and TorchTPU
// refuse it. Each op runs eagerly, one at a time, on host tensors that alias the device's memory (no copy for inputs
// and in-place results; new results are copied into device memory). It is synchronous: nothing here is asynchronous.
//
// The pieces PyTorch asks of an out-of-tree device (see PyTorch's OpenReg for a fuller one):
//   an allocator, a device guard, hooks (availability, generators), kernels for the ops that make or view tensors
//   (empty, empty_strided, view, as_strided, resize_, set_, _copy_from), and a boxed fallback for every other op.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/autocast_mode.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace eager_tpu {

constexpr c10::DeviceType kDevice = c10::DeviceType::PrivateUse1;
const c10::Device kDevice0(kDevice, 0);   // one device per process, as TorchTPU gives each process its chip as tpu:0

std::atomic<int64_t> ops_on_device{0};    // ops the fallback ran (a test can see that work went through the device)

// ---- memory: host memory, handed out as the device's ----
struct DeviceAllocator final : c10::Allocator {
  static void release(void* ptr) { std::free(ptr); }
  c10::DataPtr allocate(size_t nbytes) override {
    void* data = nbytes ? std::malloc(nbytes) : nullptr;
    TORCH_CHECK(!nbytes || data, "eager tpu test device: out of memory allocating ", nbytes, " bytes");
    return {data, data, &release, kDevice0};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};
DeviceAllocator allocator;
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &allocator);

// ---- the device guard: one device, one stream; nothing to wait for (every op has finished when it returns: a stream is
// always idle, an event always reached; PyTorch's `torch.Stream` and `torch.Event` of the device run on these) ----
struct DeviceGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kDevice; }
  c10::Device exchangeDevice(c10::Device d) const override { check(d); return kDevice0; }
  c10::Device getDevice() const override { return kDevice0; }
  void setDevice(c10::Device d) const override { check(d); }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream exchangeStream(c10::Stream s) const override { return c10::Stream(c10::Stream::DEFAULT, s.device()); }
  c10::Stream getDefaultStream(c10::Device d) const override { return getStream(d); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override { return getStream(d); }
  c10::Stream getNewStream(c10::Device d, int) const override { return getStream(d); }
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  static void check(c10::Device d) {
    TORCH_CHECK(d.type() == kDevice && (!d.has_index() || d.index() == 0),
                "eager tpu test device: this process has one device, tpu:0 (asked for ", d, ")");
  }
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, DeviceGuard);

// ---- random numbers: the device's own generator (a host Mersenne twister of its own, apart from the CPU's) ----
struct DeviceGenerator final : c10::GeneratorImpl {
  at::Generator host;   // the host generator the device's random ops draw from
  explicit DeviceGenerator(uint64_t seed = c10::default_rng_seed_val)
      : c10::GeneratorImpl(kDevice0, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        host(at::make_generator<at::CPUGeneratorImpl>(seed)) {}
  void set_current_seed(uint64_t seed) override { host.set_current_seed(seed); }
  void set_offset(uint64_t offset) override { host.set_offset(offset); }
  uint64_t get_offset() const override { return host.get_offset(); }
  uint64_t current_seed() const override { return host.current_seed(); }
  uint64_t seed() override { return host.seed(); }
  void set_state(const c10::TensorImpl& state) override { host.unsafeGetGeneratorImpl()->set_state(state); }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override { return host.unsafeGetGeneratorImpl()->get_state(); }
  DeviceGenerator* clone_impl() const override {
    auto copy = new DeviceGenerator();
    copy->host = host.clone();
    return copy;
  }
};

at::Generator& default_generator() {
  static at::Generator gen = at::make_generator<DeviceGenerator>();
  return gen;
}

// ---- hooks: what PyTorch asks of the device as an accelerator ----
struct DeviceHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  void setCurrentDevice(c10::DeviceIndex d) const override { DeviceGuard::check(c10::Device(kDevice, d)); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex) const override { return 0; }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex) const override { return 0; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override { return default_generator(); }
  at::Generator getNewGenerator(c10::DeviceIndex) const override { return at::make_generator<DeviceGenerator>(); }
  at::Device getDeviceFromPtr(void*) const override { return kDevice0; }
  bool isPinnedPtr(const void*) const override { return false; }
  c10::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    auto* impl = storage.unsafeGetStorageImpl();
    c10::DataPtr fresh = allocator.allocate(nbytes);
    size_t kept = std::min(nbytes, impl->nbytes());
    if (kept) std::memcpy(fresh.get(), impl->data(), kept);
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(nbytes);
  }
};
static bool hooks_registered = [] { at::RegisterPrivateUse1HooksInterface(new DeviceHooks()); return true; }();

// ---- host views of device tensors ----
bool on_device(const at::Tensor& t) { return t.defined() && t.device().type() == kDevice; }

at::Tensor host_alias(const at::Tensor& t) {
  // A host tensor over the same memory, sizes and strides: what the host kernel reads and writes in place.
  if (!on_device(t)) return t;
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), at::TensorOptions().dtype(t.scalar_type()).device(at::kCPU));
}

at::Tensor to_device(const at::Tensor& host) {
  // A new device tensor holding `host`'s values (its strides kept where they are dense: channels-last stays so).
  if (!host.defined()) return host;
  auto options = host.options().device(kDevice0);
  auto out = host.is_non_overlapping_and_dense() ? at::empty_strided(host.sizes(), host.strides(), options)
                                                 : at::empty(host.sizes(), options);
  host_alias(out).copy_(host);
  return out;
}

// ---- the kernels that make, view and copy device tensors ----
at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                               std::optional<at::Device> device, std::optional<bool> pin_memory,
                               std::optional<at::MemoryFormat> memory_format) {
  return at::detail::empty_generic(size, &allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout> layout, std::optional<at::Device> device, std::optional<bool> pin_memory) {
  return at::detail::empty_strided_generic(size, stride, &allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  // host -> device, device -> host, device -> device: a copy between host views (dtype and broadcast as `copy_`)
  host_alias(dst).copy_(host_alias(self));
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

const at::Tensor& resize(const at::Tensor& self, c10::SymIntArrayRef size, std::optional<at::MemoryFormat> memory_format) {
  // the CPU's resize works on any storage made by an allocator: ours allocates the new memory
  return at::native::resize_(self, C10_AS_INTARRAYREF_SLOW(size), memory_format);
}

at::Tensor& set_storage(at::Tensor& self, at::Storage source, c10::SymInt offset, c10::SymIntArrayRef size,
                        c10::SymIntArrayRef stride) {
  return at::native::set_storage_meta__symint(self, source, offset, size, stride);
}

at::Tensor& set_source_storage(at::Tensor& self, at::Storage source) {
  std::vector<c10::SymInt> size{c10::SymInt(static_cast<int64_t>(source.nbytes() / self.dtype().itemsize()))};
  return at::native::set_storage_meta__symint(self, source, 0, size, {});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) { return at::native::set_tensor_(self, source); }

// ---- every other op: its host kernel, on host views of the device's tensors ----
bool is_small_host_scalar(const at::Tensor& t) { return !on_device(t) && t.dim() == 0; }

[[noreturn]] void refuse_mixed(const c10::OperatorHandle& op) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, tpu:0 and cpu! ",
              "(in ", op.schema().operator_name(), " on the eager tpu test device: a host tensor other than a 0-dim "
              "scalar mixed with device tensors; move it with .to('tpu'))");
}

void check_one_device(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args) {
  // CUDA's rule: device tensors, and host tensors only as 0-dim scalars (indices of `index` may stay on the host)
  bool device = false, host = false;
  const auto& schema = op.schema().arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    bool indices = schema[i].type()->kind() == c10::TypeKind::ListType && a.isList() && !a.isTensorList();
    auto visit = [&](const at::Tensor& t) {
      if (!t.defined()) return;
      if (on_device(t)) device = true;
      else if (!is_small_host_scalar(t) && !indices) host = true;
    };
    if (a.isTensor()) visit(a.toTensor());
    else if (a.isTensorList()) for (const auto& t : a.toTensorList()) visit(t);
    else if (a.isList()) for (const auto& e : a.toListRef()) if (e.isTensor()) visit(e.toTensor());
  }
  if (device && host) refuse_mixed(op);
}

at::Tensor device_view_of(const at::Tensor& host, const std::vector<std::pair<at::Tensor, at::Tensor>>& aliases) {
  // A host result over an input's memory (a view): the same view of the device tensor, sharing its storage.
  if (!host.defined() || host.numel() == 0) return to_device(host);
  for (const auto& [dev, alias] : aliases) {
    auto begin = static_cast<char*>(dev.storage().mutable_data());
    auto end = begin + dev.storage().nbytes();
    auto at = static_cast<char*>(host.data_ptr());
    if (at < begin || at >= end) continue;
    auto offset = (at - begin) / static_cast<int64_t>(host.element_size());
    if (host.scalar_type() != dev.scalar_type()) break;   // (a view with another dtype: copied below)
    return at::native::as_strided_tensorimpl(dev, host.sizes(), host.strides(), offset);
  }
  return to_device(host);
}

void run_on_host(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto n_args = schema.arguments().size(), n_returns = schema.returns().size();
  const auto first = stack->size() - n_args;
  std::vector<c10::IValue> args(stack->begin() + first, stack->end());
  check_one_device(op, args);
  ++ops_on_device;

  // inputs: device tensors -> host views of the same memory; `out=` tensors -> host tensors that may be resized
  std::vector<std::pair<at::Tensor, at::Tensor>> aliases;     // (device tensor, its host view): for views returned
  std::vector<std::pair<at::Tensor, at::Tensor>> outs;        // (device out tensor, its host stand-in): copied back
  auto to_host = [&](const at::Tensor& t, bool out) -> at::Tensor {
    if (!on_device(t)) return t;
    if (out) { auto h = host_alias(t).clone(); outs.emplace_back(t, h); return h; }
    auto h = host_alias(t);
    aliases.emplace_back(t, h);
    return h;
  };
  for (size_t i = 0; i < n_args; ++i) {
    auto& slot = (*stack)[first + i];
    const auto& arg = schema.arguments()[i];
    bool out = arg.is_out();
    if (slot.isTensor()) slot = to_host(slot.toTensor(), out);
    else if (slot.isTensorList()) {
      auto list = slot.toTensorList().vec();
      for (auto& t : list) t = to_host(t, out);
      slot = c10::IValue(c10::List<at::Tensor>(list));
    } else if (slot.isList() && arg.type()->kind() == c10::TypeKind::ListType && !slot.toListRef().empty()
               && (slot.toListRef()[0].isTensor() || slot.toListRef()[0].isNone())) {   // Tensor?[]
      c10::List<std::optional<at::Tensor>> list;
      for (const auto& e : slot.toListRef()) list.push_back(e.isTensor() ? std::optional<at::Tensor>(to_host(e.toTensor(), out)) : std::nullopt);
      slot = c10::IValue(list);
    } else if (slot.isDevice() && slot.toDevice().type() == kDevice) slot = c10::IValue(c10::Device(at::kCPU));
    else if (arg.type()->kind() == c10::TypeKind::OptionalType && arg.type()->containedType(0)->kind() == c10::TypeKind::GeneratorType) {
      // the device's random ops draw from the device's generator (a given one, else its default)
      auto gen = slot.isGenerator() ? slot.toGenerator() : default_generator();
      if (gen.device().type() == kDevice) slot = c10::IValue(static_cast<DeviceGenerator*>(gen.unsafeGetGeneratorImpl())->host);
    }
  }

  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);

  for (auto& [dev, host] : outs) {   // `out=` results: into the device tensor, resized if the kernel resized
    if (!dev.sizes().equals(host.sizes())) at::native::resize_(dev, host.sizes(), std::nullopt);
    host_alias(dev).copy_(host);
  }
  // returns: an in-place or `out=` result is the device tensor given; a view, a view of it; a new tensor, a copy
  const auto ret_first = stack->size() - n_returns;
  for (size_t r = 0; r < n_returns; ++r) {
    auto& slot = (*stack)[ret_first + r];
    const auto* alias = schema.returns()[r].alias_info();
    if (alias && alias->isWrite()) {
      for (size_t i = 0; i < n_args; ++i) {
        const auto* a = schema.arguments()[i].alias_info();
        if (a && a->isWrite() && a->beforeSets() == alias->beforeSets()) { slot = args[i]; break; }
      }
      continue;
    }
    auto back = [&](const at::Tensor& t) { return alias ? device_view_of(t, aliases) : to_device(t); };
    if (slot.isTensor()) slot = back(slot.toTensor());
    else if (slot.isTensorList()) {
      auto list = slot.toTensorList().vec();
      for (auto& t : list) t = back(t);
      slot = c10::IValue(c10::List<at::Tensor>(list));
    }
  }
}

// ---- the LSTM cell: PyTorch's LSTM on any device but the CPU calls a fused cell, which the CPU does not have ----
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  auto gates = host_alias(input_gates) + host_alias(hidden_gates);
  if (input_bias && input_bias->defined()) gates = gates + host_alias(*input_bias);
  if (hidden_bias && hidden_bias->defined()) gates = gates + host_alias(*hidden_bias);
  auto chunks = gates.chunk(4, 1);   // PyTorch's order: input, forget, cell, output
  auto i = chunks[0].sigmoid(), f = chunks[1].sigmoid(), g = chunks[2].tanh(), o = chunks[3].sigmoid();
  auto c = f * host_alias(cx) + i * g;
  auto h = o * c.tanh();
  return {to_device(h), to_device(c), to_device(at::cat({i, f, g, o}, 1))};   // (the gates: what the backward needs)
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell_backward(
    const std::optional<at::Tensor>& grad_hy, const std::optional<at::Tensor>& grad_cy, const at::Tensor& cx,
    const at::Tensor& cy, const at::Tensor& workspace, bool has_bias) {
  auto gates = host_alias(workspace).chunk(4, 1);
  auto i = gates[0], f = gates[1], g = gates[2], o = gates[3];
  auto c = host_alias(cy), tanh_c = c.tanh();
  auto dh = grad_hy && grad_hy->defined() ? host_alias(*grad_hy) : at::zeros_like(c);
  auto dc = (grad_cy && grad_cy->defined() ? host_alias(*grad_cy) : at::zeros_like(c)) + dh * o * (1 - tanh_c * tanh_c);
  auto d_gates = at::cat({dc * g * i * (1 - i), dc * host_alias(cx) * f * (1 - f), dc * i * (1 - g * g),
                          dh * tanh_c * o * (1 - o)}, 1);
  auto d_bias = has_bias ? to_device(d_gates.sum(0)) : at::Tensor();
  return {to_device(d_gates), to_device(dc * f), d_bias};
}

// ---- functions for tests/eager_tpu.py's `torch.tpu` module (ops with no tensor in: a catch-all kernel) ----
at::Tensor get_rng_state() { return default_generator().get_state(); }
void set_rng_state(const at::Tensor& state) { default_generator().set_state(state); }
void manual_seed(int64_t seed) { default_generator().set_current_seed(static_cast<uint64_t>(seed)); }
int64_t initial_seed() { return static_cast<int64_t>(default_generator().current_seed()); }
int64_t seed() { return static_cast<int64_t>(default_generator().seed()); }
int64_t ops_run() { return ops_on_device.load(); }

}  // namespace eager_tpu

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", eager_tpu::empty_memory_format);
  m.impl("empty_strided", eager_tpu::empty_strided);
  m.impl("_copy_from", eager_tpu::copy_from);
  m.impl("_copy_from_and_resize", eager_tpu::copy_from_and_resize);
  m.impl("resize_", eager_tpu::resize);
  m.impl("view", at::native::view);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("unfold", at::native::unfold);
  m.impl("set_.source_Storage_storage_offset", eager_tpu::set_storage);
  m.impl("set_.source_Storage", eager_tpu::set_source_storage);
  m.impl("set_.source_Tensor", eager_tpu::set_source_tensor);
}

// ops whose composite kernel would pick a device-specific one (convolution's `_overrideable`): run whole on the host;
// the LSTM's fused cell (above)
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution", torch::CppFunction::makeFromBoxedFunction<&eager_tpu::run_on_host>());
  m.impl("convolution_backward", torch::CppFunction::makeFromBoxedFunction<&eager_tpu::run_on_host>());
  m.impl("_thnn_fused_lstm_cell", eager_tpu::fused_lstm_cell);
  m.impl("_thnn_fused_lstm_cell_backward_impl", eager_tpu::fused_lstm_cell_backward);
}

// autocast on the device (`torch.autocast('tpu')`, bf16 by default on TorchTPU): PyTorch's own lists of the ops that run
// in the lower precision and of those kept in fp32, registered for this device; every other op passes through
#define LOWER_PRECISION_ON_DEVICE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define FP32_ON_DEVICE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(LOWER_PRECISION_ON_DEVICE)
  AT_FORALL_FP32(FP32_ON_DEVICE)
}
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&eager_tpu::run_on_host>()); }

// an op without an autograd kernel of its own for this device (a library's custom op: FSDP2's `fsdp::all_gather_copy_in`)
// goes through autograd's basic fallback, as PyTorch registers it for the CPU's and CUDA's autograd keys (not for
// PrivateUse1's: a device registers its own, as TorchTPU and other out-of-tree devices do)
TORCH_LIBRARY_IMPL(_, AutogradPrivateUse1, m) { m.fallback(torch::autograd::basicAutogradNotImplementedFallback()); }

TORCH_LIBRARY(eager_tpu, m) {
  m.def("get_rng_state() -> Tensor", eager_tpu::get_rng_state);
  m.def("set_rng_state(Tensor state) -> ()", eager_tpu::set_rng_state);
  m.def("manual_seed(int seed) -> ()", eager_tpu::manual_seed);
  m.def("initial_seed() -> int", eager_tpu::initial_seed);
  m.def("seed() -> int", eager_tpu::seed);
  m.def("ops_run() -> int", eager_tpu::ops_run);
}
