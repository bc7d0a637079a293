// The copy stubs and copy_values, declared in core/copy.h. The backends fill the stubs
// (kernels/cpu/copy.cpp, kernels/cuda/copy.cu); copy_values is the one path every copy takes
// (contiguous, clone, to, copy_), and the place where a copy is split across device types.
#include "core/copy.h"

#include "core/device_backend.h"
#include "core/error.h"

namespace weft {

// constinit (core/dispatch.h): the CPU backend fills them from a static initialiser in another
// object, which may run before this one's.
constinit DispatchStub<CopyFn> copy_stub{"copy_"};
constinit DispatchStub<FillFn> fill_stub{"fill_"};

void copy_values(const Tensor& dst, const Tensor& src) {
  WEFT_CHECK(broadcasts_to(src.shape(), dst.shape()), "copy_: source shape ",
             src.shape(), " does not broadcast to destination shape ", dst.shape());
  if (dst.numel() == 0) return;
  Tensor source = src.shape() == dst.shape() ? src : src.detach().expand(dst.shape());
  if (src.device().type == dst.device().type) {
    copy_stub(dst.device(), source, dst);
  } else {
    // Across device types: convert on the source side, move contiguous bytes, then
    // lay them out on the destination side. A contiguous source of the right dtype goes
    // as it is (a pinned one so stays pinned, and its upload asynchronous).
    Tensor staged = source;
    if (!(source.is_contiguous() && source.dtype() == dst.dtype())) {
      staged = empty(dst.shape(), TensorOptions(dst.dtype(), src.device()));
      copy_stub(src.device(), source, staged);
    }
    Tensor landed = dst.is_contiguous() ? dst : empty(dst.shape(), TensorOptions(dst.dtype(), dst.device()));
    device_backend(src.device().is_cpu() ? dst.device() : src.device()).copy_with_host(staged, landed);
    if (!landed.is_same(dst)) copy_stub(dst.device(), landed, dst);
  }
  dst.bump_version();
}

}  // namespace weft
